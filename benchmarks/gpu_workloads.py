"""The checks of ``benchmarks.gpu_check`` and the training functions they run on the workers.

Each ``check_*`` function takes a :class:`Setup`, runs one or more real ``fit()`` calls, and
returns a dict of what it saw; it raises :class:`CheckFailed` when something is wrong and
:class:`Skipped` when the check cannot apply here. Workers write what they saw (one JSON file
per rank) into a folder of the driver's, so the driver can compare every rank, not only rank 0.

The same checks run on CPU workers with gloo (``--allow-cpu``, for testing the checks without a
GPU): only what needs CUDA changes (the nccl backend, the GPU counts, float16 autocast).
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import math
import os
import pathlib
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch


class CheckFailed(Exception):
    """A check ran and found something wrong; the message says what, ``details`` what it measured."""

    def __init__(self, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


class Skipped(Exception):
    """A check that cannot run here (e.g. DeepSpeed not installed); not a failure."""


@dataclasses.dataclass(frozen=True)
class Setup:
    """Where and how the checks run."""

    #: Train on CUDA GPUs (False only with ``--allow-cpu``).
    use_gpu: bool
    #: GPUs on this machine (0 on CPU).
    num_gpus: int
    #: A scratch folder for run storage and the workers' rank files.
    workdir: str
    #: Seconds each implementation trains in the throughput comparison.
    seconds: float
    #: Workers on CPU (``--allow-cpu``): 2 so that DDP and FSDP really wrap; 1 takes the path a
    #: one-GPU machine takes.
    cpu_workers: int = 2

    @property
    def num_workers(self) -> int:
        """One worker per GPU; ``cpu_workers`` without GPUs."""
        return self.num_gpus if self.use_gpu else self.cpu_workers

    @property
    def device_type(self) -> str:
        """ "cuda" or "cpu": where the workers train."""
        return "cuda" if self.use_gpu else "cpu"

    @property
    def backend(self) -> str:
        """The process-group backend a one-worker-per-device run uses."""
        return "nccl" if self.use_gpu else "gloo"

    def folder(self, name: str) -> str:
        """A fresh folder under the work folder."""
        return tempfile.mkdtemp(prefix=f"{name}-", dir=self.workdir)


# -- small shared pieces ----------------------------------------------------------------------

NUM_ROWS = 64
GLOBAL_BATCH = 16
IN_FEATURES = 8


def mlp(hidden: int = 32) -> torch.nn.Module:
    """A small MLP with the same initial weights in every process (seeded)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN_FEATURES, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 1))


def regression_data() -> tuple[torch.Tensor, torch.Tensor]:
    """y = x @ w + noise, seeded, on the CPU: every rank builds the same tensors."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(NUM_ROWS, IN_FEATURES, generator=generator)
    w = torch.linspace(-2.0, 2.0, IN_FEATURES).unsqueeze(1)
    return x, x @ w + 0.1 * torch.randn(NUM_ROWS, 1, generator=generator)


def global_batch(step: int, rank: int, world: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of global batch ``step`` (the whole batch when ``world`` is 1), on ``device``."""
    x, y = regression_data()
    start = (step * GLOBAL_BATCH) % NUM_ROWS
    xb, yb = x[start : start + GLOBAL_BATCH][rank::world], y[start : start + GLOBAL_BATCH][rank::world]
    return xb.to(device), yb.to(device)


def world_mean(value: torch.Tensor) -> float:
    """The mean of a scalar over all ranks of the process group (itself without one)."""
    import torch.distributed as dist

    value = value.detach().float().clone()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(value)
        value /= dist.get_world_size()
    return value.item()


def reference_losses(device: torch.device, steps: int, lr: float) -> list[float]:
    """Plain training on the whole global batch, no process group: what data parallelism must match."""
    model = mlp().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.5)
    losses = []
    for step in range(steps):
        xb, yb = global_batch(step, 0, 1, device)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def digest(state: dict[str, torch.Tensor]) -> str:
    """A fingerprint of a state dict's tensors (names, dtypes and exact bytes), wherever they live."""
    h = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        h.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        h.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def write_rank_file(folder: str, rank: int, info: dict) -> None:
    """What rank ``rank`` saw, as ``folder/rank<N>.json`` (read back by ``read_rank_files``)."""
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(info, f)


