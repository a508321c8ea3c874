"""The framework modules' Ray Train 2.60 names, working: AMP helpers, the *Checkpoint classes,
normalize_pandas_for_lightgbm, the trainers' removed get_model, Lightning's validation= and
DeepSpeed strategy, and TorchXLAConfig."""

from __future__ import annotations

import collections
import os
import pickle
import sys
import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs
import pytest
import torch

import trainers
from trainers import RunConfig, ScalingConfig
from trainers._extras import MissingExtraError
from trainers.context import StorageInfo, TrainContext, _set_context
from trainers.torch import (
    TorchCheckpoint,
    TorchConfig,
    TorchTrainer,
    accelerate,
    backward,
    prepare_data_loader,
    prepare_model,
    prepare_optimizer,
)


@pytest.fixture
def in_worker():
    """This process acts as a training worker (rank 0 of 1) for the test, with a fresh session."""
    storage = StorageInfo("/tmp", "/tmp/run", "/tmp/run", pyarrow.fs.LocalFileSystem())
    _set_context(TrainContext("run", 1, 0, 0, 1, 0, storage))
    yield
    _set_context(None)


# -- accelerate / prepare_optimizer / backward ------------------------------------------------


def amp_loop(config):
    """Two gloo workers: AMP on, one step; report what autocast, the scaler and the step did."""
    torch.manual_seed(0)
    accelerate(amp=True)
    model = prepare_model(torch.nn.Linear(4, 1))
    optimizer = prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    weight = model.module.weight
    before = weight.detach().clone()
    output = model(torch.ones(8, 4))
    backward(output.float().pow(2).mean())
    scaled = weight.grad.detach().clone()
    optimizer.step()
    unscaled = weight.grad.detach()
    trainers.report(
        {
            "wrapped": type(model).__name__,
            "output_dtype": str(output.dtype),
            "scale": float(optimizer.scaler.get_scale()),
            # step() unscales the gradients in place: their ratio is the loss scale, exactly.
            "grad_ratio": float((scaled / unscaled).mean()),
            "step_ok": bool(torch.allclose(weight.detach(), before - 0.1 * unscaled)),
        }
    )


def test_accelerate_amp_autocasts_scales_the_loss_and_unscales_the_step_on_two_gloo_workers(ray_local, tmp_path):
    result = TorchTrainer(
        amp_loop,
        torch_config=TorchConfig(backend="gloo"),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="amp", storage_path=str(tmp_path)),
    ).fit()
    metrics = result.metrics
    assert metrics["wrapped"] == "DistributedDataParallel"
    assert metrics["output_dtype"] == "torch.bfloat16"  # the forward ran under CPU autocast
    assert metrics["scale"] == 2.0**16  # GradScaler's first scale, no overflow
    assert metrics["grad_ratio"] == metrics["scale"]
    assert metrics["step_ok"]


def test_without_amp_the_helpers_train_as_plain_torch(in_worker):
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(3, 1))
    optimizer = prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.5))
    loss = model(torch.ones(2, 3)).pow(2).mean()
    backward(loss)
    grad = model.weight.grad.detach().clone()
    before = model.weight.detach().clone()
    optimizer.step()
    assert optimizer.scaler is None
    assert loss.dtype == torch.float32
    assert torch.allclose(model.weight, before - 0.5 * grad)
    # The wrapper shows the wrapped optimizer's state, so schedulers and checkpoints see it.
    assert optimizer.param_groups is optimizer.optimizer.param_groups
    assert optimizer.state_dict()["param_groups"][0]["lr"] == 0.5


def test_accelerate_twice_raises_as_ray_does(in_worker):
    accelerate(amp=False)
    with pytest.raises(RuntimeError, match="already called"):
        accelerate(amp=True)


