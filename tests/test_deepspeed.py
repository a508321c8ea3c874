"""DeepSpeed inside TorchTrainer on 2 CPU workers over gloo: ZeRO stages 1, 2 and 3 train like
plain DDP, their checkpoints (every rank's part in one reported checkpoint) resume a run whose
worker was SIGKILLed, and a ZeRO-3 checkpoint consolidates to one fp32 state dict."""

from __future__ import annotations

import os
import pathlib

import pytest
import torch

import deepspeed_loops
from trainers import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig, UserCallback
from trainers.torch import TorchTrainer

STEPS = 8
KILL_AT = 5
# Same data and seed; DeepSpeed reduces gradients in buckets, DDP in its own order.
TOLERANCE = dict(rtol=1e-4, atol=1e-5)

pytestmark = pytest.mark.usefixtures("ray_local")


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """One run: DDP, then ZeRO-1, -2 and -3 on the same model and data, in the same workers."""
    result = TorchTrainer(
        deepspeed_loops.compare_loop,
        train_loop_config={"steps": STEPS, "stages": [1, 2, 3]},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="compare", storage_path=str(tmp_path_factory.mktemp("ds"))),
    ).fit()
    return result.return_value


def test_zero_stages_1_2_3_train_like_ddp_on_cpu(compared):
    losses = compared["losses"]
    assert compared["accelerator"] == "cpu"
    assert compared["env"] == {"DS_ACCELERATOR": "cpu", "LOCAL_SIZE": "2", "CROSS_RANK": "0", "CROSS_SIZE": "1"}
    ddp = torch.tensor(losses["ddp"])
    assert ddp[-1] < 0.1 * ddp[0]
    for stage in (1, 2, 3):
        torch.testing.assert_close(torch.tensor(losses[f"zero{stage}"]), ddp, **TOLERANCE, msg=f"ZeRO-{stage}")


def test_the_shared_memory_op_is_the_one_make_install_compiled_and_sums_across_ranks(compared):
    shm = compared["shm"]
    # Imported from the installed package (the Makefile builds it into DeepSpeed's wheel), not
    # compiled on first use into torch's extensions folder.
    assert shm["module"] is not None, "DeepSpeed loaded no shared-memory op: was it built at install?"
    module = pathlib.Path(shm["module"])
    assert module.name.startswith("deepspeed_shm_comm_op.") and module.parent.parts[-3:] == ("deepspeed", "ops", "comm")
    # Level 1 (AVX2) runs the op's own fp32 kernel; at 0 the sum would come from gloo instead.
    assert shm["kernel_level"] >= 1, shm
    assert shm["sums"] == [3.0]  # 1 + 2 in every element


class Restarts(UserCallback):
    def __init__(self):
        self.restarts = 0

    def on_restart(self, run_context, failures, resume_from):
        self.restarts += 1


def test_killed_zero3_worker_resumes_from_the_last_deepspeed_checkpoint(tmp_path, compared):
    marker = tmp_path / "killed"
    restarts = Restarts()
    result = TorchTrainer(
        deepspeed_loops.resumable_zero_loop,
        train_loop_config={"stage": 3, "steps": STEPS, "kill_at": KILL_AT, "kill_rank": 1, "marker": str(marker)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="zero3-killed",
            storage_path=str(tmp_path),
            checkpoint_config=CheckpointConfig(num_to_keep=2),
            failure_config=FailureConfig(max_failures=1),
            callbacks=[restarts],
        ),
    ).fit()

    assert marker.exists() and restarts.restarts == 1
    history = result.metrics_dataframe
    # Every step once, and the optimizer step count continues after the restart (not from 0).
    assert list(history["step"]) == list(range(STEPS))
    assert list(history["global_steps"]) == list(range(1, STEPS + 1))
    assert result.return_value == {"global_steps": STEPS}
    # The resumed run ends where an unbroken run ends.
    torch.testing.assert_close(
        torch.tensor(list(history["loss"])), torch.tensor(compared["losses"]["zero3"]), **TOLERANCE
    )

    with result.checkpoint.as_directory() as folder:
        tag = pathlib.Path(folder, "latest").read_text().strip()
        assert tag == f"step{STEPS - 1}"
        files = set(os.listdir(os.path.join(folder, tag)))
        # Each rank's ZeRO-3 shard of the parameters and of the optimizer, in one checkpoint.
        for rank in (0, 1):
            assert f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt" in files
            assert f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt" in files

        # The shards consolidate, in one process, into the plain model's fp32 state dict.
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(folder)
    model = deepspeed_loops.mlp()
    model.load_state_dict(state)  # strict: every parameter is there, whole
    for name, value in compared["ddp_weights"].items():
        torch.testing.assert_close(model.state_dict()[name], torch.tensor(value), **TOLERANCE)


def test_importing_trainers_never_imports_deepspeed():
    import subprocess
    import sys

    code = "import sys, trainers, trainers.torch, trainers.torch.xla; print('deepspeed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
