"""What runs inside a worker besides the user's loop: the thread the loop runs in (``train_thread``),
the session behind ``report()``, ``get_checkpoint()`` and ``get_dataset_shard()``
(``worker_session``), a checkpoint's way into the run's storage (``checkpoint_upload``,
``uploader``), the data a rank is handed and where it stands in its epoch (``data``,
``data_position``), and the answers to ``get_all_reported_checkpoints()``. Imports the event road
and health."""
