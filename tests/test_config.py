"""Configs reject bad values at construction, naming the field, the value and what is allowed."""

from __future__ import annotations

import pytest

from trainers import (
    CheckpointConfig,
    DataConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    ValidationConfig,
    ValidationTaskConfig,
)
from trainers.torch import TorchConfig, TorchTrainer


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_workers": -1}, r"ScalingConfig.num_workers=-1: must be an integer >= 0"),
        ({"num_workers": True}, r"ScalingConfig.num_workers=True"),
        ({"num_workers": 2.0}, r"ScalingConfig.num_workers=2.0"),
        ({"resources_per_worker": {"CPU": -1}}, r"resources_per_worker\['CPU'\]=-1: must be a number >= 0"),
        ({"resources_per_worker": {"CPU": float("nan")}}, r"resources_per_worker\['CPU'\]=nan"),
        ({"use_gpu": True, "resources_per_worker": {"GPU": 0}}, r"use_gpu=True with resources_per_worker\['GPU'\]=0"),
        ({"resources_per_worker": {"GPU": 1}}, r"use_gpu=False"),
        ({"use_gpu": "yes"}, r"ScalingConfig.use_gpu='yes': must be True or False"),
        ({"placement_strategy": "PACKED"}, r"placement_strategy='PACKED': must be one of 'PACK', 'SPREAD'"),
        ({"use_gpu": True, "use_tpu": True}, r"use_gpu=True and use_tpu=True together; a worker trains on one kind"),
        ({"label_selector": {"zone": 1}}, r"label_selector=\{'zone': 1\}: must be a dict of label name to value"),
    ],
)
def test_scaling_config_rejects(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        ScalingConfig(**kwargs)


@pytest.mark.parametrize("typo, builtin", [("gpu", "GPU"), ("cpu", "CPU"), ("Memory", "memory")])
def test_resource_name_in_the_wrong_case_suggests_rays_spelling(typo, builtin):
    with pytest.raises(ValueError) as caught:
        ScalingConfig(use_gpu=True, resources_per_worker={typo: 1})
    message = str(caught.value)
    assert "resources_per_worker" in message and repr(typo) in message and f"did you mean Ray's {builtin!r}" in message


def test_scaling_config_defaults_fill_resources():
    assert ScalingConfig(num_workers=2).total_resources == {"CPU": 2}
    # As Ray: a GPU worker asks for the GPU only, so a GPU node with few CPUs still fits one per GPU.
    assert ScalingConfig(num_workers=2, use_gpu=True).worker_resources == {"GPU": 1}
    assert ScalingConfig(use_gpu=True, accelerator_type="A100").worker_resources == {
        "GPU": 1,
        "accelerator_type:A100": 0.001,
    }
    assert ScalingConfig(use_gpu=True, resources_per_worker={"CPU": 2}).worker_resources == {"CPU": 2, "GPU": 1}
    assert ScalingConfig(resources_per_worker={"custom": 1}).worker_resources == {"custom": 1}
    assert ScalingConfig(resources_per_worker={"CPU": 0, "custom": 2}).worker_resources == {"custom": 2}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_failures": -2}, r"FailureConfig.max_failures=-2: must be an integer >= -1"),
        ({"max_failures": "3"}, r"FailureConfig.max_failures='3'"),
        ({"max_failures": True}, r"FailureConfig.max_failures=True"),
        ({"controller_failure_limit": -5}, r"controller_failure_limit=-5"),
        ({"report_timeout_s": 0}, r"FailureConfig.report_timeout_s=0: must be None or seconds > 0"),
    ],
)
def test_failure_config_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FailureConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_to_keep": 0}, r"num_to_keep=0"),
        ({"num_to_keep": True}, r"num_to_keep=True"),
        ({"checkpoint_score_order": "best"}, r"checkpoint_score_order='best'"),
        ({"checkpoint_score_attribute": ""}, r"checkpoint_score_attribute='': must be None or a metric name"),
    ],
)
def test_checkpoint_config_rejects(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        CheckpointConfig(**kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"storage_path": "relative/dir"}, r"storage_path='relative/dir': a relative path"),
        ({"storage_path": ""}, r"storage_path='': must be a non-empty absolute path or a URI"),
        ({"name": "a/b"}, r"RunConfig.name='a/b': must be one folder name"),
        ({"name": ""}, r"RunConfig.name='': must be a non-empty string"),
        ({"name": ".."}, r"RunConfig.name='..'"),
        ({"checkpoint_config": {"num_to_keep": 1}}, r"must be a CheckpointConfig"),
        ({"failure_config": 3}, r"must be a FailureConfig"),
        ({"callbacks": [object()]}, r"is not a trainers.UserCallback"),
        ({"storage_filesystem": "s3"}, r"must be a pyarrow.fs.FileSystem"),
    ],
)
def test_run_config_rejects(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        RunConfig(**kwargs)


def test_run_config_accepts_uris_and_home(tmp_path):
    assert RunConfig(storage_path="s3://bucket/prefix").resolved_storage_path == "s3://bucket/prefix"
    assert RunConfig(storage_path="~/runs").resolved_storage_path.endswith("/runs")
    assert not RunConfig(storage_path="~/runs").resolved_storage_path.startswith("~")
    assert RunConfig(storage_path=str(tmp_path), name="run-1").name == "run-1"


def test_torch_config_rejects():
    with pytest.raises(ValueError, match=r"TorchConfig.backend='mpi': must be one of 'gloo', 'nccl'"):
        TorchConfig(backend="mpi")
    with pytest.raises(ValueError, match=r"TorchConfig.timeout_s=0"):
        TorchConfig(timeout_s=0)
    with pytest.raises(ValueError, match=r"TorchConfig.init_method='file': must be one of 'env', 'tcp'"):
        TorchConfig(init_method="file")
    with pytest.raises(ValueError, match=r"backend='nccl'\) needs GPUs"):
        TorchTrainer(lambda: None, torch_config=TorchConfig(backend="nccl"))


def test_data_config_rejects():
    with pytest.raises(TypeError, match=r"DataConfig.datasets_to_split=3"):
        DataConfig(datasets_to_split=3)
    with pytest.raises(TypeError, match=r"DataConfig.execution_options=\{0: None\}: a dict must map dataset names"):
        DataConfig(execution_options={0: None})


def test_trainer_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"takes 2 required arguments"):
        TorchTrainer(lambda a, b: None)
    # Accepted with a warning, as Ray accepts it (tests/test_ray_behaviours.py runs one).
    with pytest.warns(
        UserWarning, match=r"train_loop_config was given, but train_loop_per_worker .* takes no argument"
    ):
        TorchTrainer(lambda: None, train_loop_config={"lr": 1})
    with pytest.raises(TypeError, match=r"scaling_config=\{'num_workers': 2\}: must be a trainers.ScalingConfig"):
        TorchTrainer(lambda: None, scaling_config={"num_workers": 2})
    with pytest.raises(TypeError, match=r"train_loop_per_worker=3: must be a function"):
        TorchTrainer(3)
    with pytest.raises(TypeError, match=r"torch_config=DataConfig\(.*\): must be a trainers.torch.TorchConfig"):
        TorchTrainer(lambda: None, torch_config=DataConfig())
    with pytest.raises(TypeError, match=r"datasets=\[\]: must be a dict of name to ray.data.Dataset"):
        TorchTrainer(lambda: None, datasets=[])


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: ValidationConfig(3), r"ValidationConfig\(fn=3\): must be a function taking the checkpoint"),
        (
            lambda: ValidationConfig(dict, task_config={}),
            r"task_config=\{\}\): must be a trainers.ValidationTaskConfig",
        ),
        (
            lambda: ValidationConfig(dict, ray_remote_kwargs=1),
            r"ray_remote_kwargs=1\): must be a dict of Ray task options",
        ),
        (lambda: ValidationTaskConfig(fn_kwargs=[1]), r"fn_kwargs=\[1\]\): must be a dict of argument name to value"),
        (lambda: ValidationTaskConfig(timeout_s=0), r"timeout_s=0\): must be None \(no limit\) or a number of seconds"),
    ],
)
def test_validation_config_rejects(build, message):
    with pytest.raises((TypeError, ValueError), match=message):
        build()


