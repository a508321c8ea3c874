"""Two drivers race for one run (the same storage_path and name) from two processes, at seeded
random moments, on local disk and on a moto S3 server; between races the driver holding the run
is SIGKILLed at a random moment and the other starts at once. Never do two drivers train at the
same time, and run.json is whole after every race: every epoch recorded once, in order, each
checkpoint where it says, and the run resumes where the last driver stopped.

Each driver is a process of its own, forked by a ``multiprocessing`` fork server that has the
project imported (so it shares no Ray or threads with pytest, and a killed driver is replaced in
a moment), and told by the test when to call ``fit()``: a moment on the clock, so the two start at
the random offsets the seed chose. The training loop runs in the driver
(``num_workers=0``), which makes a race a fraction of a second. Each loop appends "start" and
"end" to one log with ``O_APPEND``; the test appends "killed" once a killed driver is reaped.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import pyarrow.fs as pafs
import pytest

from faulty_s3 import BUCKET, FaultyS3, log_event, moto_s3, read_events
from loops import resume_after_checkpoint
from prefect_server import wait_until
from storage import RunInProgressError, RunStorage
from storage.filesystem import read_bytes, write_bytes

RUN = "raced"
SEED = 35
#: Races per storage, and after how many of them the driver holding the run is killed and the
#: other one starts at once (S3 on moto is slower: fewer races).
NUM_RACES = {"local": 20, "s3": 10}
NUM_KILLS = {"local": 5, "s3": 3}
EPOCHS_PER_RACE = 2
#: The two drivers start within this many seconds of each other, chosen per race: at almost the
#: same moment (both taking the lease) or about one driver's training apart.
START_SPREADS_S = (0.03, 0.5)
REPLY_TIMEOUT_S = 120
#: lease_stale_after_s of the storage-level races below: short, since they wait for it to pass, yet
#: long enough for a loaded machine to renew a heartbeat within half of it (or the owner stops).
STALE_AFTER_S = 3.0


def race_loop(config: dict) -> None:
    """Logs its start, trains from the epoch after its checkpoint up to ``epochs``, logs its end."""
    from trainers import Checkpoint, report

    log_event(config["log"], f"start {config['who']}")
    for epoch in range(resume_after_checkpoint("epoch.txt"), config["epochs"]):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "epoch.txt"), "w") as f:
                f.write(str(epoch))
            report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(folder))
    log_event(config["log"], f"end {config['who']}")


def fit(where: dict, name: str, epochs: int, log: str, who: str) -> None:
    from trainers import DataParallelTrainer, RunConfig, ScalingConfig

    DataParallelTrainer(
        race_loop,
        train_loop_config={"epochs": epochs, "log": log, "who": who},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name=name, storage_path=where["path"], storage_filesystem=where["filesystem"]),
    ).fit()


def driver_main(conn, where: dict, log: str, driver: str) -> None:
    """One driver process: warm up, then for each (race, start_at, epochs) received, fit() from
    ``start_at`` on and answer how it went: trained, refused (RunInProgressError) or failed."""
    from storage import RunInProgressError

    fit(where, f"warmup-{driver}-{os.getpid()}", 1, log, f"{driver} warmup")  # imports done before any race
    conn.send("ready")
    while (order := conn.recv()) is not None:
        race, start_at, epochs = order
        time.sleep(max(0.0, start_at - time.time()))
        try:
            fit(where, RUN, epochs, log, f"{driver} {race}")
            conn.send(("trained", ""))
        except RunInProgressError as error:
            conn.send(("refused", str(error)))
        except BaseException:  # noqa: BLE001 - whatever ended the driver goes back to the test, with its traceback
            conn.send(("failed", traceback.format_exc()))


FORKS = multiprocessing.get_context("forkserver")
# Imported once in the fork server, not in every driver (pandas: what fit() loads on first use).
FORKS.set_forkserver_preload([__name__, "trainers", "pandas"])


class Driver:
    """A warm driver process and the pipe that tells it when to start."""

    def __init__(self, where: dict, log: str, driver: str) -> None:
        self.name = driver
        self.conn, child = FORKS.Pipe()
        where = {"path": where["path"], "filesystem": where["filesystem"]}  # what pickles
        self.process = FORKS.Process(target=driver_main, args=(child, where, log, driver))
        self.process.start()

    def ready(self) -> None:
        assert self._reply() == "ready"

    def start(self, race: int, start_at: float, epochs: int) -> None:
        self.conn.send((race, start_at, epochs))

    def outcome(self) -> tuple[str, str]:
        return self._reply()

    def _reply(self):
        if not self.conn.poll(REPLY_TIMEOUT_S):
            pytest.fail(f"driver {self.name} (pid {self.process.pid}) did not answer in {REPLY_TIMEOUT_S} s")
        return self.conn.recv()

    def kill(self) -> None:
        self.process.kill()
        self.process.join()

    def stop(self) -> None:
        if self.process.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send(None)
            self.process.join(30)
        if self.process.is_alive():
            self.kill()


@pytest.fixture(scope="module")
def s3():
    with moto_s3() as fs:
        yield fs


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path):
    """Where runs are stored: ``kind`` (local, s3), ``fs`` and ``root`` (a folder in it) for
    RunStorage, ``path`` and ``filesystem`` for RunConfig."""
    if request.param == "local":
        root = str(tmp_path / "store")
        return {"kind": "local", "fs": pafs.LocalFileSystem(), "root": root, "path": root, "filesystem": None}
    s3 = request.getfixturevalue("s3")
    root = f"{BUCKET}/{tmp_path.name}"
    return {"kind": "s3", "fs": s3, "root": root, "path": f"s3://{root}", "filesystem": s3}


def read(where: dict, name: str) -> bytes:
    """The bytes of file ``name`` of the raced run."""
    return read_bytes(where["fs"], f"{where['root']}/{RUN}/{name}")


def claims(where: dict) -> list[dict]:
    """The claims on the raced run's lease: its holder's while it is held, else none."""
    listed = where["fs"].get_file_info(pafs.FileSelector(f"{where['root']}/{RUN}", allow_not_found=True))
    return [
        json.loads(read_bytes(where["fs"], e.path)) for e in listed if re.fullmatch(r"lease\..*\.json", e.base_name)
    ]


def check_no_overlap(events: list[str]) -> None:
    """No driver starts training while another one is training."""
    training: set[str] = set()
    for line in events:
        kind, who = line.split(" ", 1)
        if who.endswith("warmup"):
            continue
        if kind == "start":
            assert not training, f"{who} started training while {training} was training:\n" + "\n".join(events)
            training.add(who)
        else:  # end, or killed
            training.discard(who)


def check_run_json(where: dict, epochs: int | None) -> None:
    """run.json parses; the history it counts records epochs 0..n-1 once each, in order (n =
    ``epochs`` when known, and then the run is finished), and its latest checkpoint holds the
    last of them. (The metrics log is written before run.json: it may hold a report more.)"""
    from storage.layout import RunLayout
    from storage.metrics_log import read_history
    from storage.snapshot import RunSnapshot

    snapshot = RunSnapshot.from_json(read(where, "run.json"))
    logged = read_history(where["fs"], RunLayout(f"{where['root']}/{RUN}"))
    recorded = [report.metrics["epoch"] for report in logged][: snapshot.num_reports]
    assert len(recorded) == snapshot.num_reports, (
        f"run.json counts {snapshot.num_reports} reports, the log has {recorded}"
    )
    assert recorded == list(range(len(recorded))), f"run.json records epochs {recorded}"
    if epochs is not None:
        assert len(recorded) == epochs and snapshot.finished
    latest = snapshot.latest
    if recorded:
        assert latest is not None and latest.metrics["epoch"] == recorded[-1]
        assert read(where, f"{latest.dir_name}/epoch.txt") == str(recorded[-1]).encode()


def test_two_drivers_racing_for_one_run_never_train_together(where, tmp_path):
    rng = random.Random(SEED)
    log = str(tmp_path / "events.log")
    kills = set(rng.sample(range(NUM_RACES[where["kind"]]), NUM_KILLS[where["kind"]]))
    drivers = [Driver(where, log, name) for name in ("a", "b")]
    trained_races = 0
    try:
        for driver in drivers:
            driver.ready()
        epochs = 0
        for race in range(NUM_RACES[where["kind"]]):
            epochs += EPOCHS_PER_RACE
            spread, now = rng.choice(START_SPREADS_S), time.time() + 0.05
            for driver in drivers:
                driver.start(race, now + rng.uniform(0, spread), epochs)
            outcomes = [driver.outcome() for driver in drivers]
            for kind, detail in outcomes:
                assert kind == "trained" or (kind == "refused" and "run in progress" in detail), detail
            trained = [kind for kind, _ in outcomes].count("trained")
            trained_races += trained > 0
            check_no_overlap(read_events(log))
            check_run_json(where, epochs if trained else None)
            if not trained:
                # Both refused (two claims seen at once; more often on a loaded machine): the run
                # is where it was, and a driver that tries again alone takes it.
                drivers[0].start(race, time.time(), epochs)
                assert drivers[0].outcome() == ("trained", "")
                check_no_overlap(read_events(log))
                check_run_json(where, epochs)

            if race in kills:
                holder, other = drivers if rng.random() < 0.5 else drivers[::-1]
                epochs += EPOCHS_PER_RACE
                holder.start(race, time.time(), epochs)
                time.sleep(rng.uniform(0, START_SPREADS_S[-1]))  # a random moment of its run
                holder.kill()
                log_event(log, f"killed {holder.name} {race}")
                other.start(race, time.time(), epochs)  # at once: the dead holder's lease is no obstacle
                assert other.outcome() == ("trained", "")
                check_no_overlap(read_events(log))
                check_run_json(where, epochs)
                drivers[drivers.index(holder)] = replacement = Driver(where, log, holder.name)
                replacement.ready()
        assert claims(where) == []  # every driver let the run go, the killed ones' claims removed
    finally:
        for driver in drivers:
            driver.stop()
    assert trained_races >= 1  # racing drivers do not always refuse each other


class HeldLeaseWrites(FaultyS3):
    """Forwards to a filesystem; between ``stall()`` and ``resume()`` this process's writes to a
    run's lease wait (setting ``waiting`` first): a driver stalled between looking at the lease and
    writing it, or an owner whose heartbeat cannot reach the storage."""

    def __init__(self, fs: pafs.FileSystem, log_path: str) -> None:
        super().__init__(fs, log_path)
        self.waiting, self._go = threading.Event(), threading.Event()
        self._go.set()

    def stall(self) -> None:
        self._go.clear()

    def resume(self) -> None:
        self._go.set()

    def open_output_stream(self, path, metadata):
        if "/lease." in path and not self._go.is_set():
            self.waiting.set()
            self._go.wait(REPLY_TIMEOUT_S)
        return super().open_output_stream(path, metadata)


def test_a_driver_stalled_between_looking_and_claiming_never_takes_a_run_another_holds(where, tmp_path):
    """Regression: B starts first, but its write to the lease stalls (a slow network, a paused
    process) while A takes the run; when B's write lands, B must give up. The lease was read, then
    written, trusting a 50 ms wait: B, which had found it free, overwrote A's and both owned the run."""
    stalled = HeldLeaseWrites(where["fs"], str(tmp_path / "fs.log"))
    stalled.stall()
    outcome: dict[str, object] = {}

    def start_b() -> None:
        try:
            RunStorage(where["root"], RUN, filesystem=pafs.PyFileSystem(stalled), check_timeout_s=60).open("b")
            outcome["b"] = "owns the run"
        except RunInProgressError as error:
            outcome["b"] = error

    b = threading.Thread(target=start_b)
    b.start()
    assert stalled.waiting.wait(60)
    a = RunStorage(where["root"], RUN, filesystem=where["fs"])
    a.open("a")
    stalled.resume()
    b.join(60)
    assert isinstance(outcome["b"], RunInProgressError) and "owned by a " in str(outcome["b"]), outcome["b"]
    assert [claim["owner"] for claim in claims(where)] == ["a"]
    a.finish()
    assert claims(where) == []