def read_rank_files(folder: str, world: int) -> list[dict]:
    """Every rank's file, in rank order; fails the check when one is missing."""
    files = sorted(glob.glob(os.path.join(folder, "rank*.json")))
    if len(files) != world:
        raise CheckFailed(f"expected {world} rank file(s) in {folder}, found {len(files)}")
    infos = [json.loads(pathlib.Path(path).read_text()) for path in files]
    return sorted(infos, key=lambda info: info["rank"])


def expect(condition: bool, message: str) -> None:
    """Fail the check with ``message`` unless ``condition`` holds."""
    if not condition:
        raise CheckFailed(message)


def flowtrain_fit(loop: Callable, config: dict, setup: Setup, name: str, **scaling: Any):
    """``trainers.torch.TorchTrainer(...).fit()`` with this setup's GPUs and a fresh storage folder."""
    from trainers import RunConfig, ScalingConfig
    from trainers.torch import TorchTrainer

    torch_config = scaling.pop("torch_config", None)
    run_extra = scaling.pop("run_config", {})
    scaling.setdefault("num_workers", setup.num_workers)
    scaling.setdefault("use_gpu", setup.use_gpu)
    return TorchTrainer(
        loop,
        train_loop_config=config,
        torch_config=torch_config,
        scaling_config=ScalingConfig(**scaling),
        run_config=RunConfig(name=name, storage_path=setup.folder("storage"), **run_extra),
    ).fit()


# -- a failed attempt's NCCL group aborted and re-formed in the same processes ------------------


def reform_loop(config: dict) -> dict:
    """Attempt 1: an all_reduce, then a long GPU kernel and another all_reduce queued, and an
    exception while they are in flight (rank 0 only). Attempt 2 (the same processes, kept): the
    group is back, an all_reduce sums on the GPU, and CUDA runs a kernel."""
    import torch.distributed as dist

    from trainers import get_checkpoint, get_context, report

    context = get_context()
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if config["use_gpu"] else torch.device("cpu")
    ones = torch.ones(4, device=device)
    dist.all_reduce(ones)
    report({"pid": os.getpid(), "sum": float(ones[0].item()), "backend": str(dist.get_backend())})
    # Every rank decides alike from the attempt (a marker file one rank writes would race the
    # others' look at it: a rank that saw it would skip the in-flight collective and hang its peer).
    if context.get_attempt() == 1 and get_checkpoint() is None:
        if context.get_world_rank() == 0:
            open(config["marker"], "w").close()
        if device.type == "cuda":
            torch.cuda._sleep(2_000_000_000)  # about a second of GPU time, queued ahead of the collective
        dist.all_reduce(torch.ones(4, device=device), async_op=True)
        if context.get_world_rank() == 0:
            raise RuntimeError("planted failure with an NCCL collective in flight")
    summed = torch.ones(4, device=device)
    dist.all_reduce(summed)
    report({"pid": os.getpid(), "sum": float(summed[0].item()), "backend": str(dist.get_backend())})
    return {"pid": os.getpid(), "sum": float(summed[0].item()), "backend": str(dist.get_backend())}