def test_configs_are_frozen_and_take_ray_s_positional_order():
    # Ray's V2 ScalingConfig keeps V1's field order, whose first field is the removed trainer_resources.
    with pytest.raises(DeprecationWarning, match="trainer_resources"):
        ScalingConfig({"CPU": 1})  # type: ignore[misc]
    assert ScalingConfig(None, 3).num_workers == 3
    assert FailureConfig(2).max_failures == 2
    config = ScalingConfig(num_workers=2)
    with pytest.raises(AttributeError):
        config.num_workers = 3  # type: ignore[misc]


def test_torch_init_method_becomes_the_url_torch_distributed_takes():
    from trainers.torch.config import init_method_url

    assert init_method_url("env", "10.0.0.1", "29500") == "env://"
    assert init_method_url("tcp", "10.0.0.1", "29500") == "tcp://10.0.0.1:29500"
    assert init_method_url("tcp", "fd00::1", "29500") == "tcp://[fd00::1]:29500"


def test_accelerator_type_asks_each_worker_for_a_sliver_of_rays_accelerator_resource():
    scaling = ScalingConfig(num_workers=2, use_gpu=True, accelerator_type="A100")

    assert scaling.worker_resources == {"GPU": 1, "accelerator_type:A100": 0.001}  # no CPU, as Ray asks
    assert ScalingConfig().worker_resources == {"CPU": 1}
    with pytest.raises(ValueError, match=r"ScalingConfig.accelerator_type='': must be a name such as 'A100'"):
        ScalingConfig(accelerator_type="")


