"""What runs inside a worker besides the user's loop: its thread, the session behind ``report()``
and the other in-loop calls, a checkpoint's way into storage, the data a rank is handed and where
it stands in its epoch. Imports the event road and health."""
