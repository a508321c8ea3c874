"""The worker processes: the group of Ray actors and their placement (``worker_group``), what one
actor runs (``worker``), the run's workers across attempts as the controller sees them
(``run_workers``), and how processes are kept, reused, reset, spared and replaced (``reuse``,
``fresh_process``, ``warm_workers``, ``spares``, ``connections``), with the checks a request
meets before anything is reserved (``resources``, ``start_failure``, ``elastic``, ``tpu``).
Imports the session, health and the event road."""
