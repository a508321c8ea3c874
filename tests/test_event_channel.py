"""The workers' direct line to the controller: framing, the token, acknowledgements and replay,
and the fall back to Ray."""

from __future__ import annotations

import os
import pathlib
import pickle
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from benchmarks.chaos_road import ConnectionFaults
from trainers import Checkpoint, DataParallelTrainer, FailureConfig, Result, RunConfig, ScalingConfig, UserCallback
from trainers._internal.events import event_channel
from trainers._internal.events.event_channel import ChannelAddress, EventListener, Outbox
from trainers._internal.events.messages import FailedEvent, ReportEvent, SyncEvent
from trainers._internal.events.worker_inbox import WorkerInbox
from trainers._internal.run.attempt_book import AttemptBook
from trainers.errors import WorkerError


@pytest.fixture
def faults():
    """The soak's fault tap, installed for the listeners the test makes (through the public seam)."""
    with ConnectionFaults().installed() as tap:
        yield tap


def read_until(listener: EventListener, count: int) -> list[tuple[int, int, object]]:
    """Poll until ``count`` events arrived (each poll returns what is there)."""
    events: list[tuple[int, int, object]] = []
    for _ in range(200):
        found = listener.poll(0.5)
        events.extend(found)
        if len(events) >= count:
            return events
    raise AssertionError(f"only {len(events)} of {count} events arrived")


def connected(address: ChannelAddress, rank: int) -> Outbox:
    outbox = Outbox()
    outbox.connect(address, rank)
    return outbox


def until(condition, each=lambda: None, tries: int = 400) -> None:
    """Call ``each`` (a short blocking wait) until ``condition()`` holds."""
    for _ in range(tries):
        if condition():
            return
        each()
    raise AssertionError("the condition never held")


def report(rank: int, step: int, blob: str = "") -> ReportEvent:
    return ReportEvent(rank, step, {"step": step, "blob": blob}, False)


def test_each_ranks_events_arrive_in_order_whole_numbered_and_tagged_with_its_rank():
    listener = EventListener("127.0.0.1", connections=2)
    try:
        outboxes = [connected(listener.address, rank) for rank in (0, 1)]
        big = "x" * (3 << 20)  # larger than one read: the frame arrives in pieces
        for step in range(5):
            for rank, outbox in enumerate(outboxes):
                outbox.put(report(rank, step, big if step == 2 else ""))
        events = read_until(listener, 10)
        for rank in (0, 1):
            assert [(number, event.index) for r, number, event in events if r == rank] == [(s + 1, s) for s in range(5)]
        assert all(len(event.metrics["blob"]) == len(big) for _, _, event in events if event.index == 2)
        outboxes[0]._sock.shutdown(socket.SHUT_RDWR)
        until(lambda: len(listener._selector.get_map()) == 3, lambda: listener.poll(0.1))  # server, wake pipe, rank 1
    finally:
        listener.close()
        listener.close()  # twice is fine


