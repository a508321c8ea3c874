"""JAX on flowtrain: ``JaxTrainer`` and ``JaxConfig``, the names of Ray Train's JAX module.

Unlike Ray Train, the workers are joined by ``jax.distributed`` on CPUs and GPUs too, not only
on TPUs. Needs the ``jax`` extra (``pip install 'flowtrain[jax]'``: ``jax[cpu]`` and ``optax``).
Importing this package does not import JAX: the workers do.
"""

import importlib.util as _util

from trainers._extras import MissingExtraError as _MissingExtraError

if _util.find_spec("jax") is None:
    raise _MissingExtraError("jax", "jax")

from trainers.jax.config import JaxBackend, JaxConfig
from trainers.jax.trainer import JaxTrainer

__all__ = ["JaxBackend", "JaxConfig", "JaxTrainer"]