def stalled_owner_and_its_successor(where, tmp_path) -> tuple[RunStorage, HeldLeaseWrites, RunStorage]:
    """A owns the run (one attempt started) and its heartbeats stall; B takes the run over once
    A's lease is stale. Returns A, A's stalled filesystem and B."""
    paused = HeldLeaseWrites(where["fs"], str(tmp_path / "fs.log"))
    a = RunStorage(where["root"], RUN, filesystem=pafs.PyFileSystem(paused), lease_stale_after_s=STALE_AFTER_S)
    a.open("a")
    a.start_attempt()
    paused.stall()  # from now on A's heartbeats wait
    b = RunStorage(where["root"], RUN, filesystem=where["fs"], lease_stale_after_s=STALE_AFTER_S)
    for _ in range(100):
        try:
            b.open("b")
            return a, paused, b
        except RunInProgressError as refused:
            time.sleep(refused.retry_after_s + 0.05)  # as the error says: retry once A's lease is stale
    pytest.fail("B never took over A's stale lease")


def test_an_owner_whose_heartbeat_stalls_writes_nothing_once_the_run_may_be_taken_over(where, tmp_path):
    """Regression: A's heartbeat cannot reach the storage (storage down for A, a paused process)
    until its lease is stale and B takes the run over; A must then write nothing to the run. A
    used to go on writing run.json over B's."""
    a, paused, b = stalled_owner_and_its_successor(where, tmp_path)
    b_attempt = b.start_attempt()

    with pytest.raises(RunInProgressError, match="lost the run's lease"):
        a.start_attempt()
    with pytest.raises(RunInProgressError, match="lost the run's lease"):
        a.finish()
    paused.resume()  # A's stalled heartbeat lands; A finds B's claim and gives up
    a.close()

    assert [claim["owner"] for claim in claims(where)] == ["b"]
    assert json.loads(read(where, "run.json"))["attempt"] == b_attempt == 2
    b.finish()


