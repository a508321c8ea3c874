"""`make gpu-check` (benchmarks/gpu_check.py) on a machine without a GPU: it says so and exits 0;
its arguments, the JSON it writes, the ratios and the summary are checked here without Ray. The
checks themselves need a GPU (or `--allow-cpu` and minutes of Ray), so they are not run here."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.gpu_workloads import CHECKS, Setup, digest, read_rank_files, throughput_work
from conftest import ROOT

REPO = str(ROOT)


def test_without_a_gpu_it_says_so_and_exits_0(tmp_path):
    out = tmp_path / "results"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_check", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == gpu_check.NO_GPU_MESSAGE
    assert not out.exists()  # nothing ran, nothing written


def test_arguments():
    args = gpu_check.parse_args(["--out", "r", "--only", "fsdp", "nccl", "--seconds", "5"])
    assert (args.out, args.only, args.seconds, args.allow_cpu, args.child) == ("r", ["fsdp", "nccl"], 5.0, False, None)
    assert gpu_check.parse_args([]).budget_s == gpu_check.BUDGET_S < 8 * 60
    for bad in (["--only", "tpu"], ["--seconds", "0"], ["--budget-s", "-1"], ["--child", "nccl"]):
        with pytest.raises(SystemExit):
            gpu_check.parse_args(bad)
    # The testing switch and the internal ones stay out of the help.
    help_text = gpu_check.build_parser().format_help()
    assert "--only" in help_text and "--allow-cpu" not in help_text and "--child" not in help_text


def test_ratios_summary_and_exit_code():
    samples = {"raw_single": 1000.0, "raw": 900.0, "flowtrain": 891.0, "ray.train": 810.0}
    assert gpu_check.throughput_ratios(samples) == {
        "flowtrain/raw": 0.99,
        "flowtrain/ray.train": 1.1,
        "ray.train/raw": 0.9,
        "raw/raw_single": 0.9,
        "flowtrain/raw_single": 0.891,
    }
    # A peer that failed (missing) or measured nothing (0) gives no ratio.
    assert gpu_check.throughput_ratios({"flowtrain": 5.0, "raw": 0.0}) == {}

    results = [
        {"name": "nccl", "status": "PASS", "seconds": 12.34},
        {"name": "deepspeed", "status": "SKIP", "seconds": 0.5, "error": "deepspeed does not import here"},
    ]
    lines = gpu_check.summary_lines(results, 60.0)
    assert lines[0] == "  PASS  nccl                  12.3 s"
    assert lines[1].endswith("0.5 s  deepspeed does not import here")
    assert lines[-1] == "gpu-check: 1 passed, 0 failed, 1 skipped in 60.0 s"
    assert gpu_check.exit_code(results) == 0
    assert gpu_check.exit_code([*results, {"name": "fsdp", "status": "FAIL", "seconds": 1.0}]) == 1
    assert gpu_check.exit_code([]) == 1


def test_reports_written_as_json(tmp_path):
    measured = {
        impl: {"samples_per_s": rate, "workers": 1, "wall_s": 30.0, "steps": 100}
        for impl, rate in (("raw", 2000.0), ("flowtrain", 1980.0))
    }
    results = [
        {"name": "nccl", "status": "PASS", "seconds": 3.0, "details": {"backend": "nccl"}},
        {
            "name": "throughput",
            "status": "FAIL",
            "seconds": 80.0,
            "error": "throughput: ray.train failed (...)",
            "details": {"measured": measured, "errors": {"ray.train": "RuntimeError: ..."}, "seconds_per_run": 20.0},
        },
    ]
    environment = {"torch": "2.11.0", "gpus": ["NVIDIA H100"]}
    paths = gpu_check.write_reports(str(tmp_path / "out"), environment, results)
    assert [os.path.basename(p) for p in paths] == ["gpu_check.json", "throughput.json"]

    report = json.loads(pathlib.Path(paths[0]).read_text())
    assert report["environment"] == environment and report["checks"] == results
    throughput = json.loads(pathlib.Path(paths[1]).read_text())
    assert throughput["status"] == "FAIL"
    assert throughput["samples_per_s"] == {"raw": 2000.0, "flowtrain": 1980.0}
    assert throughput["ratios"] == {"flowtrain/raw": 0.99}
    assert throughput["errors"] == {"ray.train": "RuntimeError: ..."} and throughput["seconds_per_run"] == 20.0

    # Without the throughput check only gpu_check.json is written.
    assert gpu_check.write_reports(str(tmp_path / "two"), environment, results[:1]) == [
        str(tmp_path / "two" / "gpu_check.json")
    ]


def test_every_check_fits_the_budget_alone_and_names_itself():
    assert list(CHECKS) == [
        "nccl",
        "shared_gpu_gloo",
        "placement",
        "checkpoint_resume",
        "nccl_reform",
        "cuda_oom",
        "fsdp",
        "amp",
        "deepspeed",
        "throughput",
    ]
    for check, limit_s in CHECKS.values():
        assert check.__doc__ and gpu_check.MIN_CHECK_S < limit_s <= gpu_check.BUDGET_S


def test_the_throughput_loop_and_the_resume_fingerprint_on_cpu(tmp_path):
    # The loop every implementation runs, in this process: one rank, a short window.
    threads = torch.get_num_threads()
    try:
        throughput_work(0, 1, torch.device("cpu"), 0.05, str(tmp_path))
    finally:
        torch.set_num_threads(threads)  # the loop pins one thread; give this process its own back
    (rank,) = read_rank_files(str(tmp_path), 1)
    assert rank["steps"] >= 20 and rank["seconds"] > 0 and rank["batch"] == 64

    state = {"w": torch.arange(4.0), "b": torch.zeros(2)}
    assert digest(state) == digest({k: v.clone() for k, v in state.items()})
    changed = dict(state, w=torch.tensor([0.0, 1.0, 2.0, 3.0000002]))
    assert digest(changed) != digest(state)
    assert Setup(use_gpu=False, num_gpus=0, workdir=str(tmp_path), seconds=1).num_workers == 2
    assert Setup(use_gpu=True, num_gpus=4, workdir=str(tmp_path), seconds=1).backend == "nccl"
