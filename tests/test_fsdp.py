"""FSDP (torch's fully_shard) under TorchTrainer on 2 CPU workers over gloo: same losses as DDP,
checkpoints that reload (full state dict from rank 0, and sharded DCP with resume), and Ray's
FSDP1-style parallel_strategy_kwargs mapped onto fully_shard (or refused, naming the argument)."""

from __future__ import annotations

import os

import pytest
import torch

import integration_loops
from trainers import RunConfig, ScalingConfig
from trainers.torch import TorchTrainer

EPOCHS = 4
# Same seed, same data, same arithmetic up to the order of float32 reductions.
LOSS_TOLERANCE = dict(rtol=1e-5, atol=1e-6)

pytestmark = pytest.mark.usefixtures("ray_local")


def fit(tmp_path, strategy, *, epochs=EPOCHS, name=None):
    return TorchTrainer(
        integration_loops.sharded_loop,
        train_loop_config={"strategy": strategy, "epochs": epochs},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=name or strategy, storage_path=str(tmp_path)),
    ).fit()


def full_state(result):
    with result.checkpoint.as_directory() as folder:
        return torch.load(os.path.join(folder, "model.pt"))


def test_fsdp_reaches_the_ddp_losses_and_its_checkpoint_reloads(tmp_path):
    ddp, fsdp = fit(tmp_path, "ddp"), fit(tmp_path, "fsdp")

    ddp_losses, fsdp_losses = list(ddp.metrics_dataframe["loss"]), list(fsdp.metrics_dataframe["loss"])
    assert len(fsdp_losses) == EPOCHS and fsdp_losses[-1] < fsdp_losses[0]
    torch.testing.assert_close(torch.tensor(fsdp_losses), torch.tensor(ddp_losses), **LOSS_TOLERANCE)

    # The gathered FSDP weights load into the plain, unsharded model (strict) and equal DDP's.
    model = integration_loops.mlp()
    model.load_state_dict(full_state(fsdp))
    for name, value in full_state(ddp).items():
        torch.testing.assert_close(model.state_dict()[name], value, **LOSS_TOLERANCE)


def test_user_fully_shard_saves_sharded_checkpoints_and_resumes_to_the_same_losses(tmp_path):
    first = fit(tmp_path, "fully_shard", epochs=2, name="sharded")
    with first.checkpoint.as_directory() as folder:
        files = sorted(os.listdir(folder))
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "epoch.txt"]  # each rank's shard, merged

    resumed = fit(tmp_path, "fully_shard", epochs=EPOCHS, name="sharded")
    assert list(resumed.metrics_dataframe["epoch"]) == list(range(EPOCHS))  # epochs 2, 3 after 0, 1
    uninterrupted = fit(tmp_path, "ddp")
    torch.testing.assert_close(
        torch.tensor(list(resumed.metrics_dataframe["loss"])),
        torch.tensor(list(uninterrupted.metrics_dataframe["loss"])),
        **LOSS_TOLERANCE,
    )

    # The sharded checkpoint also reloads in one process, without FSDP.
    with resumed.checkpoint.as_directory() as folder:
        state = integration_loops.load_sharded_checkpoint(folder)
    model = integration_loops.mlp()
    model.load_state_dict(state)
    for name, value in full_state(uninterrupted).items():
        torch.testing.assert_close(model.state_dict()[name], value, **LOSS_TOLERANCE)


# -- Ray's FSDP1-style parallel_strategy_kwargs, mapped onto fully_shard -------------------------


def test_rays_fsdp1_kwargs_train_on_cpu_like_ddp(tmp_path):
    from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    import deepspeed_loops

    ray_style = {
        "sharding_strategy": ShardingStrategy.SHARD_GRAD_OP,
        "auto_wrap_policy": ModuleWrapPolicy({torch.nn.Linear}),
        "mixed_precision": MixedPrecision(param_dtype=torch.float32, reduce_dtype=torch.float32),
        "cpu_offload": CPUOffload(offload_params=False),
        "sync_module_states": True,
        "forward_prefetch": True,
        "backward_prefetch": BackwardPrefetch.BACKWARD_PRE,
        "limit_all_gathers": True,
        "use_orig_params": True,
        "device_id": torch.device("cpu"),
    }
    variants = [
        ("ray_style", ray_style),
        ("hybrid", {"sharding_strategy": ShardingStrategy.HYBRID_SHARD}),
        ("no_shard", {"sharding_strategy": ShardingStrategy.NO_SHARD}),
    ]
    result = (
        TorchTrainer(
            deepspeed_loops.fsdp_kwargs_loop,
            train_loop_config={"steps": 6, "variants": variants},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(name="fsdp1-kwargs", storage_path=str(tmp_path)),
        )
        .fit()
        .return_value
    )

    losses = result["losses"]
    assert losses["ddp"][-1] < 0.2 * losses["ddp"][0]
    for name, _ in variants:
        torch.testing.assert_close(torch.tensor(losses[name]), torch.tensor(losses["ddp"]), **LOSS_TOLERANCE, msg=name)
    # ModuleWrapPolicy({Linear}): both Linear layers got their own fully_shard, under the root's.
    assert result["sharded_submodules"] == {"ray_style": 2, "hybrid": 0, "no_shard": 0}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"bogus": 1}, r"unknown parallel_strategy_kwargs 'bogus'\. Accepted: fully_shard's mesh.*sharding_strategy"),
        ({"param_init_fn": print}, r"'param_init_fn'.*no init hook.*to_empty"),
        ({"use_orig_params": False}, r"'use_orig_params': False.*original parameters"),
        ({"sharding_strategy": "FULL"}, r"'sharding_strategy': 'FULL'.*ShardingStrategy\.FULL_SHARD"),
        ({"sharding_strategy": "FULL_SHARD", "reshard_after_forward": True}, r"same thing as 'reshard_after_forward'"),
    ],
)
def test_fsdp_kwargs_without_a_fully_shard_meaning_are_named(kwargs, message):
    from trainers.torch import prepare_model

    with pytest.raises(ValueError, match=message):
        prepare_model(torch.nn.Linear(2, 2), parallel_strategy="fsdp", parallel_strategy_kwargs=kwargs)


def test_fsdp1_mixed_precision_buffer_dtype_is_refused_with_the_fix():
    from torch.distributed.fsdp import MixedPrecision

    from trainers.torch import prepare_model

    with pytest.raises(ValueError, match=r"buffer_dtype has no FSDP2 equivalent.*leave buffer_dtype unset"):
        prepare_model(
            torch.nn.Linear(2, 2),
            parallel_strategy="fsdp",
            parallel_strategy_kwargs={"mixed_precision": MixedPrecision(buffer_dtype=torch.bfloat16)},
        )
