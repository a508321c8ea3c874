"""The trainer's timeouts, poll intervals and thresholds, in one place, each with what it bounds
and why it has that value.

None of these is a user setting (those are config fields, e.g. ``FailureConfig.report_timeout_s``,
``TorchConfig.timeout_s``; the one variable read here is ``FLOWTRAIN_WORKER_START_TIMEOUT_S``);
they are the clocks a change of hardware or of Ray may call for retuning. Modules import the names
they use from here; this module imports nothing of flowtrain, so any module may.

Kept beside the code they time, for the reason given:

- ``storage/run_storage.py``: ``METRICS_FLUSH_INTERVAL_S``, and ``storage/upload.py``: the upload
  retries, backoff and threads (``FLOWTRAIN_UPLOAD_*``). ``storage`` imports nothing of ``trainers``.
- ``trainers/_internal/worker_group.py``: ``TURN_CHECK_S``; ``trainers/_internal/worker_inbox.py``:
  ``LONG_POLL_S``, ``UNAVAILABLE_GRACE_S``; ``trainers/_internal/event_channel.py``:
  ``CONNECT_TIMEOUT_S``. The report path, being reworked as one piece.
"""

from __future__ import annotations

import os

# -- starting workers ----------------------------------------------------------------------------

#: Variable that overrides ``DEFAULT_WORKER_START_TIMEOUT_S`` (read at each ``fit()``).
WORKER_START_TIMEOUT_ENV = "FLOWTRAIN_WORKER_START_TIMEOUT_S"
#: Seconds to wait for the placement group, the actors and the backend before the start counts
#: as a failure. Long enough for a cold node to import torch and for a busy cluster to free a
#: bundle; short enough that a group that cannot be placed is reported within minutes.
DEFAULT_WORKER_START_TIMEOUT_S = 120.0
#: Seconds the default grows by per worker: a node starts its worker processes a few at a time
#: (Ray starts at most as many at once as the node has CPUs), so a big group takes longer to
#: start. On 2 cores 64 workers take ~20 s (benchmarks/scale), well inside 120 + 64 x 0.5 s.
WORKER_START_TIMEOUT_PER_WORKER_S = 0.5


def worker_start_timeout_s(num_workers: int = 1) -> float:
    """Seconds a group of ``num_workers`` workers may take to start: ``FLOWTRAIN_WORKER_START_TIMEOUT_S``
    when set (read now, not at import, so a test or a Ray ``runtime_env`` can set it), else
    120 s plus 0.5 s per worker."""
    if WORKER_START_TIMEOUT_ENV in os.environ:
        return float(os.environ[WORKER_START_TIMEOUT_ENV])
    return DEFAULT_WORKER_START_TIMEOUT_S + WORKER_START_TIMEOUT_PER_WORKER_S * max(1, num_workers)


#: Seconds each TensorFlow set-up call to the workers may take: they only pick a port and set
#: ``TF_CONFIG``, so a minute means a worker is stuck, not slow.
TENSORFLOW_SETUP_TIMEOUT_S = 60.0
#: Seconds each worker may spend leaving ``jax.distributed`` when its group stops; the actors
#: are killed right after, so waiting longer only delays a restart.
JAX_SHUTDOWN_TIMEOUT_S = 10.0

# -- the controller ------------------------------------------------------------------------------

#: After a failure, how long the controller waits for the queued reports of ranks whose
#: training function already ended. They arrive within milliseconds; this bounds a sick cluster.
ENDED_DRAIN_S = 10.0
#: How often that wait re-checks whether the ranks it waits for are still training: four times
#: a second keeps the wait short without busy polling.
DRAIN_POLL_S = 0.25
#: How often the controller checks on running checkpoint validations (only while there are
#: any): a validation's metrics join its checkpoint within a quarter second of it ending.
VALIDATION_POLL_S = 0.25
#: Restarts after setup clashes (``BackendConfig.is_setup_clash``: a port taken between its
#: reservation and its use) one run may take without spending ``max_failures``. A clash is rare;
#: three in a row means something holds the ports for good.
SETUP_CLASH_RESTARTS = 3

# -- workers waiting on the controller -----------------------------------------------------------

#: How often a rank waiting at a barrier checks whether the controller stopped the attempt:
#: a stopped attempt's ranks leave within half a second, at no cost while they wait.
SYNC_WAKE_S = 0.5
#: How often a rank waiting in ``get_all_reported_checkpoints()`` checks the same.
STOP_CHECK_S = 0.5
#: Above this many pickled bytes a broadcast warns: it travels through the driver, made for small
#: values (a run id, a path), not for tensors (use the framework's collectives for those).
BROADCAST_WARN_BYTES = 1000

# -- nodes coming and going ----------------------------------------------------------------------

#: How often a launch waiting for ``min_workers`` to fit counts the free resources again.
WAIT_POLL_S = 0.5
#: How long a stopped group's resources may take to show as free again in Ray's resource view
#: (Ray reports them asynchronously; about 0.1 s on an idle machine).
RELEASE_WAIT_S = 2.0
#: After workers died in an elastic run: how long to wait for Ray to mark their node dead (it
#: does so a moment after the node's processes go) before taking it for a worker failure.
NODE_DEATH_WAIT_S = 5.0
#: How often the driver asks Ray which nodes are draining: cloud preemption notices give
#: tens of seconds, so once a second leaves almost all of it to the workers.
PREEMPTION_POLL_S = 1.0
#: How long the controller waits for a preempted node that was drained without a deadline.
PREEMPTION_DEFAULT_DEADLINE_S = 120.0

# -- output ------------------------------------------------------------------------------------

#: How long after a capture of worker output ends the lines Ray delivers late still go to its
#: sink (Ray forwards worker output in batches, a few seconds behind).
LATE_LINES_S = 10.0
