"""The trainer's timeouts, poll intervals and thresholds, in one place, each with what it bounds
and why it has that value.

None of these is a user setting (those are config fields, e.g. ``FailureConfig.report_timeout_s``,
``TorchConfig.timeout_s``, and the ``FLOWTRAIN_*`` variables of ``storage.settings``, one of which,
``FLOWTRAIN_WORKER_START_TIMEOUT_S``, overrides the start timeout computed here); they are the
clocks a change of hardware or of Ray may call for retuning. Modules import the names they use
from here; this module imports only ``storage.settings``, so any module may.

Kept beside the code they time, for the reason given:

- ``storage/run_storage.py``: ``METRICS_FLUSH_INTERVAL_S``. ``storage`` imports nothing of ``trainers``.
- ``trainers/_internal/worker_group.py``: ``TURN_CHECK_S``; ``trainers/_internal/worker_inbox.py``:
  ``LONG_POLL_S``, ``UNAVAILABLE_GRACE_S``; ``trainers/_internal/event_channel.py``:
  ``CONNECT_TIMEOUT_S``, ``ACK_TIMEOUT_S``. The report path, being reworked as one piece.
"""

from __future__ import annotations

from storage import settings

# -- starting workers ----------------------------------------------------------------------------

#: Seconds for the placement group, actors and backend to start before it counts as a failure:
#: time for a cold node to import torch or a busy cluster to free a bundle, yet within minutes.
DEFAULT_WORKER_START_TIMEOUT_S = 120.0
#: Seconds added per worker: Ray starts at most one process per CPU at once, so big groups start
#: slower (64 workers on 2 cores: ~20 s in benchmarks/scale, well inside 120 + 64 x 0.5 s).
WORKER_START_TIMEOUT_PER_WORKER_S = 0.5


def worker_start_timeout_s(num_workers: int = 1) -> float:
    """Seconds a group of ``num_workers`` workers may take to start: ``FLOWTRAIN_WORKER_START_TIMEOUT_S``
    when set (read now, not at import, so a test or a Ray ``runtime_env`` can set it), else
    120 s plus 0.5 s per worker."""
    chosen = settings.WORKER_START_TIMEOUT_S.read()
    if chosen is not None:
        return chosen
    return DEFAULT_WORKER_START_TIMEOUT_S + WORKER_START_TIMEOUT_PER_WORKER_S * max(1, num_workers)


#: Seconds per TensorFlow set-up call (pick a port, set ``TF_CONFIG``): a minute means stuck.
TENSORFLOW_SETUP_TIMEOUT_S = 60.0
#: Seconds a worker may spend leaving ``jax.distributed``; its actor is killed right after anyway.
JAX_SHUTDOWN_TIMEOUT_S = 10.0

# -- the controller ------------------------------------------------------------------------------

#: After a failure, the wait for queued reports of ranks already done (ms; bounds a sick cluster).
ENDED_DRAIN_S = 10.0
#: How often that wait re-checks the ranks: short waits without busy polling.
DRAIN_POLL_S = 0.25
#: How often the controller checks running validations (only while any run): metrics join fast.
VALIDATION_POLL_S = 0.25
#: Free restarts after setup clashes (``BackendConfig.is_setup_clash``: a reserved port taken
#: before use); clashes are rare, so three in a row means something holds the ports for good.
SETUP_CLASH_RESTARTS = 3

#: Seconds a rank's step must exceed the median rank's by, besides the factor, to count as slow:
#: below ~50 ms a step's time is at the mercy of the scheduler and the garbage collector.
STRAGGLER_MIN_GAP_S = 0.05

# -- replacing failed ranks ---------------------------------------------------------------------

#: How long a surviving rank's training function may take to stop after a failure elsewhere (a
#: collective failing, the next report() raising, an error raised in its thread) before the rank
#: is replaced too: a step's compute, a checkpoint upload in flight, yet short next to a restart.
SURVIVOR_STOP_S = 10.0
#: After asking a training function to stop, how long it is left to notice by itself (its next
#: report() or broken collective) before an error is raised in its thread.
INTERRUPT_GRACE_S = 0.2
#: How often that error is raised again while the thread runs on (user code may catch one).
INTERRUPT_EVERY_S = 0.5

# -- workers waiting on the controller -----------------------------------------------------------

#: How often a rank at a barrier checks whether the attempt was stopped (cheap while waiting).
SYNC_WAKE_S = 0.5
#: How often a rank waiting in ``get_all_reported_checkpoints()`` checks the same.
STOP_CHECK_S = 0.5
#: Pickled bytes above which a broadcast warns: it goes through the driver, made for small values.
BROADCAST_WARN_BYTES = 1000

# -- nodes coming and going ----------------------------------------------------------------------

#: How often a launch waiting for ``min_workers`` to fit counts the free resources again.
WAIT_POLL_S = 0.5
#: How long a stopped group's resources may take to show as free (Ray: ~0.1 s, asynchronously).
RELEASE_WAIT_S = 2.0
#: Elastic runs: the wait for Ray to mark a dead worker's node dead before it counts as a failure.
NODE_DEATH_WAIT_S = 5.0
#: How often the driver asks which nodes drain: notices give tens of seconds, so most go to workers.
PREEMPTION_POLL_S = 1.0
#: How long the controller waits for a preempted node that was drained without a deadline.
PREEMPTION_DEFAULT_DEADLINE_S = 120.0

# -- output ------------------------------------------------------------------------------------

#: How long after a capture ends late lines still reach its sink (Ray forwards output seconds late).
LATE_LINES_S = 10.0
