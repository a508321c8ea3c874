"""Every timeout, poll interval and threshold of ``trainers``, each with what it bounds and why it
has that value (``tests/test_settings.py`` fails on a clock defined elsewhere; ``storage``'s one,
``METRICS_FLUSH_INTERVAL_S``, stays beside its code since ``storage`` imports nothing of ``trainers``).

None is a user setting (those are config fields and the ``FLOWTRAIN_*`` variables of
``storage.settings``, e.g. ``FLOWTRAIN_WORKER_START_TIMEOUT_S``): they are the clocks a change of
hardware or of Ray may call for retuning. This module imports only ``storage.settings``, so any may.
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
#: Inside a Tune trial, how often a worker group waiting its turn checks the cluster could still hold it.
TURN_CHECK_S = 5.0
#: How long a kept worker may take to answer that it is alive, or a worker to answer its reset when a
#: run ends cleanly, before it is replaced (or not kept). Milliseconds on a quiet machine, but seconds
#: on an overloaded one (5 s were missed on 2 busy cores, and the next run started every process
#: anew); only a wedged process, which is rare once its training has ended, makes a run wait this long.
KEPT_WORKER_ANSWER_S = 30.0


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
#: How long a surviving rank may take past its stop's own wait to answer, before it is replaced:
#: short, since a failed attempt's recovery waits on it.
SURVIVOR_ANSWER_S = 5.0

# -- the event road (``trainers/_internal/events/event_channel.py``, ``worker_inbox.py``) ------------------

#: How long a worker tries to reach the controller before it falls back to the Ray long poll.
CONNECT_TIMEOUT_S = 5.0
#: How long an event may stay unacknowledged before its worker gives the connection up and replays
#: over Ray (the workers ask at half of it). Long, because the kernel finds a dead network path
#: sooner (``event_channel._TCP_OPTIONS``): this catches a connection the controller never reads; a
#: controller busy longer (a very slow commit) only moves that worker to the slower Ray road.
ACK_TIMEOUT_S = 15.0
#: The controller acknowledges a connection at most this often unless asked. A third of
#: ``ACK_TIMEOUT_S``: a worker reporting steadily is acknowledged before it would ask, and rounds
#: up to 5 s apart share one acknowledgement per rank instead of paying one each.
ACK_EVERY_S = 5.0
#: A worker that sent nothing on its connection for this long sends a heartbeat (an empty frame):
#: the controller finds a host it no longer hears (``FLOWTRAIN_UNREACHABLE_S``) by its silence.
HEARTBEAT_S = 1.0
#: How long a worker's next_events call waits before answering "nothing yet". Events normally
#: come over the socket, so these calls mostly just wait to fail when a worker dies (which they
#: do at once); each answer costs the watcher one ray.wait over every worker, so at 1,000
#: workers a short wait would keep a core busy for nothing.
LONG_POLL_S = 60.0
#: A worker Ray calls unavailable (unreachable, maybe back soon) is given this long before it
#: counts as failed; a worker that died fails at once.
UNAVAILABLE_GRACE_S = 10.0

# -- run health ----------------------------------------------------------------------------------

#: Seconds a rank's step must exceed the median rank's by, besides the factor, to count as slow:
#: below ~50 ms a step's time is at the mercy of the scheduler and the garbage collector.
STRAGGLER_MIN_GAP_S = 0.05
#: Seconds between two reads of the memory limit (a cgroup file); a limit rarely changes.
LIMIT_READ_EVERY_S = 1.0
#: The least length of a round of the pre-flight compute probe. A CPU quota (a cgroup's CFS limit)
#: lets a process run at full speed for its share of each 100 ms period and then stops it: a round
#: shorter than that share can see a throttled worker at full speed, one of 50 ms cannot.
PROBE_ROUND_S = 0.05

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