def test_an_owner_whose_heartbeat_stalled_past_staleness_never_writes_again_even_when_the_run_is_free(where, tmp_path):
    """Regression (found by the namespace-cluster test of a Prefect host cut off mid-run): A's
    heartbeat cannot reach the storage until its lease is stale; B takes the run over, trains and
    finishes it, releasing its claim; then A's heartbeat lands. Finding no live claim, A renewed
    its lease and wrote the run again (over B's run.json and checkpoints). A must give the run up."""
    a, paused, b = stalled_owner_and_its_successor(where, tmp_path)
    assert b.start_attempt() == 2
    b.finish()
    assert claims(where) == []

    heartbeat = a._lease._thread
    paused.resume()  # A's stalled heartbeat lands on a run nobody holds
    heartbeat.join(timeout=30)  # it gives the run up at once; renewing, it would beat on
    with pytest.raises(RunInProgressError, match="not renewed for .* another driver"):
        a.start_attempt()
    a.close()
    assert claims(where) == []
    record = json.loads(read(where, "run.json"))
    assert record["attempt"] == 2 and record["finished"] is True


def test_an_owner_whose_heartbeat_stalled_past_staleness_keeps_the_run_when_nobody_took_it(where, tmp_path):
    """Regression (CI, a Tune trial on a loaded machine): A's heartbeat could not land for longer
    than stale_after_s, but no other driver came for the run meanwhile. A gave the run up anyway,
    deleting its claim, so its workers found no lease file and the trial failed with
    StorageNotSharedError. With no other claim and no mark of a takeover, A keeps the run."""
    paused = HeldLeaseWrites(where["fs"], str(tmp_path / "fs.log"))
    a = RunStorage(where["root"], RUN, filesystem=pafs.PyFileSystem(paused), lease_stale_after_s=STALE_AFTER_S)
    a.open("a")
    first = a.start_attempt()
    lease = a._lease
    paused.stall()
    assert paused.waiting.wait(60)  # a heartbeat is stuck in its write
    stuck_since = lease._renewed
    wait_until(
        lambda: time.time() - stuck_since > STALE_AFTER_S, timeout_s=60, what="A's claim going stale", interval_s=0.05
    )
    resumed_at = time.time()
    paused.resume()  # the stuck write lands; a fresh heartbeat follows it at once
    wait_until(lambda: lease._renewed >= resumed_at, timeout_s=60, what="A's fresh heartbeat", interval_s=0.05)

    assert lease._lost is None and lease._thread is not None and lease._thread.is_alive()
    assert a.start_attempt() == first + 1
    assert [claim["owner"] for claim in claims(where)] == ["a"]
    a.finish()
    assert claims(where) == []


