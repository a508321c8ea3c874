"""The event road: what a worker tells the controller (``messages``: its reports, barriers,
questions and end), the direct socket every worker writes them to (``event_channel``), and where
they arrive at the controller by that road or by Ray's long poll (``worker_inbox``). Imports
no other part."""
