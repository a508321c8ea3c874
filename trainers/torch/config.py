"""TorchConfig and the torch backend: one process group over all workers before the loop runs."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from trainers._checks import check_choice, check_number
from trainers.backend import Backend, BackendConfig, host_port
from trainers.torch.process import TorchProcess
from trainers.torch.rendezvous import host_store, hosted_store_port, join_at_store, new_generation

BACKENDS = ("gloo", "nccl")
INIT_METHODS = ("env", "tcp")


@dataclasses.dataclass(frozen=True)
class TorchConfig(BackendConfig):
    """How the workers' torch process group is set up.

    The process group is ready (``torch.distributed.is_initialized()``) when your training
    function starts, with ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK`` set as ``torchrun`` would, and Hugging Face Accelerate's device variables set
    so that ``accelerate.Accelerator()`` joins the same group.
    """

    #: "gloo" or "nccl"; None picks nccl when training on GPUs and gloo otherwise.
    backend: str | None = None
    #: Ray Train's choice of ``env://`` ("env") or ``tcp://addr:port`` ("tcp"): checked, but the ranks
    #: always meet at a store one worker hosts (``MASTER_ADDR``/``MASTER_PORT``; ``trainers.torch.rendezvous``).
    init_method: str = "env"
    #: Seconds a collective (and process-group setup) may wait before failing.
    timeout_s: float = 1800

    def __post_init__(self) -> None:
        self._check_backend()
        name = type(self).__name__
        check_choice(f"{name}.init_method", self.init_method, INIT_METHODS)
        check_number(f"{name}.timeout_s", self.timeout_s, minimum=0, strict=True, allowed="a number of seconds > 0")

    def _check_backend(self) -> None:
        if self.backend is not None:
            check_choice("TorchConfig.backend", self.backend, BACKENDS)

    framework = "torch"

    @property
    def backend_cls(self) -> type[Backend]:
        return TorchBackend

    @property
    def train_func_context(self) -> Callable[[], AbstractContextManager[None]]:
        """Each worker's training function runs inside ``_worker_device``: the worker's own GPU is
        torch's current CUDA device, and Hugging Face Accelerate is told which it is."""
        return _worker_device

    def collective_backend(self, use_gpu: bool) -> str:
        """The process-group backend that will be used; ``ValueError`` when it is nccl without GPUs."""
        if self.backend == "nccl" and not use_gpu:
            raise ValueError(
                "TorchConfig(backend='nccl') needs GPUs: set ScalingConfig(use_gpu=True), or use backend='gloo'."
            )
        return self.backend or ("nccl" if use_gpu else "gloo")


def _accelerate_env(workers: list[Any], use_gpu: bool) -> dict[int, dict[str, str]]:
    """Per world rank: ``ACCELERATE_USE_CPU``, without which Accelerate (and ``transformers.Trainer``)
    does not treat CPU processes as one job. GPU workers are told their device by ``_worker_device``."""
    if use_gpu:
        return {}
    return {w.ranks.world_rank: {"ACCELERATE_USE_CPU": "true", "ACCELERATE_TORCH_DEVICE": "cpu"} for w in workers}


@contextlib.contextmanager
def _worker_device() -> Iterator[None]:
    """Around the training function: make this worker's first GPU torch's current CUDA device (per
    thread, so set in the thread that trains, as in Ray Train) and Accelerate's device (it would take
    ``cuda:LOCAL_RANK``, which need not be this worker's GPU). Nothing is set on a CPU worker."""
    from trainers.context import get_context

    ids = get_context().accelerator_ids
    if ids:
        import torch

        os.environ["ACCELERATE_TORCH_DEVICE"] = f"cuda:{ids[0]}"
        if torch.cuda.is_available():
            torch.cuda.set_device(ids[0])
    yield


def _per_rank_env(workers: list[Any], use_gpu: bool) -> dict[int, dict[str, str]]:
    """Per world rank: Accelerate's variables and those DeepSpeed's launcher would set beyond
    torchrun's (``LOCAL_SIZE``, its CPU device count; ``CROSS_RANK``/``CROSS_SIZE``, node rank and
    count; ``DS_ACCELERATOR=cpu`` on CPU, so it uses the gloo group). Without them DeepSpeed guesses
    (NUMA nodes as devices, an accelerator the worker does not train on). Harmless to other loops."""
    num_nodes = len({w.ranks.node_rank for w in workers})
    accelerate = _accelerate_env(workers, use_gpu)
    return {
        w.ranks.world_rank: {
            "LOCAL_SIZE": str(w.ranks.local_world_size),
            "CROSS_RANK": str(w.ranks.node_rank),
            "CROSS_SIZE": str(num_nodes),
            **({} if use_gpu else {"DS_ACCELERATOR": "cpu"}),
            **accelerate.get(w.ranks.world_rank, {}),
        }
        for w in workers
    }


def init_method_url(init_method: str, master_addr: str, master_port: str) -> str:
    """The ``init_method`` argument of ``torch.distributed.init_process_group`` for ``TorchConfig.init_method``."""
    if init_method == "env":
        return "env://"
    return f"tcp://{host_port(master_addr, master_port)}"


class TorchBackend(Backend[TorchConfig]):
    """Sets up ``torch.distributed`` on every worker (gloo on CPU, nccl on GPU), meeting at the
    store of the lowest-ranked worker that hosts one, else rank 0's (``trainers.torch.rendezvous``);
    ``MASTER_ADDR``/``MASTER_PORT`` name that store."""

    reuses_workers = True  # every set-up leaves any process group before joining the new one
    process = TorchProcess

    def on_start(self, worker_group: Any, backend_config: TorchConfig) -> None:
        use_gpu = worker_group.scaling.use_gpu
        backend = backend_config.collective_backend(use_gpu)
        timeout_s = backend_config.timeout_s + 30
        # Every worker imports torch.distributed at once, and says whether it hosts a store already.
        ports = worker_group.execute(hosted_store_port, timeout_s=timeout_s)
        host_rank = next((rank for rank, port in enumerate(ports) if port is not None), 0)
        port = ports[host_rank] or worker_group.execute_single(host_rank, host_store)
        worker_group.execute(
            join_at_store,
            worker_group.workers[host_rank].metadata.node_ip,
            port,
            new_generation(),
            backend,
            backend_config.timeout_s,
            _per_rank_env(worker_group.workers, use_gpu),
            timeout_s=timeout_s,
        )

    def on_shutdown(self, worker_group: Any, backend_config: TorchConfig) -> None:
        # The actors are killed right after, whatever happens here; leaving first lets nccl free its communicators.
        with contextlib.suppress(Exception):
            worker_group.execute(TorchProcess.leave_group, timeout_s=5)