def test_workers_missing_a_lease_the_driver_lost_name_the_lost_lease_not_unshared_storage(tmp_path):
    """The workers' look for the driver's lease file before training: when the driver cannot see
    it either, the lease was lost (the error says so), not the storage unshared."""
    from trainers._internal.workers.shared_storage import check_every_node_sees

    fs, marker = pafs.LocalFileSystem(), str(tmp_path / "lease.0123.json")
    with pytest.raises(RunInProgressError, match=f"no longer holds the run's lease: its file {marker} is gone"):
        check_every_node_sees(fs, marker, [("host", "does not see it")], ["node"])


class RereadLeaseClaims(FaultyS3):
    """Forwards to a filesystem; the first read of each lease claim fails the way S3 does when the
    claim is rewritten between the two requests of a read (its size changed)."""

    def __init__(self, fs: pafs.FileSystem, log_path: str) -> None:
        super().__init__(fs, log_path)
        self.failed: set[str] = set()

    def open_input_stream(self, path):
        if "/lease." in path and path not in self.failed:
            self.failed.add(path)
            raise OSError("AWS Error INTERNAL_FAILURE during GetObject operation: Failed to flush response stream")
        return super().open_input_stream(path)


def test_a_claim_read_while_it_changes_is_read_again(where, tmp_path):
    """Regression, found by the race above on S3: right after a kill, reading the killed driver's
    claim failed ("Failed to flush response stream": most likely its last write, which the server
    finished after the kill, changed the object between the two requests of the read), and the
    rerun failed with a StorageError instead of taking the run over. A failed read is tried again."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    where["fs"].create_dir(f"{where['root']}/{RUN}", recursive=True)
    dead = {"owner": "killed", "host": socket.gethostname(), "pid": gone.pid, "heartbeat": time.time()}
    write_bytes(where["fs"], f"{where['root']}/{RUN}/lease.killed.json", json.dumps(dead).encode())
    rerun = RereadLeaseClaims(where["fs"], str(tmp_path / "fs.log"))
    storage = RunStorage(where["root"], RUN, filesystem=pafs.PyFileSystem(rerun))
    storage.open("rerun")
    assert rerun.failed and [claim["owner"] for claim in claims(where)] == ["rerun"]
    storage.finish()
