"""The run loop in the driver: the controller, an attempt's book, the failure policy, a round's
commit, checkpoint validations, and what a run tells its listeners, callbacks and the terminal.
The top part: imports every other."""