def check_nccl_reform(setup: Setup) -> dict:
    """A failed attempt's NCCL group is aborted with a collective in flight and re-formed in the
    same worker processes (issue 46): the same pids, the sum right, CUDA usable after."""
    from trainers import FailureConfig

    marker = os.path.join(setup.folder("reform"), "failed-once")
    pids: dict[int, list[int]] = {}

    from trainers import UserCallback

    class Pids(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            pids.setdefault(run_context.attempt, [m["pid"] for m in metrics])

    started = time.monotonic()
    result = flowtrain_fit(
        reform_loop,
        {"marker": marker, "use_gpu": setup.use_gpu},
        setup,
        "nccl-reform",
        run_config={"failure_config": FailureConfig(max_failures=1), "callbacks": [Pids()]},
    )
    with open(os.path.join(result.path, "run.json")) as f:
        restarts = json.load(f)["restarts"]
    found = {
        "workers": setup.num_workers,
        "backend": result.return_value["backend"],
        "pids_by_attempt": pids,
        "restarts": restarts,
        "seconds": time.monotonic() - started,
    }
    expect(os.path.exists(marker), "the planted failure did not happen")
    expect(len(restarts) == 1 and restarts[0]["full_restart"] is None, f"not re-formed in place: {restarts}")
    expect(restarts[0]["kept"] == list(range(setup.num_workers)), f"not every rank was kept: {restarts}")
    expect(result.return_value["sum"] == setup.num_workers, f"all_reduce after re-forming: {result.return_value}")
    expect(pids.get(1) == pids.get(2), f"the workers' processes changed: {pids}")
    return found


# -- a rank that runs out of CUDA memory (issue 48) ---------------------------------------------


def oom_loop(config: dict) -> None:
    """The last rank allocates more than its device holds (on a CPU run: raises CUDA's error itself)."""
    from trainers import get_context, report

    report({"step": 0})
    context = get_context()
    if context.get_world_rank() == context.get_world_size() - 1:
        if config["use_gpu"]:
            held = []
            while True:  # until CUDA refuses: a real out-of-memory error, from the allocator
                held.append(torch.empty(2**30, dtype=torch.uint8, device=f"cuda:{torch.cuda.current_device()}"))
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB (faked on a CPU run)")
    report({"step": 1})


def check_cuda_oom(setup: Setup) -> dict:
    """A rank out of CUDA memory fails the run naming the rank, the step and its memory, and leaves
    a memory summary (with ``torch.cuda.memory_summary()`` on a GPU) in the run's health folder."""
    from trainers.errors import TrainingFailedError

    last = setup.num_workers - 1  # the rank that runs out: rank 0 on a one-GPU machine
    try:
        flowtrain_fit(oom_loop, {"use_gpu": setup.use_gpu}, setup, "cuda-oom")
    except TrainingFailedError as error:
        failures = getattr(error, "failures", {})
        failure = failures.get(last)
        expect(failure is not None and failure.out_of_memory, f"not named as out of memory: {error}")
        expect(failure.reports == 1, f"the step is wrong: {failure.reports} report(s), expected 1")
        summary = failure.memory_summary or ""
        expect(os.path.exists(summary), f"no memory summary at {summary!r}")
        with open(summary) as text:
            body = text.read()
        if setup.use_gpu:
            expect(failure.memory.cuda_allocated_bytes, f"no CUDA figures in {failure.memory}")
            expect("PyTorch CUDA memory summary" in body, "the summary lacks torch.cuda.memory_summary()")
        return {"message": failure.describe(), "memory": failure.memory.to_json(), "summary": summary}
    raise CheckFailed(f"the run did not fail although rank {last} ran out of memory")


# -- 1 and 2: process group, placement -------------------------------------------------------


def placement_loop(config: dict) -> None:
    """One all_reduce, ``prepare_model`` / ``prepare_data_loader`` and one training step; each
    rank writes what device everything landed on."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    import trainers
    from trainers.torch import get_device, get_devices, prepare_data_loader, prepare_model

    context = trainers.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = get_device()
    summed = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(summed)

    model = prepare_model(mlp())
    x, y = regression_data()
    loader = prepare_data_loader(DataLoader(TensorDataset(x, y), batch_size=8))
    xb, yb = next(iter(loader))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    optimizer.step()
    trainers.report({"loss": world_mean(loss)})
    write_rank_file(
        config["out"],
        rank,
        {
            "rank": rank,
            "world": world,
            "backend": dist.get_backend(),
            "device": str(device),
            "devices": [str(d) for d in get_devices()],
            "sum": summed.tolist(),
            "sum_device": str(summed.device),
            "param_devices": sorted({str(p.device) for p in model.parameters()}),
            "batch_device": str(xb.device),
            "wrapper": type(model).__name__,
            "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "accelerator_ids": list(context.accelerator_ids),
            "current_device": torch.cuda.current_device() if device.type == "cuda" else None,
            "loss": loss.item(),
        },
    )


def _run_placement(setup: Setup, name: str, world: int, backend: str, **scaling: Any) -> list[dict]:
    out = setup.folder(name)
    flowtrain_fit(placement_loop, {"out": out}, setup, name, num_workers=world, **scaling)
    infos = read_rank_files(out, world)
    expected_sum = world * (world + 1) / 2
    for info in infos:
        where = f"rank {info['rank']}"
        expect(info["backend"] == backend, f"{where}: process group backend {info['backend']!r}, expected {backend!r}")
        expect(info["sum"] == [expected_sum] * 4, f"{where}: all_reduce gave {info['sum']}, expected {expected_sum}")
        expect(info["sum_device"] == info["device"], f"{where}: the all_reduce tensor is on {info['sum_device']}")
        expect(
            info["device"].startswith(setup.device_type),
            f"{where}: get_device() is {info['device']}, expected {setup.device_type}",
        )
        expect(
            info["param_devices"] == [info["device"]],
            f"{where}: parameters on {info['param_devices']}, get_device() is {info['device']}",
        )
        expect(info["batch_device"] == info["device"], f"{where}: prepare_data_loader batch on {info['batch_device']}")
        expect(math.isfinite(info["loss"]), f"{where}: loss {info['loss']}")
        expected_wrapper = "DistributedDataParallel" if world > 1 else "Sequential"
        expect(
            info["wrapper"] == expected_wrapper,
            f"{where}: prepare_model gave {info['wrapper']}, expected {expected_wrapper}",
        )
    return infos


def _physical_gpu(info: dict) -> str:
    """The GPU a rank trains on, as the machine numbers it (its CUDA_VISIBLE_DEVICES entry)."""
    index = int(info["device"].split(":")[1])
    visible = info["visible_devices"]
    return visible.split(",")[index] if visible else str(index)  # unset: every GPU is visible


def check_nccl(setup: Setup) -> dict:
    """TorchTrainer(use_gpu=True), one worker per GPU: the nccl group is up and all_reduce sums on the GPUs."""
    infos = _run_placement(setup, "nccl", setup.num_workers, setup.backend)
    summary = {"workers": len(infos), "backend": infos[0]["backend"], "devices": [i["device"] for i in infos]}
    if setup.use_gpu:
        gpus = [_physical_gpu(info) for info in infos]
        expect(len(set(gpus)) == len(gpus), f"two workers share a GPU: {gpus}")
        summary["physical_gpus"] = gpus
    return summary


def check_shared_gpu_gloo(setup: Setup) -> dict:
    """Two workers with half a GPU each on one GPU, over gloo (nccl refuses two ranks on one GPU)."""
    from trainers.torch import TorchConfig

    if setup.use_gpu and setup.num_gpus != 1:
        raise Skipped(f"runs on a machine with exactly one GPU (this one has {setup.num_gpus})")
    resources = {"GPU": 0.5} if setup.use_gpu else {"CPU": 1}
    infos = _run_placement(
        setup, "gloo-half-gpu", 2, "gloo", resources_per_worker=resources, torch_config=TorchConfig(backend="gloo")
    )
    devices = [info["device"] for info in infos]
    if setup.use_gpu:
        expect(devices == ["cuda:0", "cuda:0"], f"the two workers train on {devices}, expected cuda:0 for both")
        gpus = {_physical_gpu(info) for info in infos}
        expect(len(gpus) == 1, f"the two half-GPU workers are on different GPUs: {gpus}")
    return {"workers": 2, "backend": "gloo", "devices": devices, "resources_per_worker": resources}


def check_placement(setup: Setup) -> dict:
    """get_device(), prepare_model and prepare_data_loader put everything on the worker's own GPU."""
    infos = _run_placement(setup, "placement", setup.num_workers, setup.backend)
    for info in infos:
        device_index = int(info["device"].split(":")[1]) if ":" in info["device"] else None
        # TorchConfig's train_func_context makes the worker's GPU its current device, as Ray Train does.
        expect(
            info["current_device"] is None or info["current_device"] == device_index,
            f"rank {info['rank']}: torch.cuda.current_device() is {info['current_device']}, get_device() is {info['device']}",
        )
    return {
        "devices": [info["device"] for info in infos],
        "param_devices": [info["param_devices"] for info in infos],
        "visible_devices": [info["visible_devices"] for info in infos],
        "accelerator_ids": [info["accelerator_ids"] for info in infos],
    }


# -- 3: a checkpoint of GPU tensors, a SIGKILL, a resume ---------------------------------------

CKPT_STEPS = 6
KILL_AT = 3


def resume_loop(config: dict) -> dict | None:
    """Trains ``steps`` steps, reporting a checkpoint of the model and optimizer (GPU tensors, as
    they are) every step; the last rank SIGKILLs itself once at step ``kill_at``. A restarted
    worker loads the latest checkpoint onto its device and carries on."""
    import trainers
    from trainers.torch import get_device, prepare_model

    context = trainers.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = get_device()
    model = prepare_model(mlp())
    plain = getattr(model, "module", model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    start, resumed = 0, None
    checkpoint = trainers.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"), map_location=device)
        loaded_devices = sorted({str(t.device) for t in state["model"].values()})
        plain.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"] + 1
        resumed = {"from_step": state["step"], "digest": digest(plain.state_dict()), "loaded_devices": loaded_devices}
    for step in range(start, config["steps"]):
        if step == config["kill_at"] and rank == world - 1 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        xb, yb = global_batch(step, rank, world, device)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
        metrics = {"step": step, "loss": world_mean(loss), "digest": digest(plain.state_dict())}
        with tempfile.TemporaryDirectory() as folder:
            if rank == 0:
                torch.save(
                    {"model": plain.state_dict(), "optimizer": optimizer.state_dict(), "step": step},
                    os.path.join(folder, "state.pt"),
                )
            trainers.report(metrics, checkpoint=trainers.Checkpoint.from_directory(folder) if rank == 0 else None)
    return resumed


def check_checkpoint_resume(setup: Setup) -> dict:
    """A checkpoint of GPU tensors is saved, a worker is SIGKILLed, the run resumes from it with
    the very weights that were saved, and every step is reported once."""
    from trainers import FailureConfig

    marker = os.path.join(setup.folder("resume"), "killed")
    result = flowtrain_fit(
        resume_loop,
        {"steps": CKPT_STEPS, "kill_at": KILL_AT, "marker": marker},
        setup,
        "resume",
        run_config={"failure_config": FailureConfig(max_failures=1)},
    )
    expect(os.path.exists(marker), "the worker never killed itself (no marker file)")
    history = result.metrics_dataframe
    steps = [int(s) for s in history["step"]]
    expect(steps == list(range(CKPT_STEPS)), f"reported steps {steps}, expected each of 0..{CKPT_STEPS - 1} once")
    resumed = result.return_value
    expect(resumed is not None, "the final attempt did not start from a checkpoint")
    # The killed rank's last report can die with it (queued microseconds before the kill).
    expect(
        resumed["from_step"] in (KILL_AT - 1, KILL_AT - 2),
        f"resumed from step {resumed['from_step']}, expected {KILL_AT - 1} (or {KILL_AT - 2})",
    )
    saved = history.loc[history["step"] == resumed["from_step"], "digest"].iloc[-1]
    expect(resumed["digest"] == saved, f"the resumed weights differ from those saved at step {resumed['from_step']}")
    expect(
        all(d.startswith(setup.device_type) for d in resumed["loaded_devices"]),
        f"restored tensors on {resumed['loaded_devices']}",
    )

    # The checkpoint file itself holds tensors of the device they were trained on, and the
    # last step's weights.
    with result.checkpoint.as_directory() as folder:
        state = torch.load(os.path.join(folder, "state.pt"), map_location=None if setup.use_gpu else "cpu")
    stored_devices = sorted({str(t.device) for t in state["model"].values()})
    expect(
        all(d.startswith(setup.device_type) for d in stored_devices),
        f"the checkpoint stores tensors on {stored_devices}",
    )
    expect(
        digest(state["model"]) == history["digest"].iloc[-1],
        "the last checkpoint's weights differ from the last step's",
    )
    return {
        "resumed_from_step": resumed["from_step"],
        "restored_on": resumed["loaded_devices"],
        "stored_on": stored_devices,
        "steps": steps,
    }


# -- 4: FSDP and AMP ---------------------------------------------------------------------------

SHARD_STEPS = 8
SHARD_LR = 0.05
# Same data and seed; sharded and plain training differ only in the order of float32 sums.
FP32_TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def _fsdp_variants(device: torch.device) -> dict[str, dict]:
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy

    return {
        "full_shard": {},
        "shard_grad_op": {"sharding_strategy": ShardingStrategy.SHARD_GRAD_OP},
        "bf16": {"mixed_precision": MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)},
        "cpu_offload": {"cpu_offload": CPUOffload(offload_params=True)},
    }


def fsdp_loop(config: dict) -> dict:
    """Each FSDP variant trains ``steps`` steps from the same start; rank 0 returns the global losses,
    where the sharded parameters live and the output dtype, with plain training's losses beside them."""
    import trainers
    from trainers.torch import get_device, prepare_model
    from trainers.torch.fsdp_options import apply_fsdp, plan_fsdp

    context = trainers.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = get_device()
    found: dict[str, Any] = {"reference": reference_losses(device, SHARD_STEPS, SHARD_LR), "variants": {}}
    for name, kwargs in _fsdp_variants(device).items():
        if world > 1:
            model = prepare_model(mlp(), parallel_strategy="fsdp", parallel_strategy_kwargs=kwargs)
        else:
            # prepare_model shards nothing for a single worker; shard the way it would with more.
            model = apply_fsdp(mlp().to(device), plan_fsdp(dict(kwargs), device), device)
        optimizer = torch.optim.SGD(model.parameters(), lr=SHARD_LR, momentum=0.5)
        losses, out = [], None
        for step in range(SHARD_STEPS):
            xb, yb = global_batch(step, rank, world, device)
            optimizer.zero_grad()
            out = model(xb)
            loss = torch.nn.functional.mse_loss(out.float(), yb)
            loss.backward()
            optimizer.step()
            losses.append(world_mean(loss))
        parameter = next(model.parameters())
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        found["variants"][name] = {
            "losses": losses,
            "sharded": type(parameter).__name__ == "DTensor",
            "param_device": str(local.device),
            "output_dtype": str(out.dtype),
        }
    trainers.report({"done": 1})
    return found


def check_fsdp(setup: Setup) -> dict:
    """prepare_model(parallel_strategy="fsdp") variants (full shard, SHARD_GRAD_OP, bf16 mixed
    precision, CPU offload) train like plain training, with sharded parameters where they belong."""
    found = flowtrain_fit(fsdp_loop, {}, setup, "fsdp").return_value
    reference = torch.tensor(found["reference"])
    seen = {}
    for name, variant in found["variants"].items():
        losses = torch.tensor(variant["losses"])
        expect(variant["sharded"], f"{name}: parameters are not DTensors: fully_shard did not apply")
        expect(bool(torch.isfinite(losses).all()), f"{name}: losses {variant['losses']}")
        wanted = "cpu" if name == "cpu_offload" else setup.device_type
        expect(
            variant["param_device"].startswith(wanted),
            f"{name}: parameter shards on {variant['param_device']}, expected {wanted}",
        )
        if name == "bf16":
            expect(variant["output_dtype"] == "torch.bfloat16", f"bf16: forward output is {variant['output_dtype']}")
            expect(losses[-1] < 0.5 * losses[0], f"bf16: loss went from {losses[0]:.4f} to {losses[-1]:.4f}")
        else:
            expect(
                torch.allclose(losses, reference, **FP32_TOLERANCE),
                f"{name}: losses {variant['losses']} differ from plain training's {found['reference']}",
            )
        seen[name] = {
            "first_loss": variant["losses"][0],
            "last_loss": variant["losses"][-1],
            "param_device": variant["param_device"],
        }
    return {"reference_last_loss": found["reference"][-1], "variants": seen}


AMP_STEPS = 20


def amp_loop(config: dict) -> dict:
    """``mode="accelerate"``: flowtrain's AMP helpers (accelerate, prepare_optimizer, backward);
    ``mode="bf16"``: a prepare_model'd model under ``torch.autocast(dtype=torch.bfloat16)``."""
    import trainers
    from trainers.torch import accelerate, backward, get_device, prepare_model, prepare_optimizer

    context = trainers.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = get_device()
    helpers = config["mode"] == "accelerate"
    if helpers:
        accelerate(amp=True)
    model = prepare_model(mlp())
    optimizer = torch.optim.SGD(model.parameters(), lr=SHARD_LR)
    if helpers:
        optimizer = prepare_optimizer(optimizer)
    losses, out = [], None
    for step in range(AMP_STEPS):
        xb, yb = global_batch(step, rank, world, device)
        optimizer.zero_grad()
        if helpers:
            out = model(xb)
        else:
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                out = model(xb)
        loss = torch.nn.functional.mse_loss(out.float(), yb)
        backward(loss) if helpers else loss.backward()
        optimizer.step()
        losses.append(world_mean(loss))
    trainers.report({"loss": losses[-1]})
    scaler = getattr(optimizer, "scaler", None)
    return {
        "losses": losses,
        "output_dtype": str(out.dtype),
        "scale": scaler.get_scale() if scaler is not None else None,
    }


def check_amp(setup: Setup) -> dict:
    """Mixed precision: flowtrain's ``accelerate(amp=True)`` helpers (float16 and a GradScaler on
    GPUs, bfloat16 on CPUs) and bf16 autocast around a prepare_model'd model, both train."""
    seen = {}
    for mode, dtype in (
        ("accelerate", "torch.float16" if setup.use_gpu else "torch.bfloat16"),
        ("bf16", "torch.bfloat16"),
    ):
        found = flowtrain_fit(amp_loop, {"mode": mode}, setup, f"amp-{mode}").return_value
        losses = found["losses"]
        expect(found["output_dtype"] == dtype, f"{mode}: forward output is {found['output_dtype']}, expected {dtype}")
        expect(all(math.isfinite(v) for v in losses), f"{mode}: losses {losses}")
        expect(losses[-1] < 0.5 * losses[0], f"{mode}: loss went from {losses[0]:.4f} to {losses[-1]:.4f}")
        seen[mode] = {
            "output_dtype": found["output_dtype"],
            "first_loss": losses[0],
            "last_loss": losses[-1],
            "grad_scale": found["scale"],
        }
    return seen


# -- 5: DeepSpeed ZeRO-2 -----------------------------------------------------------------------


def zero2_loop(config: dict) -> dict:
    """DeepSpeed ZeRO stage 2 over the trainer's process group, with torch's SGD; rank 0 returns
    its global losses beside plain training's."""
    import deepspeed

    import trainers
    from trainers.torch import get_device

    context = trainers.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    device = get_device()
    reference = reference_losses(device, SHARD_STEPS, SHARD_LR)
    model = mlp()
    ds_config = {
        "train_batch_size": GLOBAL_BATCH,
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // world,
        "zero_optimization": {"stage": 2},
        "gradient_clipping": 0.0,  # DeepSpeed would clip to 1.0; plain training does not clip
        "zero_allow_untested_optimizer": True,  # torch's SGD: DeepSpeed's fused optimizers need compiled ops
    }
    optimizer = torch.optim.SGD(model.parameters(), lr=SHARD_LR, momentum=0.5)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
    losses = []
    for step in range(SHARD_STEPS):
        xb, yb = global_batch(step, rank, world, engine.device)
        loss = torch.nn.functional.mse_loss(engine(xb), yb)
        engine.backward(loss)
        engine.step()
        losses.append(world_mean(loss))
    param_device = str(next(engine.module.parameters()).device)
    engine.destroy()
    trainers.report({"loss": losses[-1]})
    return {
        "losses": losses,
        "reference": reference,
        "engine_device": str(engine.device),
        "param_device": param_device,
        "worker_device": str(device),
        "version": deepspeed.__version__,
    }


def check_deepspeed(setup: Setup) -> dict:
    """DeepSpeed ZeRO-2 in a TorchTrainer loop trains like plain training on the worker's GPU."""
    try:
        import deepspeed  # noqa: F401
    except Exception as error:  # noqa: BLE001 - not installed, or installed but broken for this torch
        raise Skipped(f"deepspeed does not import here ({type(error).__name__}: {error})") from None
    found = flowtrain_fit(zero2_loop, {}, setup, "zero2").return_value
    expect(
        found["param_device"].startswith(setup.device_type), f"DeepSpeed's parameters are on {found['param_device']}"
    )
    if setup.use_gpu:
        expect(
            found["engine_device"] == found["worker_device"],
            f"DeepSpeed trains on {found['engine_device']}, the worker's device is {found['worker_device']}",
        )
    losses, reference = torch.tensor(found["losses"]), torch.tensor(found["reference"])
    expect(
        torch.allclose(losses, reference, **FP32_TOLERANCE),
        f"ZeRO-2 losses {found['losses']} differ from plain training's {found['reference']}",
    )
    return {
        "deepspeed": found["version"],
        "device": found["engine_device"],
        "first_loss": found["losses"][0],
        "last_loss": found["losses"][-1],
    }


# -- 6: throughput: raw torch, flowtrain, ray.train on the same loop -------------------------

THROUGHPUT_WIDTH = {"cuda": 2048, "cpu": 128}
THROUGHPUT_BATCH = {"cuda": 1024, "cpu": 64}
THROUGHPUT_LAYERS = 4
WARMUP_STEPS = 20


def throughput_work(rank: int, world: int, device: torch.device, seconds: float, out: str) -> None:
    """The loop every implementation runs: an MLP on a fixed batch already on the device, DDP
    when there are several ranks; trains about ``seconds`` and writes its steps and time."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    torch.manual_seed(0)
    width, batch = THROUGHPUT_WIDTH[device.type], THROUGHPUT_BATCH[device.type]
    layers: list[torch.nn.Module] = []
    for _ in range(THROUGHPUT_LAYERS - 1):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    model: torch.nn.Module = torch.nn.Sequential(*layers, torch.nn.Linear(width, 1)).to(device)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(batch, width, device=device)
    y = torch.randn(batch, 1, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def steps(count: int) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(count):
            optimizer.zero_grad(set_to_none=True)
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        sync()
        return time.perf_counter() - start

    steps(WARMUP_STEPS)
    per_step = steps(WARMUP_STEPS) / WARMUP_STEPS
    # Every rank must run the same number of steps (DDP's collectives): take the largest estimate.
    count = torch.tensor([max(WARMUP_STEPS, int(seconds / max(per_step, 1e-6)))], device=device)
    if world > 1:
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
    elapsed = steps(int(count.item()))
    write_rank_file(out, rank, {"rank": rank, "steps": int(count.item()), "seconds": elapsed, "batch": batch})


def throughput_flowtrain(config: dict) -> None:
    """The throughput loop as a flowtrain training function."""
    import trainers
    from trainers.torch import get_device

    context = trainers.get_context()
    throughput_work(context.get_world_rank(), context.get_world_size(), get_device(), config["seconds"], config["out"])
    trainers.report({"done": 1})


def throughput_ray(config: dict) -> None:
    """The throughput loop as a ray.train training function."""
    import ray.train
    from ray.train.torch import get_device

    context = ray.train.get_context()
    throughput_work(context.get_world_rank(), context.get_world_size(), get_device(), config["seconds"], config["out"])
    ray.train.report({"done": 1})


def _raw_process(rank: int, world: int, port: int, backend: str, seconds: float, out: str) -> None:
    import torch.distributed as dist

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        throughput_work(rank, world, device, seconds, out)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_throughput(impl: str, setup: Setup) -> dict:
    """One implementation's samples/s (all ranks together) and the wall time of its whole run."""
    out, world = setup.folder(f"throughput-{impl}"), setup.num_workers
    started = time.perf_counter()
    if impl == "raw_single":
        world = 1
        throughput_work(
            0, 1, torch.device(setup.device_type, 0) if setup.use_gpu else torch.device("cpu"), setup.seconds, out
        )
    elif impl == "raw":
        import torch.multiprocessing as mp

        mp.spawn(_raw_process, args=(world, _free_port(), setup.backend, setup.seconds, out), nprocs=world, join=True)
    elif impl == "flowtrain":
        flowtrain_fit(throughput_flowtrain, {"seconds": setup.seconds, "out": out}, setup, "throughput")
    elif impl == "ray.train":
        from ray.train import RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        TorchTrainer(
            throughput_ray,
            train_loop_config={"seconds": setup.seconds, "out": out},
            scaling_config=ScalingConfig(num_workers=world, use_gpu=setup.use_gpu),
            run_config=RunConfig(name="throughput-ray", storage_path=setup.folder("ray-storage")),
        ).fit()
    else:
        raise ValueError(f"unknown implementation {impl!r}")
    wall = time.perf_counter() - started
    ranks = read_rank_files(out, world)
    samples = sum(r["steps"] * r["batch"] for r in ranks)
    return {
        "samples_per_s": samples / max(r["seconds"] for r in ranks),
        "workers": world,
        "wall_s": wall,
        "steps": ranks[0]["steps"],
    }


THROUGHPUT_IMPLS = ("raw_single", "raw", "flowtrain", "ray.train")


def check_throughput(setup: Setup) -> dict:
    """The same loop under raw torch (one process; torch.multiprocessing), flowtrain and ray.train."""
    measured: dict[str, dict] = {}
    errors: dict[str, str] = {}
    for impl in THROUGHPUT_IMPLS:
        try:
            measured[impl] = run_throughput(impl, setup)
            print(
                f"[gpu-check] throughput {impl}: {measured[impl]['samples_per_s']:.0f} samples/s "
                f"({measured[impl]['workers']} worker(s), {measured[impl]['wall_s']:.1f} s in all)",
                flush=True,
            )
        except Exception as error:  # noqa: BLE001 - one implementation failing must not hide the others' numbers
            errors[impl] = f"{type(error).__name__}: {error}"
            print(f"[gpu-check] throughput {impl} failed: {errors[impl]}", flush=True)
    found = {"measured": measured, "errors": errors, "seconds_per_run": setup.seconds}
    if errors:
        raise CheckFailed(f"throughput: {', '.join(f'{k} failed ({v})' for k, v in errors.items())}", found)
    return found


#: The checks in the order they run, each with its time limit in seconds on a GPU.
CHECKS: dict[str, tuple[Callable[[Setup], dict], float]] = {
    "nccl": (check_nccl, 150),
    "shared_gpu_gloo": (check_shared_gpu_gloo, 150),
    "placement": (check_placement, 150),
    "checkpoint_resume": (check_checkpoint_resume, 180),
    "nccl_reform": (check_nccl_reform, 150),
    "cuda_oom": (check_cuda_oom, 150),
    "fsdp": (check_fsdp, 180),
    "amp": (check_amp, 180),
    "deepspeed": (check_deepspeed, 240),
    "throughput": (check_throughput, 360),
}
