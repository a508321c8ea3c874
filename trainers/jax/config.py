"""JaxConfig and the JAX backend: ``jax.distributed`` connected on every worker, CPUs included.

Ray Train connects JAX processes only on TPUs and GPUs; on CPUs its workers stay separate
processes that each see one device. This backend always calls ``jax.distributed.initialize``
(coordinator on rank 0, at a port free on rank 0's node), so ``jax.process_count()`` is the
number of workers and collectives across processes work on CPUs too (over gloo).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from trainers._checks import check_bool, check_number
from trainers._internal.workers.tpu import multislice_env
from trainers.backend import Backend, BackendConfig, free_port, host_port
from trainers.tuning import JAX_SHUTDOWN_TIMEOUT_S

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class JaxConfig(BackendConfig):
    """How the workers of a ``JaxTrainer`` connect.

    Your training function starts with ``jax.distributed`` initialised: ``jax.process_count()``
    is the number of workers, ``jax.process_index()`` the world rank, and ``jax.devices()`` lists
    every worker's devices, so a mesh over them shards arrays and runs collectives across workers.
    Same name and fields as Ray Train's ``JaxConfig``; ``JaxTrainer`` fills ``use_gpu`` and
    ``use_tpu`` from its ``ScalingConfig`` when you give no config.
    """

    #: The coordinator could not bind its port (another process took it after the backend
    #: released it): restart on a new port, free of the failure budget.
    _setup_clashes = ("Address already in use", "Failed to start RPC server")

    #: Train on TPUs: ``JAX_PLATFORMS=tpu`` unless the workers set it (needs ``ScalingConfig(use_tpu=True)``).
    use_tpu: bool = False
    #: Train on GPUs: ``JAX_PLATFORMS=cuda`` unless the workers set it (needs ``ScalingConfig(use_gpu=True)``).
    use_gpu: bool = False
    #: Seconds ``jax.distributed.initialize`` waits for every worker to join.
    timeout_s: float = 300

    def __post_init__(self) -> None:
        check_bool("JaxConfig.use_tpu", self.use_tpu)
        check_bool("JaxConfig.use_gpu", self.use_gpu)
        if self.use_tpu and self.use_gpu:
            raise ValueError(
                "JaxConfig: use_tpu=True and use_gpu=True together; a worker trains on one kind of accelerator."
            )
        check_number("JaxConfig.timeout_s", self.timeout_s, minimum=0, strict=True, allowed="a number of seconds > 0")

    framework = "jax"

    @property
    def backend_cls(self) -> type[Backend]:
        return JaxBackend

    def to_dict(self) -> dict[str, Any]:
        return {"use_tpu": self.use_tpu, "use_gpu": self.use_gpu}

    def platform(self) -> str:
        """The ``JAX_PLATFORMS`` value the workers get unless they set their own."""
        return "tpu" if self.use_tpu else "cuda" if self.use_gpu else "cpu"


# -- worker side --------------------------------------------------------------------------------


def _initialize(coordinator: str, platform: str, timeout_s: float) -> None:
    # A platform the user chose for the workers (runtime_env) wins over the config's.
    os.environ.setdefault("JAX_PLATFORMS", platform)
    import jax

    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=int(os.environ["WORLD_SIZE"]),
        process_id=int(os.environ["RANK"]),
        initialization_timeout=int(timeout_s),
    )


def _shutdown() -> None:
    import jax

    jax.distributed.shutdown()


# -- driver side --------------------------------------------------------------------------------


class JaxBackend(Backend[JaxConfig]):
    """Connects every worker to one ``jax.distributed`` job before the training function starts."""

    def on_start(self, worker_group: Any, backend_config: JaxConfig) -> None:
        import ray

        workers = worker_group.workers
        host = workers[0].metadata.node_ip
        coordinator = host_port(host, ray.get(workers[0].actor.execute.remote(free_port), timeout=60))
        per_slice = worker_group.scaling.tpu_workers_per_slice
        if backend_config.use_tpu and per_slice:
            # Across several slices libtpu learns the layout from these, as Ray Train sets them; they
            # replace what the TPU hosts' environment holds (it may describe an older set of slices).
            envs = [multislice_env(host, w.ranks.world_rank, len(workers), per_slice) for w in workers]
            if any(envs):
                ray.get([w.actor.set_env.remote(env) for w, env in zip(workers, envs, strict=True)], timeout=60)
        # Every worker at once: initialize() returns only when all of them have joined.
        worker_group.execute(
            _initialize,
            coordinator,
            backend_config.platform(),
            backend_config.timeout_s,
            timeout_s=backend_config.timeout_s + 30,
        )

    def on_shutdown(self, worker_group: Any, backend_config: JaxConfig) -> None:
        # Leaving together lets the coordinator (rank 0) stop last; the actors are killed right
        # after, so a worker that cannot leave in time is not waited for.
        try:
            worker_group.execute(_shutdown, timeout_s=JAX_SHUTDOWN_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 - the actors are killed next whatever happened; logged for a post-mortem
            logger.debug("jax.distributed.shutdown on the workers: %s", error)
