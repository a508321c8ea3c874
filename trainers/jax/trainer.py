"""JaxTrainer: SPMD JAX training on N workers joined into one ``jax.distributed`` job."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Unpack

from trainers.config import ScalingConfig
from trainers.data_parallel_trainer import DataParallelTrainer, TrainerOptions
from trainers.jax.config import JaxConfig


class JaxTrainer(DataParallelTrainer):
    """Runs a JAX training function on N workers connected by ``jax.distributed``, CPUs included:
    ``jax.process_count()`` is the number of workers and ``jax.devices()`` spans all of them, so one
    program shards its arrays over every worker (example: docs/frameworks.md, "JAX").

    Same arguments as Ray Train's ``JaxTrainer``. Without ``jax_config`` the trainer takes
    ``use_gpu`` and ``use_tpu`` from ``scaling_config``; on TPUs also give ``ScalingConfig``'s
    ``topology`` and ``accelerator_type``: each worker then takes a whole TPU host, the workers
    fill whole slices, and across several slices each gets the ``MEGASCALE_*`` variables
    (coordinator address, number of slices, its slice) as Ray Train sets them.
    """

    _backend_config_arg = ("jax_config", JaxConfig)

    # Ray Train's keywords: its own config here, the rest in TrainerOptions (tests/test_api_surface.py).
    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        jax_config: JaxConfig | None = None,
        **options: Unpack[TrainerOptions],
    ) -> None:
        if jax_config is None:  # GPUs and TPUs as the scaling_config reserves them
            scaling = options.get("scaling_config")
            scaling = scaling if isinstance(scaling, ScalingConfig) else ScalingConfig()
            jax_config = JaxConfig(use_tpu=scaling.use_tpu, use_gpu=scaling.use_gpu)
        super().__init__(train_loop_per_worker, backend_config=jax_config, **options)
        for flag, kind, also in (("use_gpu", "GPU", ""), ("use_tpu", "TPU", ", topology=..., accelerator_type=...")):
            if getattr(jax_config, flag) and not getattr(self.scaling_config, flag):
                raise ValueError(
                    f"JaxConfig({flag}=True) needs {kind}s reserved: set ScalingConfig({flag}=True{also}), or {flag}=False."
                )