def test_a_tpu_topology_gives_each_worker_a_whole_host_and_wants_whole_slices():
    tpu = {"use_tpu": True, "accelerator_type": "TPU-V4"}
    # Ray's 2x2x2 v4 slice: 8 chips on 2 hosts of 4, so 4 workers span two slices.
    scaling = ScalingConfig(num_workers=4, topology="2x2x2", **tpu)
    assert scaling.worker_resources == {"CPU": 1, "TPU": 4, "accelerator_type:TPU-V4": 0.001}
    assert scaling.tpu_workers_per_slice == 2
    # Ray's own test_tpu_multi_slice_uneven_workers: its error type and first words.
    with pytest.raises(
        ValueError,
        match=r"^The configured `num_workers` \(3\) must be a multiple of 2 for the specified topology \(2x2x2\)",
    ):
        ScalingConfig(num_workers=3, topology="2x2x2", **tpu)
    with pytest.raises(
        ValueError, match=r"^The configured `num_workers` \(6\) must be a multiple of 4 .*holds 4 workers"
    ):
        ScalingConfig(num_workers=6, topology="2x2x1", resources_per_worker={"TPU": 1}, **tpu)
    with pytest.raises(ValueError, match=r"^The configured `min_workers` \(1\) must be a multiple of 2"):
        ScalingConfig(num_workers=(1, 4), topology="2x2x2", **tpu)
    with pytest.raises(
        ValueError,
        match=r"^Cannot set `label_selector` when `use_tpu=True` because Ray Train .*ScalingConfig: drop label_selector",
    ):
        ScalingConfig(num_workers=2, topology="2x2x2", label_selector={"zone": "a"}, **tpu)


def test_the_default_start_timeout_grows_with_the_group_and_the_variable_overrides_it(monkeypatch):
    from trainers.tuning import worker_start_timeout_s

    monkeypatch.delenv("FLOWTRAIN_WORKER_START_TIMEOUT_S", raising=False)
    assert worker_start_timeout_s(2) == 121.0
    assert worker_start_timeout_s(64) == 152.0  # 64 workers start in ~20 s on 2 cores (benchmarks/scale)
    assert worker_start_timeout_s(1000) == 620.0
    monkeypatch.setenv("FLOWTRAIN_WORKER_START_TIMEOUT_S", "7")
    assert worker_start_timeout_s(64) == 7.0