@pytest.mark.parametrize(
    "first",
    [
        lambda: prepare_model(torch.nn.Linear(2, 1)),
        lambda: prepare_data_loader(torch.utils.data.DataLoader(list(range(4)))),
        lambda: prepare_optimizer(torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)),
    ],
    ids=["prepare_model", "prepare_data_loader", "prepare_optimizer"],
)
def test_accelerate_after_a_prepare_helper_raises(in_worker, first):
    first()
    with pytest.raises(RuntimeError, match="call it once, before all of them"):
        accelerate(amp=True)


def test_accelerate_outside_a_worker_or_with_a_non_bool_is_refused(in_worker):
    with pytest.raises(TypeError, match=r"accelerate\(amp='yes'\)"):
        accelerate(amp="yes")
    _set_context(None)
    with pytest.raises(RuntimeError, match="only inside train_loop_per_worker"):
        accelerate(amp=True)


def test_an_amp_model_pickles_with_its_plain_forward(in_worker):
    accelerate(amp=True)
    model = prepare_model(torch.nn.Linear(2, 1))
    assert model(torch.ones(1, 2)).dtype == torch.bfloat16
    loaded = pickle.loads(pickle.dumps(model))
    assert loaded(torch.ones(1, 2)).dtype == torch.float32


# -- TorchCheckpoint --------------------------------------------------------------------------


def test_torch_checkpoint_from_a_ddp_state_dict_loads_into_a_plain_model(tmp_path):
    torch.manual_seed(0)
    source = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    ddp_style = collections.OrderedDict(("module." + k, v) for k, v in source.state_dict().items())
    checkpoint = TorchCheckpoint.from_state_dict(ddp_style, preprocessor={"scale": 2.0})
    assert isinstance(checkpoint, trainers.Checkpoint)
    assert checkpoint.get_preprocessor() == {"scale": 2.0}
    loaded = checkpoint.get_model(torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1)))
    x = torch.randn(4, 3)
    assert torch.equal(loaded(x), source(x))
    with pytest.raises(ValueError, match=r"pass a freshly built module"):
        checkpoint.get_model()


def test_torch_checkpoint_from_model_and_a_missing_file():
    model = torch.nn.Linear(2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        checkpoint = TorchCheckpoint.from_model(model)
    assert TorchCheckpoint.MODEL_FILENAME == "model.pt"
    assert torch.equal(checkpoint.get_model().weight, model.weight)
    os.remove(os.path.join(checkpoint.path, "model.pt"))
    with pytest.raises(FileNotFoundError, match=r"has no 'model.pt'"):
        TorchCheckpoint(checkpoint.path).get_model()


# -- XGBoost and LightGBM checkpoints, from the trainers' own callbacks ------------------------


def _frames():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 3))
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "y": (x[:, 0] + x[:, 1] > 0).astype(float)})


def test_xgboost_trainer_checkpoints_load_with_xgboost_checkpoint(ray_local, tmp_path):
    import ray.data
    import xgboost

    from trainers.xgboost import RayTrainReportCallback, XGBoostCheckpoint, XGBoostTrainer

    result = XGBoostTrainer(
        datasets={"train": ray.data.from_pandas(_frames())},
        label_column="y",
        params={"objective": "binary:logistic"},
        num_boost_round=3,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="xgb", storage_path=str(tmp_path)),
    ).fit()
    assert RayTrainReportCallback.CHECKPOINT_NAME == "model.ubj"
    checkpoint = XGBoostCheckpoint(result.checkpoint.path, result.checkpoint.filesystem)
    assert checkpoint.get_model().num_boosted_rounds() == 3
    assert RayTrainReportCallback.get_model(result.checkpoint).num_boosted_rounds() == 3
    with pytest.raises(DeprecationWarning, match=r"RayTrainReportCallback.get_model\(checkpoint\)"):
        XGBoostTrainer.get_model(result.checkpoint)

    # from_model writes Ray's file name into the folder given, and keeps the preprocessor.
    folder = tmp_path / "mine"
    folder.mkdir()
    mine = XGBoostCheckpoint.from_model(checkpoint.get_model(), path=folder, preprocessor=[1, 2])
    assert (folder / XGBoostCheckpoint.MODEL_FILENAME).is_file() and XGBoostCheckpoint.MODEL_FILENAME == "model.json"
    assert isinstance(mine.get_model(), xgboost.Booster) and mine.get_preprocessor() == [1, 2]
    with pytest.raises(ValueError, match=r"from_model\(path='/no/such/folder'\): must be an existing folder"):
        XGBoostCheckpoint.from_model(mine.get_model(), path="/no/such/folder")


