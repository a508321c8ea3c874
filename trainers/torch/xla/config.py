"""TorchXLAConfig and its backend: an ``xla`` process group over all workers."""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import re
import shutil
import sys
import tempfile
import uuid
from typing import Any

from trainers._extras import MissingExtraError
from trainers.backend import Backend, free_port
from trainers.torch.config import TorchBackend, TorchConfig, init_method_url
from trainers.torch.process import TorchProcess
from trainers.torch.rendezvous import join_process_group

logger = logging.getLogger(__name__)

#: What AWS's Neuron guides set for torch_xla over EFA networking.
_EFA_ENV = {
    "FI_PROVIDER": "efa",
    "FI_EFA_USE_DEVICE_RDMA": "1",
    "FI_EFA_FORK_SAFE": "1",
    "XLA_TRANSFER_SEED_ASYNC": "1",
    "NCCL_ASYNC_ERROR_HANDLING": "1",
}
#: Neuron's graph-extraction mode: the run only records graphs (its outputs are not real).
_NEURON_EXTRACT_ENV = {
    "NEURON_PARALLEL_COMPILE": "1",
    "NEURON_EXTRACT_GRAPHS_ONLY": "1",
    "NEURON_FALL_BACK_TO_NULL_NEFF": "1",
}


class TorchXLAMissingError(MissingExtraError):
    """``TorchXLAConfig`` was used where ``torch_xla`` is not installed (an ``ImportError``).

    torch-xla pins one torch version, so flowtrain has no extra for it: install the build that
    matches your torch (or AWS Neuron's ``torch-neuronx``) on the driver and the workers.
    """

    def __init__(self, message: str | None = None) -> None:
        # One optional argument, so the error pickles back from a worker unchanged.
        ImportError.__init__(
            self,
            message
            or "TorchXLAConfig needs the 'torch_xla' package, which is not installed: run "
            "pip install torch-xla==<your torch version> (for TPUs, see pytorch/xla's install notes), "
            "or on AWS Trainium/Inferentia install torch-neuronx from AWS Neuron's package repository.",
            name="torch_xla",
        )
        self.module, self.extra = "torch_xla", None


@dataclasses.dataclass(frozen=True)
class TorchXLAConfig(TorchConfig):
    """How the workers' PyTorch/XLA process group is set up (``ray.train.torch.xla.TorchXLAConfig``).

    Pass it as ``TorchTrainer(..., torch_config=TorchXLAConfig())``. Every worker gets torchrun's
    and torch elastic's environment variables and joins one ``xla`` process group before the
    training function starts. ``backend`` must be None (or "xla"); ``init_method`` ("env" or
    "tcp") says how the ranks find rank 0, as in ``TorchConfig``. Workers given ``neuron_cores``
    get ``PJRT_DEVICE=NEURON`` unless their environment already names a PJRT device.
    As in Ray Train, it targets AWS Neuron devices (``ScalingConfig(resources_per_worker=
    {"neuron_cores": n})``) and sets the EFA networking variables Neuron expects.

    Raises:
        TorchXLAMissingError: (an ``ImportError``) when ``torch_xla`` is not installed here,
            naming what to install.
    """

    #: Run once to extract the model's XLA graphs and compile them all in parallel at the end
    #: (Neuron's ``neuron_parallel_compile``; needs ``libneuronxla``). The training results of
    #: such a run are not meaningful: run again afterwards to train with the compiled graphs.
    neuron_parallel_compile: bool = False

    def _check_backend(self) -> None:
        if self.backend not in (None, "xla"):
            raise ValueError(
                f"TorchXLAConfig.backend={self.backend!r}: the process group is always 'xla'; leave backend "
                "unset (or use TorchConfig for gloo/nccl)."
            )

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.neuron_parallel_compile, bool):
            raise ValueError(
                f"TorchXLAConfig.neuron_parallel_compile={self.neuron_parallel_compile!r}: must be True or False."
            )
        # find_spec answers without importing torch_xla (slow, and it grabs devices).
        if "torch_xla" not in sys.modules and importlib.util.find_spec("torch_xla") is None:
            raise TorchXLAMissingError()

    framework = "torch_xla"

    @property
    def backend_cls(self) -> type[Backend]:
        return TorchXLABackend


