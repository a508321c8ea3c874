"""The event road: what a worker tells the controller (``messages``), the socket it writes them to
(``event_channel``), and where they arrive by that road or Ray's long poll (``worker_inbox``).
Imports no other part."""
