"""The run loop in the driver: the controller's states and steps (``controller``), what one
attempt's workers have said (``attempt_book``), who pays for a failure (``failure_policy``), what
a complete round commits (``round_commit``), the checkpoint validations it starts
(``validation_runner``), and what a run tells its callbacks and the terminal (``run_hooks``,
``progress``). The top part: imports every other."""