class RunsCodeWhenUnpickled:
    """Unpickling this creates ``path``: what a stranger could do if its bytes were ever unpickled."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (exec, (f"open({str(self.path)!r}, 'w').close()",))


def test_a_stranger_is_refused_before_anything_it_sends_is_unpickled(tmp_path):
    import pickle

    listener = EventListener("127.0.0.1")
    marker = tmp_path / "unpickled"
    try:
        payload = pickle.dumps(RunsCodeWhenUnpickled(marker))
        frame = struct.pack("!IQ", len(payload), 1) + payload
        address = ("127.0.0.1", listener.address.port)
        with socket.create_connection(address) as raw, socket.create_connection(address) as wrong:
            raw.sendall(frame * 20)  # no hello at all
            wrong.sendall(struct.pack("!16sI", b"not-the-token-00", 0) + frame)
            found: list = []
            for _ in range(10):
                events = listener.poll(0.1)
                found.extend(events)
        assert found == [] and not marker.exists()
    finally:
        listener.close()


def test_wake_ends_a_poll_from_another_thread():
    listener = EventListener("127.0.0.1")
    try:
        threading.Timer(0.05, listener.wake).start()
        started = time.monotonic()
        assert listener.poll(30) == []
        assert time.monotonic() - started < 25
    finally:
        listener.close()


class Inbox(WorkerInbox):
    """The controller's end of one rank without Ray: the long poll's part is played by the test."""

    def __init__(self):
        super().__init__([None], died=None, host="127.0.0.1")

    def replay_over_ray(self, rank: int, outbox: Outbox, acked: int = 0) -> None:
        """What a long poll does: take the events left for it, after forgetting those up to ``acked``
        (0: the call made when the attempt started, which waits until the socket fails)."""
        for number, event in outbox.take(0.0, acked):
            self._from_ray.put((rank, number, event))

    def steps(self, count: int) -> list[tuple[int, int]]:
        taken: list = []
        until(lambda: len(taken) >= count, lambda: taken.extend(self.poll(0.1)))
        return [(event.world_rank, event.index) for event in taken]


@pytest.mark.parametrize("fault", ConnectionFaults.KINDS)
def test_events_lost_with_a_broken_connection_are_replayed_over_ray_and_applied_once(fault, monkeypatch, faults):
    monkeypatch.setattr(event_channel, "ACK_TIMEOUT_S", 1.0)  # a half-open connection is given up this soon
    inbox = Inbox()
    try:
        outbox = connected(inbox.address, 0)
        faults.arm(0, fault)
        outbox.put(report(0, 0))
        assert inbox.steps(1) == [(0, 0)]
        assert faults.fired == [(0, fault)]
        outbox.put(report(0, 1))  # into a closed or unread connection: lost on the socket
        until(lambda: not outbox.connected, lambda: threading.Event().wait(0.05))
        # The long poll waiting since the start gets everything not acknowledged: step 0 again,
        # which the inbox drops, and step 1, which it applies.
        inbox.replay_over_ray(0, outbox)
        assert inbox.steps(1) == [(0, 1)]
        assert inbox.poll(0.2) == []
        inbox.replay_over_ray(0, outbox, acked=inbox._applied[0])  # the next long poll acknowledges
        assert not outbox._kept
    finally:
        inbox.close()


def test_acknowledgements_keep_a_healthy_outbox_short(monkeypatch):
    monkeypatch.setattr(event_channel, "ACK_TIMEOUT_S", 2.0)  # the last events are asked for after 1 s
    inbox = Inbox()
    try:
        outbox = connected(inbox.address, 0)
        for step in range(50):
            outbox.put(report(0, step))
        assert inbox.steps(50) == [(0, step) for step in range(50)]
        until(lambda: not outbox._kept, lambda: inbox.poll(0.1))  # asked, answered, forgotten
        assert outbox.connected
    finally:
        inbox.close()


def test_a_report_stuck_writing_into_an_unread_connection_is_freed_and_replayed(monkeypatch, faults):
    monkeypatch.setattr(event_channel, "ACK_TIMEOUT_S", 1.0)
    inbox = Inbox()
    try:
        outbox = connected(inbox.address, 0)
        faults.arm(0, "half-open")
        big = "x" * (8 << 20)  # a few of these fill every kernel buffer between the two ends
        writer = threading.Thread(target=lambda: [outbox.put(report(0, step, big)) for step in range(6)])
        writer.start()
        writer.join(60)
        assert not writer.is_alive() and not outbox.connected
        inbox.replay_over_ray(0, outbox)
        assert inbox.steps(6) == [(0, step) for step in range(6)]
    finally:
        inbox.close()


def test_a_rank_silent_while_the_others_are_heard_is_unreachable_once_and_only_if_its_host_is_silent_too(faults):
    """Rank 1's connection goes quiet (its frames no longer read, as when its host is cut off);
    rank 0 only sends heartbeats. Rank 1 is asked about once a second while its host answers
    (a stopped process is not a lost host), named unreachable once when it does not, and never
    after a pause of the controller's own, when it heard nobody."""
    host_answers = True
    asked: list[int] = []

    def unreachable(ranks: list[int], silent_s: float, others_heard: bool) -> list[FailedEvent]:
        assert others_heard  # rank 0's heartbeats
        asked.extend(ranks)
        return (
            []
            if host_answers
            else [FailedEvent(r, WorkerError(f"silent {silent_s} s"), "", kind="unreachable") for r in ranks]
        )

    inbox = WorkerInbox([None, None], died=None, host="127.0.0.1", unreachable=unreachable, unreachable_s=1.5)
    try:
        outboxes = [connected(inbox.address, rank) for rank in (0, 1)]
        faults.arm(1, "half-open")
        outboxes[1].put(report(1, 0))
        assert {(e.world_rank, e.index) for e in inbox.poll(0.5)} == {(1, 0)}
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            assert inbox.poll(0.2) == []
        assert asked and set(asked) == {1} and len(asked) <= 4, asked  # after 1.5 s, at most once a second
        # The controller away for longer than the bound: it heard nobody, so it judges nobody yet.
        host_answers = False
        time.sleep(2.0)
        assert inbox.poll(0.0) == []
        lost: list = []
        until(lambda: lost, lambda: lost.extend(inbox.poll(0.2)), tries=40)
        assert [(e.world_rank, e.kind) for e in lost] == [(1, "unreachable")] and "silent 1.5 s" in str(lost[0].error)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            assert inbox.poll(0.2) == []  # once; rank 0's heartbeats keep it heard
    finally:
        inbox.close()