def test_lightgbm_trainer_checkpoints_load_with_lightgbm_checkpoint(ray_local, tmp_path):
    import ray.data

    from trainers.lightgbm import LightGBMCheckpoint, LightGBMTrainer, RayTrainReportCallback

    result = LightGBMTrainer(
        datasets={"train": ray.data.from_pandas(_frames())},
        label_column="y",
        params={"objective": "binary", "verbose": -1},
        num_boost_round=3,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="lgb", storage_path=str(tmp_path)),
    ).fit()
    assert RayTrainReportCallback.CHECKPOINT_NAME == LightGBMCheckpoint.MODEL_FILENAME == "model.txt"
    checkpoint = LightGBMCheckpoint.from_directory(result.checkpoint.path)
    assert checkpoint.get_model().current_iteration() == 3
    with pytest.raises(DeprecationWarning, match=r"RayTrainReportCallback.get_model\(checkpoint\)"):
        LightGBMTrainer.get_model(result.checkpoint)
    again = LightGBMCheckpoint.from_model(checkpoint.get_model())
    assert again.get_model().current_iteration() == 3 and again.get_preprocessor() is None


def test_normalize_pandas_for_lightgbm_makes_arrow_columns_acceptable():
    import lightgbm

    from trainers.lightgbm import normalize_pandas_for_lightgbm

    frame = pd.DataFrame(
        {
            "i": pd.array([1, 2, None, 4] * 5, dtype=pd.ArrowDtype(pa.int32())),
            "u": pd.array([1, 2, 3, 4] * 5, dtype=pd.ArrowDtype(pa.uint8())),
            "b": pd.array([True, False] * 10, dtype=pd.ArrowDtype(pa.bool_())),
            "f": np.arange(20.0),
            "s": pd.array(["x"] * 20, dtype=pd.ArrowDtype(pa.string())),
        }
    )
    with pytest.raises(ValueError, match="pandas dtypes must be int, float or bool"):
        lightgbm.Dataset(frame.drop(columns="s"), label=np.arange(20) % 2, params={"verbose": -1}).construct()
    normal = normalize_pandas_for_lightgbm(frame)
    assert {c: str(t) for c, t in normal.dtypes.items()} == {
        "i": "Int32",
        "u": "UInt8",
        "b": "boolean",
        "f": "float64",
        "s": "string[pyarrow]",
    }
    assert np.shares_memory(normal["f"].to_numpy(), frame["f"].to_numpy())  # NumPy columns are not copied
    lightgbm.Dataset(normal.drop(columns="s"), label=np.arange(20) % 2, params={"verbose": -1}).construct()


# -- Lightning --------------------------------------------------------------------------------


def test_lightning_report_callback_takes_rays_arguments():
    from trainers import CheckpointUploadMode
    from trainers.lightning import RayTrainReportCallback

    default = RayTrainReportCallback()
    assert default.checkpoint_upload_mode is CheckpointUploadMode.SYNC and default.validation is False
    validating = RayTrainReportCallback(CheckpointUploadMode.ASYNC, True)
    assert validating.checkpoint_upload_mode is CheckpointUploadMode.ASYNC and validating.validation is True
    with pytest.raises(ValueError, match=r"checkpoint_upload_mode='sync'\): must be None or one of"):
        RayTrainReportCallback(checkpoint_upload_mode="sync")


