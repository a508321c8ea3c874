"""Ctrl-C in the driver: fit() stops at once and leaves no workers, placement groups or lease."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT, assert_no_leaks, process_alive

DRIVER = textwrap.dedent(
    """
    import faulthandler, signal, sys
    faulthandler.register(signal.SIGUSR1)  # the test asks for every thread's stack if Ctrl-C hangs
    # As in a terminal: a suite started in the background (CI, `make test &`) passes SIGINT down
    # ignored, and Python then never raises KeyboardInterrupt.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import loops
    from trainers import RunConfig, ScalingConfig
    from trainers.torch import TorchTrainer

    storage, pid_dir = sys.argv[1], sys.argv[2]
    TorchTrainer(
        loops.endless_loop,
        train_loop_config={"pid_dir": pid_dir},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="interrupted", storage_path=storage),
    ).fit()
    """
)


@pytest.mark.usefixtures("ray_local")
def test_ctrl_c_tears_everything_down(tmp_path):
    import ray

    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    env = dict(os.environ, RAY_ADDRESS=ray.get_runtime_context().gcs_address)  # fit() joins this cluster
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path), str(pid_dir)],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        # Both ranks are in their training loop and their reports reach the driver: then Ctrl-C.
        deadline = time.monotonic() + 120
        while len(list(pid_dir.glob("*.reporting"))) < 2:
            assert driver.poll() is None, driver.stdout.read()
            assert time.monotonic() < deadline, f"workers never reported: {sorted(p.name for p in pid_dir.iterdir())}"
            time.sleep(0.2)
        assert list((tmp_path / "interrupted").glob("lease.*.json"))  # the driver holds the run
        worker_pids = [int(p.read_text()) for p in pid_dir.glob("*.pid")]
        driver.send_signal(signal.SIGINT)
        try:
            output, _ = driver.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            driver.send_signal(signal.SIGUSR1)
            driver.kill()
            pytest.fail(f"fit() did not end within 60 s of Ctrl-C; its threads:\n{driver.communicate()[0][-12000:]}")
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode != 0 and "KeyboardInterrupt" in output
    assert not list((tmp_path / "interrupted").glob("lease.*.json"))  # the run was let go cleanly
    assert_no_leaks(timeout_s=30)
    deadline = time.monotonic() + 30
    while any(process_alive(pid) for pid in worker_pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(process_alive(pid) for pid in worker_pids)