def test_the_soaks_planted_defect_acknowledges_events_it_never_delivers():
    # What the chaos soak's --plant lost-events must be to prove anything: after the fault the
    # worker is told its events arrived, forgets them, and the controller never sees them.
    with ConnectionFaults(lose_events=True).installed(ack_timeout_s=1.0) as lying:
        inbox = Inbox()
        try:
            outbox = connected(inbox.address, 0)
            lying.arm(0, "drop")
            outbox.put(report(0, 0))
            assert inbox.steps(1) == [(0, 0)]
            outbox.put(report(0, 1))
            until(lambda: not outbox._kept, lambda: threading.Event().wait(0.05))
            assert outbox.connected  # nothing tells the worker to replay
            inbox.replay_over_ray(0, outbox)
            assert inbox.poll(1.5) == []
        finally:
            inbox.close()


def test_a_plain_report_is_pickled_by_the_c_pickler():
    # cloudpickle's Python-level reducer was the larger half of a metrics-only report()'s cost.
    event = ReportEvent(1, 7, {"step": 7, "loss": 0.25, "val": {"acc": 0.5}, "name": "a"}, False)
    payload = event_channel.dumps_event(event)
    assert payload == pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)
    assert pickle.loads(payload) == event


def test_a_metric_whose_class_lives_in_the_workers_main_still_unpickles_in_another_process():
    # The standard pickler writes a class of __main__ by reference, which names nothing in the
    # driver's __main__ (another script): such events must go through cloudpickle, by value.
    main = sys.modules["__main__"]
    point = type("FlowtrainTestPoint", (), {"__module__": "__main__", "__qualname__": "FlowtrainTestPoint"})
    main.FlowtrainTestPoint = point
    try:
        instance = point()
        instance.x = 3
        payload = event_channel.dumps_event(ReportEvent(0, 0, {"point": instance}, False))
    finally:
        delattr(main, "FlowtrainTestPoint")
    read_back = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; print(pickle.loads(sys.stdin.buffer.read()).metrics['point'].x)"],
        input=payload,
        capture_output=True,
        timeout=60,
    )
    assert read_back.returncode == 0, read_back.stderr.decode()
    assert read_back.stdout.decode().strip() == "3"


class Steps(UserCallback):
    def __init__(self):
        self.steps: list[list[int]] = []

    def after_report(self, run_context, metrics, checkpoint):
        self.steps.append([m["step"] for m in metrics])


def reporting_loop(config):
    from trainers import report

    for step in range(config["steps"]):
        report({"step": step})


def test_a_run_whose_workers_cannot_reach_the_controller_reports_through_ray(ray_local, tmp_path, monkeypatch):
    import trainers._internal.events.worker_inbox as inbox

    class Unreachable(EventListener):
        """Listens, but tells the workers a port nothing listens on."""

        def __init__(self, host, connections=0):
            super().__init__(host, connections)
            closed = socket.socket()
            closed.bind(("127.0.0.1", 0))
            port = closed.getsockname()[1]
            closed.close()
            self.address = ChannelAddress(host, port, self.token)

    monkeypatch.setattr(inbox, "EventListener", Unreachable)
    steps = Steps()
    result = DataParallelTrainer(
        reporting_loop,
        train_loop_config={"steps": 6},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="no-socket", storage_path=str(tmp_path), callbacks=[steps]),
    ).fit()
    assert steps.steps == [[step, step] for step in range(6)]
    assert result.metrics["step"] == 5


def test_a_normal_run_reports_every_round_over_the_socket(ray_local, tmp_path, monkeypatch):
    import trainers._internal.events.worker_inbox as inbox

    over_socket: list[int] = []

    class Counting(EventListener):
        def poll(self, timeout_s):
            events = super().poll(timeout_s)
            over_socket.extend(event.world_rank for _, _, event in events if isinstance(event, ReportEvent))
            return events

    monkeypatch.setattr(inbox, "EventListener", Counting)
    steps = Steps()
    DataParallelTrainer(
        reporting_loop,
        train_loop_config={"steps": 8},
        scaling_config=ScalingConfig(num_workers=3, resources_per_worker={"CPU": 0.1}),
        run_config=RunConfig(name="socket", storage_path=str(tmp_path), callbacks=[steps]),
    ).fit()
    assert steps.steps == [[step] * 3 for step in range(8)]
    assert sorted(over_socket) == sorted([0, 1, 2] * 8)  # every report came over the socket


def checkpointing_loop(config):
    from trainers import report
    from trainers.collective import barrier

    for step in range(config["steps"]):
        barrier()  # a barrier event applied twice would hold every later barrier forever
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "step.txt"), "w") as file:
                file.write(str(step))
            report({"step": step}, checkpoint=Checkpoint.from_directory(folder))