def lightning_validated_loop(config):
    """Two Lightning epochs, each checkpoint reported with validation=True by the callback."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    import integration_loops
    from trainers.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback

    x, y = integration_loops.regression_data()
    trainer = pl.Trainer(
        max_epochs=2,
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback(validation=True)],
        accelerator="cpu",
        devices="auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(
        integration_loops.lightning_regressor()(), train_dataloaders=DataLoader(TensorDataset(x, y), batch_size=32)
    )


def epoch_in_checkpoint(checkpoint) -> dict:
    """The validation function: reads Lightning's file in the reported checkpoint."""
    from trainers.lightning import RayTrainReportCallback

    with checkpoint.as_directory() as folder:
        saved = torch.load(os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME), weights_only=False)
    return {"validated_epoch": saved["epoch"]}


def test_lightning_report_callback_validation_validates_each_epochs_checkpoint(ray_local, tmp_path):
    from trainers import ValidationConfig

    result = TorchTrainer(
        lightning_validated_loop,
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name="lightning-validated", storage_path=str(tmp_path)),
        validation_config=ValidationConfig(epoch_in_checkpoint, ray_remote_kwargs={"num_cpus": 0}),
    ).fit()
    assert sorted((m["epoch"], m["validated_epoch"]) for _, m in result.best_checkpoints) == [(0, 0), (1, 1)]


def test_ray_deepspeed_strategy_without_deepspeed_names_the_install(monkeypatch):
    from lightning.pytorch.strategies import DeepSpeedStrategy

    from trainers.lightning import RayDeepSpeedStrategy

    assert issubclass(RayDeepSpeedStrategy, DeepSpeedStrategy)
    # The test install has deepspeed; None in sys.modules makes its import fail as if it had not.
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(ImportError, match=r"pip install 'flowtrain\[deepspeed\]'") as caught:
        RayDeepSpeedStrategy(stage=3)
    assert isinstance(caught.value, MissingExtraError)


# -- TorchXLAConfig ---------------------------------------------------------------------------


def test_torch_xla_config_without_torch_xla_says_what_to_install():
    from trainers.torch.xla import TorchXLAConfig

    with pytest.raises(ImportError, match=r"'torch_xla'.*pip install torch-xla==<your torch version>.*torch-neuronx"):
        TorchXLAConfig()


