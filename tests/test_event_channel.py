"""The workers' direct line to the controller: framing, the token, and the fall back to Ray."""

from __future__ import annotations

import socket
import threading

from trainers import DataParallelTrainer, RunConfig, ScalingConfig, UserCallback
from trainers._internal.event_channel import ChannelAddress, EventListener, EventSender
from trainers._internal.events import ReportEvent
from trainers._internal.worker import TrainWorker


def read_until(listener: EventListener, count: int) -> list[tuple[int, list]]:
    """Poll until ``count`` batches arrived (each poll returns what is there)."""
    batches: list[tuple[int, list]] = []
    for _ in range(200):
        found, _ = listener.poll(0.5)
        batches.extend(found)
        if len(batches) >= count:
            return batches
    raise AssertionError(f"only {len(batches)} of {count} batches arrived")


def test_each_ranks_events_arrive_in_order_whole_and_tagged_with_its_rank():
    listener = EventListener("127.0.0.1", connections=2)
    try:
        senders = [EventSender.connect(listener.address, rank) for rank in (0, 1)]
        big = "x" * (3 << 20)  # larger than one read: the frame arrives in pieces
        for step in range(5):
            for rank, sender in enumerate(senders):
                sender.send([ReportEvent(rank, step, {"step": step, "blob": big if step == 2 else ""}, False)])
        batches = read_until(listener, 10)
        for rank in (0, 1):
            steps = [batch[0].index for r, batch in batches if r == rank]
            assert steps == list(range(5))
        assert all(len(batch[0].metrics["blob"]) == len(big) for _, batch in batches if batch[0].index == 2)
        senders[0].close()
        for _ in range(50):
            listener.poll(0.1)
            if listener.closed:
                break
        assert listener.closed == [0]
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
    import struct

    listener = EventListener("127.0.0.1")
    marker = tmp_path / "unpickled"
    try:
        payload = pickle.dumps([RunsCodeWhenUnpickled(marker)])
        frame = struct.pack("!I", len(payload)) + payload
        with socket.create_connection(("127.0.0.1", listener.address.port)) as raw:  # no hello at all
            raw.sendall(frame * 20)
            wrong = EventSender.connect(ChannelAddress("127.0.0.1", listener.address.port, b"not-the-token-00"), 0)
            wrong.send_raw(frame)
            found: list = []
            for _ in range(10):
                batches, _ = listener.poll(0.1)
                found.extend(batches)
        assert found == [] and not marker.exists()
    finally:
        listener.close()


def test_wake_ends_a_poll_from_another_thread():
    listener = EventListener("127.0.0.1")
    try:
        threading.Timer(0.05, listener.wake).start()
        batches, woken = listener.poll(30)
        assert woken and batches == []
    finally:
        listener.close()


def test_a_worker_whose_connection_broke_queues_its_events_for_the_ray_long_poll():
    worker = TrainWorker()
    left, right = socket.socketpair()
    right.close()
    left.shutdown(socket.SHUT_RDWR)
    worker._sender = EventSender(left)
    event = ReportEvent(0, 0, {"step": 0}, False)
    worker._emit(event)
    assert worker._sender is None
    assert worker.next_events(0.01) == [event]


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
    import trainers._internal.worker_inbox as inbox

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
    import trainers._internal.worker_inbox as inbox

    over_socket: list[int] = []

    class Counting(EventListener):
        def poll(self, timeout_s):
            batches, woken = super().poll(timeout_s)
            over_socket.extend(event.world_rank for _, batch in batches for event in batch if isinstance(event, ReportEvent))
            return batches, woken

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