@pytest.mark.parametrize("fault", ConnectionFaults.KINDS)
def test_a_rank_whose_connection_breaks_in_a_checkpoint_round_loses_no_report(
    fault, ray_local, tmp_path, monkeypatch, faults
):
    # Rank 1's connection is dropped (or left half-open) right after its first event, barrier 0,
    # arrives: its report of round 0, whose checkpoint is in storage already, is lost on the
    # socket, and the barrier, not acknowledged, may come again over Ray. Without acknowledgements
    # and replay round 0 never completes: the run fails (a misleading "uneven reports", or a hang
    # until report_timeout_s). The fault fires on the first event, before any acknowledgement is
    # due, so a busy machine cannot make the worker leave the socket before it.
    if fault == "half-open":
        monkeypatch.setattr(event_channel, "ACK_TIMEOUT_S", 2.0)  # found by the worker this soon
    applied: list[tuple[str, int, int]] = []
    add = AttemptBook.add

    def recording(book, event):
        if isinstance(event, (ReportEvent, SyncEvent)):
            applied.append((type(event).__name__, event.world_rank, event.index))
        add(book, event)

    monkeypatch.setattr(AttemptBook, "add", recording)
    faults.arm(1, fault)
    steps = Steps()
    result = DataParallelTrainer(
        checkpointing_loop,
        train_loop_config={"steps": 4},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.1}),
        run_config=RunConfig(
            name=f"broken-{fault}",
            storage_path=str(tmp_path),
            callbacks=[steps],
            failure_config=FailureConfig(max_failures=0, report_timeout_s=30),
        ),
    ).fit()
    assert faults.fired == [(1, fault)]
    assert steps.steps == [[step, step] for step in range(4)]  # every round committed once, in order
    # Every report and barrier of every rank reached the attempt's book once: replays were dropped.
    kinds = ("ReportEvent", "SyncEvent")
    assert sorted(applied) == sorted((kind, rank, step) for kind in kinds for rank in (0, 1) for step in range(4))
    restored = Result.from_path(result.path)
    assert list(restored.metrics_dataframe["step"]) == [0, 1, 2, 3]
    assert len(restored.best_checkpoints) == 4
    for checkpoint, metrics in restored.best_checkpoints:
        with checkpoint.as_directory() as folder:
            assert pathlib.Path(folder, "step.txt").read_text() == str(metrics["step"])


def failing_after_a_stalled_report_loop(config):
    from trainers import get_checkpoint, get_context, report
    from trainers.collective import barrier

    rank = get_context().get_world_rank()
    marks = config["marks"]
    start = 0
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            start = int(pathlib.Path(folder, "step.txt").read_text()) + 1
    if rank == 0:
        with open(os.path.join(marks, f"started-at-{start}"), "w"):
            pass
    for step in range(start, config["steps"]):
        barrier()
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "step.txt"), "w") as file:
                file.write(str(step))
            report({"step": step}, checkpoint=Checkpoint.from_directory(folder))
        if step == 1 and start == 0:
            if rank == 1:
                open(os.path.join(marks, "rank-1-reported-1"), "w").close()
            else:  # fails once rank 1's report() of step 1 returned: that round was reported everywhere
                while not os.path.exists(os.path.join(marks, "rank-1-reported-1")):
                    time.sleep(0.01)
                raise RuntimeError("rank 0 fails after step 1")


def test_an_attempt_that_ends_while_a_connection_is_half_open_keeps_the_round_it_holds(ray_local, tmp_path, faults):
    # Rank 1's connection goes half-open right after its barrier of step 1: its report of step 1
    # (returned, checkpoint uploaded) sits unread. Rank 0 then fails. The controller drains the
    # rounds rank 0 finished for a second, and rank 1 would replay its kept events over Ray only
    # when its acknowledgement clock runs out (ACK_TIMEOUT_S, 15 s): the round was lost and the run
    # resumed from step 0's checkpoint (the chaos soak's finding). The drain now takes the events a
    # rank holds unacknowledged when it asks the rank what it is doing.
    marks = tmp_path / "marks"
    marks.mkdir()
    faults.arm(1, "half-open", after_frames=2)  # rank 1's frames: barrier 0, report 0, barrier 1
    steps = Steps()
    result = DataParallelTrainer(
        failing_after_a_stalled_report_loop,
        train_loop_config={"steps": 4, "marks": str(marks)},
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.1}),
        run_config=RunConfig(
            name="stalled-then-failed",
            storage_path=str(tmp_path),
            callbacks=[steps],
            failure_config=FailureConfig(max_failures=1, report_timeout_s=60),
        ),
    ).fit()
    assert faults.fired == [(1, "half-open")]
    assert sorted(p.name for p in marks.iterdir() if p.name.startswith("started")) == ["started-at-0", "started-at-2"]
    assert steps.steps == [[step, step] for step in range(4)]  # every round committed once, in order
    assert list(Result.from_path(result.path).metrics_dataframe["step"]) == [0, 1, 2, 3]