def _xla_env(
    world_size: int, num_nodes: int, master: dict[str, str], extract_graphs: bool, neuron: bool = False
) -> dict[str, str]:
    """The variables every worker sets: torch elastic's roles (one role: all workers) and networking.

    ``PJRT_DEVICE`` is only a default (``_init_xla_process_group`` keeps a value already set).
    """
    env = {**master, "GROUP_WORLD_SIZE": str(num_nodes), "ROLE_WORLD_SIZE": str(world_size), **_EFA_ENV}
    if extract_graphs:
        env.update(_NEURON_EXTRACT_ENV)
    if neuron:
        env["PJRT_DEVICE"] = "NEURON"
    return env


def _init_xla_process_group(env: dict[str, str], timeout_s: float, init_method: str = "env") -> None:
    # A PJRT device the user chose (runtime_env, image) wins over the default.
    os.environ.update({k: v for k, v in env.items() if k != "PJRT_DEVICE" or not os.environ.get(k)})
    os.environ["ROLE_RANK"] = os.environ["ROLE_WORLD_RANK"] = os.environ["RANK"]
    try:
        import torch_xla.core.xla_model
        import torch_xla.distributed.xla_backend  # noqa: F401  (registers the "xla" backend)
    except ImportError as error:
        raise TorchXLAMissingError() from error
    join_process_group(
        "xla", timeout_s, init_method=init_method_url(init_method, env["MASTER_ADDR"], env["MASTER_PORT"])
    )


def _compile_extracted_graphs() -> None:
    """Compile the graphs the run extracted (one worker per node does it for the node)."""
    if os.environ.get("LOCAL_RANK") != "0":
        return
    try:
        from libneuronxla.neuron_cc_cache import CacheUrl
        from libneuronxla.neuron_parallel_compile import parallel_compile
    except ImportError as error:
        raise ImportError(
            "TorchXLAConfig(neuron_parallel_compile=True) needs libneuronxla (part of AWS's torch-neuronx) "
            "on the workers: install it from AWS Neuron's package repository."
        ) from error
    workdir = os.path.join(tempfile.gettempdir(), f"flowtrain-neuron-compile-{os.getpid()}")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    # Neuron lets --cache_dir in NEURON_CC_FLAGS override its cache location; honour it.
    match = re.search(r"--cache_dir[= ](\S+)", os.environ.get("NEURON_CC_FLAGS", ""))
    parallel_compile(workdir, CacheUrl.get_cache_url(match.group(1) if match else None))


class TorchXLABackend(Backend[TorchXLAConfig]):
    """Joins every worker in an ``xla`` process group; compiles Neuron graphs at shutdown if asked."""

    process = TorchProcess  # an xla group is a torch.distributed group

    def on_start(self, worker_group: Any, backend_config: TorchXLAConfig) -> None:
        env = _xla_env(
            worker_group.world_size,
            len({w.metadata.node_id for w in worker_group.workers}),
            {
                "MASTER_ADDR": worker_group.workers[0].metadata.node_ip,
                "MASTER_PORT": str(worker_group.execute_single(0, free_port)),
                # torch elastic's run id; XLA's runtime groups the processes by it.
                "TORCHELASTIC_RUN_ID": uuid.uuid4().hex,
            },
            backend_config.neuron_parallel_compile,
            neuron=bool((worker_group.scaling.resources_per_worker or {}).get("neuron_cores")),
        )
        if backend_config.neuron_parallel_compile:
            logger.info("TorchXLAConfig(neuron_parallel_compile=True): this run extracts graphs for Neuron")
        worker_group.execute(
            _init_xla_process_group,
            env,
            backend_config.timeout_s,
            backend_config.init_method,
            timeout_s=backend_config.timeout_s + 30,
        )

    def on_shutdown(self, worker_group: Any, backend_config: TorchXLAConfig) -> None:
        TorchBackend().on_shutdown(worker_group, backend_config)  # leaves the process group
        if backend_config.neuron_parallel_compile:
            # Only after training: the graphs are complete once every step has run.
            worker_group.execute(_compile_extracted_graphs)