def test_torch_xla_config_takes_rays_parameters(tmp_path, monkeypatch):
    from trainers.torch.xla import TorchXLABackend, TorchXLAConfig

    # A stand-in torch_xla package on the path: the config only checks that torch_xla is installed.
    (tmp_path / "torch_xla").mkdir()
    (tmp_path / "torch_xla" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = TorchXLAConfig()
    assert (config.backend, config.init_method, config.timeout_s, config.neuron_parallel_compile) == (
        None,
        "env",
        1800,
        False,
    )
    positional = TorchXLAConfig(None, "env", 60, True)  # Ray's order
    assert positional.timeout_s == 60 and positional.neuron_parallel_compile is True
    assert isinstance(config, TorchConfig) and config.backend_cls is TorchXLABackend
    with pytest.raises(ValueError, match=r"neuron_parallel_compile='yes': must be True or False"):
        TorchXLAConfig(neuron_parallel_compile="yes")
    with pytest.raises(ValueError, match="timeout_s"):
        TorchXLAConfig(timeout_s=0)


FAKE_XLA_BACKEND = """
# A stand-in for torch_xla's backend registration: an "xla" process group that is really gloo.
import torch.distributed as dist

def _gloo(store, rank, size, timeout):
    return dist.ProcessGroupGloo(store, rank, size, timeout)

if "xla" not in dist.Backend.backend_list:
    dist.Backend.register_backend("xla", _gloo, devices=["cpu"])
"""


def fake_torch_xla(folder) -> str:
    """A fake ``torch_xla`` package in ``folder`` whose ``xla`` backend is gloo; returns the folder."""
    for package in ("torch_xla", "torch_xla/core", "torch_xla/distributed"):
        (folder / package).mkdir(parents=True)
        (folder / package / "__init__.py").write_text("")
    (folder / "torch_xla/core/xla_model.py").write_text("")
    (folder / "torch_xla/distributed/xla_backend.py").write_text(FAKE_XLA_BACKEND)
    return str(folder)


def test_torch_xla_backend_sets_rays_environment_and_joins_an_xla_group(ray_local, tmp_path, monkeypatch):
    import deepspeed_loops
    from trainers.torch.xla import TorchXLAConfig

    fake = fake_torch_xla(tmp_path / "fake")
    monkeypatch.syspath_prepend(fake)
    workers_path = os.pathsep.join([fake, os.environ["PYTHONPATH"]])
    result = TorchTrainer(
        deepspeed_loops.xla_env_loop,
        torch_config=TorchXLAConfig(init_method="tcp", neuron_parallel_compile=False),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            name="xla",
            storage_path=str(tmp_path / "runs"),
            worker_runtime_env={"env_vars": {"PYTHONPATH": workers_path, "PJRT_DEVICE": "CPU"}},
        ),
    ).fit()
    seen = result.return_value  # rank 0's
    assert seen["backend"] == "xla" and seen["sum"] == 3.0  # both ranks in one xla group
    env = seen["env"]
    assert env["RANK"] == env["LOCAL_RANK"] == env["ROLE_RANK"] == env["ROLE_WORLD_RANK"] == "0"
    assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "2" and env["GROUP_WORLD_SIZE"] == "1"
    assert env["MASTER_ADDR"] and env["MASTER_PORT"].isdigit() and len(env["TORCHELASTIC_RUN_ID"]) == 32
    assert (env["FI_PROVIDER"], env["FI_EFA_USE_DEVICE_RDMA"], env["FI_EFA_FORK_SAFE"]) == ("efa", "1", "1")
    assert env["XLA_TRANSFER_SEED_ASYNC"] == env["NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["NEURON_PARALLEL_COMPILE"] is None  # only with neuron_parallel_compile=True
    assert env["PJRT_DEVICE"] == "CPU"  # the user's choice is kept


def test_torch_xla_env_decisions():
    from trainers.torch.xla.config import _xla_env

    master = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"}
    compile_env = _xla_env(8, 2, master, extract_graphs=True, neuron=True)
    assert compile_env["GROUP_WORLD_SIZE"] == "2" and compile_env["ROLE_WORLD_SIZE"] == "8"
    assert compile_env["PJRT_DEVICE"] == "NEURON"
    assert {
        k: compile_env[k]
        for k in ("NEURON_PARALLEL_COMPILE", "NEURON_EXTRACT_GRAPHS_ONLY", "NEURON_FALL_BACK_TO_NULL_NEFF")
    } == {"NEURON_PARALLEL_COMPILE": "1", "NEURON_EXTRACT_GRAPHS_ONLY": "1", "NEURON_FALL_BACK_TO_NULL_NEFF": "1"}
    plain = _xla_env(2, 1, master, extract_graphs=False)
    assert "PJRT_DEVICE" not in plain and "NEURON_PARALLEL_COMPILE" not in plain


def test_torch_xla_config_refuses_another_backend(tmp_path, monkeypatch):
    from trainers.torch.xla import TorchXLAConfig

    monkeypatch.syspath_prepend(fake_torch_xla(tmp_path))
    assert TorchXLAConfig(backend="xla").backend == "xla"
    with pytest.raises(ValueError, match=r"TorchXLAConfig.backend='gloo': the process group is always 'xla'"):
        TorchXLAConfig(backend="gloo")
    with pytest.raises(ValueError, match=r"TorchXLAConfig.init_method='xla'"):
        TorchXLAConfig(init_method="xla")
