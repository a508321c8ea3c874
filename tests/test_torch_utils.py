"""trainers.torch helpers on a real gloo process group (2 processes), and GPU assignment as pure logic."""

from __future__ import annotations

import gc
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from trainers._internal.workers.devices import assign_visible_devices
from trainers.context import StorageInfo, TrainContext, _set_context
from trainers.torch import get_device, get_devices, prepare_data_loader, prepare_model


def context(rank: int, size: int, accelerators=()) -> TrainContext:
    import pyarrow.fs

    storage = StorageInfo("/tmp", "/tmp/run", "/tmp/run", pyarrow.fs.LocalFileSystem())
    return TrainContext("run", size, rank, rank, size, 0, storage, tuple(accelerators))


def in_group(rank, size, check, out_dir):
    """Child process body: join a gloo group, install a worker context, run ``check``, save its result.

    The ranks meet at a file store in ``out_dir``, not at a port picked beforehand, which another
    process of the suite (Ray starts many) could take before rank 0 listens on it."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out_dir}/rendezvous", rank=rank, world_size=size)
    _set_context(context(rank, size))
    try:
        torch.save(check(rank, size), os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        # An FSDP module holds reference cycles: it outlives the check, and with it the gloo group,
        # until a garbage collection. Freed while the interpreter shuts down, a gloo group's worker
        # threads may free tensors with no Python left to take the GIL: a SIGABRT ("terminate
        # called without an active exception"), as rank 1 of the FSDP check once died in CI.
        gc.collect()
        dist.destroy_process_group()


def run_two(check):
    out = tempfile.mkdtemp()
    mp.start_processes(in_group, args=(2, check, out), nprocs=2, join=True, start_method="spawn")
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]


# -- checks run in the 2-process group ---------------------------------------------------------


def sampler_check(rank, size):
    data = TensorDataset(torch.arange(20).float())
    shuffled = prepare_data_loader(DataLoader(data, batch_size=4, shuffle=True))
    ordered = prepare_data_loader(DataLoader(data, batch_size=4, shuffle=False))
    shuffled.sampler.set_epoch(0)
    epoch0 = [int(v) for (b,) in shuffled for v in b]
    shuffled.sampler.set_epoch(1)
    epoch1 = [int(v) for (b,) in shuffled for v in b]
    return {
        "is_distributed": isinstance(shuffled.sampler, DistributedSampler),
        "shuffle": (shuffled.sampler.shuffle, ordered.sampler.shuffle),
        "epoch0": epoch0,
        "epoch1": epoch1,
        "ordered": [int(v) for (b,) in ordered for v in b],
        "batches": len(ordered),
    }


def ddp_check(rank, size):
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(3, 1))
    loss = model(torch.full((2, 3), float(rank + 1))).sum()
    loss.backward()
    return {"wrapped": type(model).__name__, "grad": model.module.weight.grad.clone()}


def fsdp_check(rank, size):
    torch.manual_seed(0)
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)), parallel_strategy="fsdp")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(rank))
    before = model(x).sum().item()
    model(x).sum().backward()
    optimizer.step()
    after = model(x).sum().item()
    return {"sharded": type(model).__name__.startswith("FSDP"), "changed": before != after}


# -- tests ----------------------------------------------------------------------------------------


def test_data_loader_gets_disjoint_shards_keeping_shuffle():
    rank0, rank1 = run_two(sampler_check)
    assert rank0["is_distributed"] and rank1["is_distributed"]
    assert rank0["shuffle"] == (True, False)
    assert sorted(rank0["ordered"] + rank1["ordered"]) == list(range(20))
    assert not set(rank0["epoch0"]) & set(rank1["epoch0"])
    assert sorted(rank0["epoch0"] + rank1["epoch0"]) == list(range(20))
    assert rank0["epoch0"] != rank0["epoch1"]  # set_epoch reshuffles
    assert rank0["ordered"] == list(range(0, 20, 2))  # no shuffle: strided, in order
    assert rank0["batches"] == 3


def test_prepare_model_wraps_in_ddp_and_averages_gradients():
    rank0, rank1 = run_two(ddp_check)
    assert rank0["wrapped"] == "DistributedDataParallel"
    # d(sum(w.x))/dw = 2 * x; ranks use x=1 and x=2, DDP averages: 3 per element.
    torch.testing.assert_close(rank0["grad"], torch.full((1, 3), 3.0))
    torch.testing.assert_close(rank1["grad"], rank0["grad"])


def test_fsdp_strategy_shards_and_trains_on_cpu_gloo():
    rank0, rank1 = run_two(fsdp_check)
    assert rank0["sharded"] and rank1["sharded"]
    assert rank0["changed"] and rank1["changed"]


def test_single_worker_is_not_wrapped_and_stays_on_cpu():
    _set_context(context(0, 1))
    try:
        model = prepare_model(torch.nn.Linear(2, 2))
        assert isinstance(model, torch.nn.Linear)
        loader = DataLoader(TensorDataset(torch.zeros(4)), batch_size=2)
        assert prepare_data_loader(loader) is loader
        assert get_device() == torch.device("cpu") and get_devices() == [torch.device("cpu")]
    finally:
        _set_context(None)


def test_unknown_strategy_is_named():
    with pytest.raises(ValueError, match=r"parallel_strategy='zero3'\): must be one of 'ddp', 'fsdp' or None"):
        prepare_model(torch.nn.Linear(1, 1), parallel_strategy="zero3")


def test_visible_devices_are_shared_per_node():
    # Node a has workers with GPU 3 and GPU 1; node b one worker with two GPUs.
    result = assign_visible_devices([["3"], ["1"], ["0", "2"]], ["a", "a", "b"])
    assert result == [("1,3", (1,)), ("1,3", (0,)), ("0,2", (0, 1))]
    assert assign_visible_devices([[], []], ["a", "a"]) == [("", ()), ("", ())]


def test_a_gpu_worker_trains_with_its_own_gpu_as_the_current_device(monkeypatch):
    """Only a GPU machine can run this for real (``make gpu-check``'s placement check does); here the
    CUDA calls are stood in for, to show which device the training thread is given."""
    from trainers.torch import TorchConfig

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE", raising=False)
    _set_context(context(1, 2, accelerators=(1,)))
    try:
        with TorchConfig().train_func_context():
            assert chosen == [1] and os.environ["ACCELERATE_TORCH_DEVICE"] == "cuda:1"
    finally:
        _set_context(None)
        os.environ.pop("ACCELERATE_TORCH_DEVICE", None)
    _set_context(context(0, 1))  # a CPU worker: nothing set
    try:
        with TorchConfig().train_func_context():
            assert chosen == [1] and "ACCELERATE_TORCH_DEVICE" not in os.environ
    finally:
        _set_context(None)
