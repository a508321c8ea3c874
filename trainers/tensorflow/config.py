"""TensorflowConfig and the TensorFlow backend: a ``TF_CONFIG`` on every worker.

``tf.distribute.MultiWorkerMirroredStrategy`` finds its peers in the ``TF_CONFIG`` environment
variable: every worker's ``host:port`` and this worker's index. The backend asks each worker for
a port free on its own node, then writes the same cluster list everywhere, with the index equal
to the world rank, so TensorFlow's chief (index 0) is our rank 0.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from trainers.backend import Backend, BackendConfig, free_port, host_port
from trainers.tuning import TENSORFLOW_SETUP_TIMEOUT_S


@dataclasses.dataclass(frozen=True)
class TensorflowConfig(BackendConfig):
    """How the workers of a ``TensorflowTrainer`` find each other. It has no fields.

    Before your training function starts, every worker has ``TF_CONFIG`` set (all workers, its
    task index = its world rank), so ``tf.distribute.MultiWorkerMirroredStrategy()`` connects them.
    ``TF_USE_LEGACY_KERAS=1`` is set as Ray Train sets it (``0`` in the workers' environment keeps
    Keras 3): ``tf.keras`` is then Keras 2 (``tf-keras``), whose ``fit()`` runs under that strategy
    and Keras 3's does not (for data-parallel Keras 3 use ``JaxTrainer`` with ``KERAS_BACKEND=jax``
    and ``keras.distribution.DataParallel``). Same name as ``ray.train.tensorflow.TensorflowConfig``.
    """

    #: TensorFlow could not bind the port reserved for it (another process took it after the
    #: backend released it): restart on new ports, free of the failure budget.
    _setup_clashes = ("Could not start gRPC server", "Address already in use")

    framework = "tensorflow"

    @property
    def backend_cls(self) -> type[Backend]:
        return TensorflowBackend


# -- worker side --------------------------------------------------------------------------------


def tf_config(addresses: list[str], index: int) -> str:
    """The ``TF_CONFIG`` value for the worker at ``index`` of ``addresses`` (``host:port`` each)."""
    return json.dumps({"cluster": {"worker": list(addresses)}, "task": {"type": "worker", "index": index}})


def _set_environment(addresses: list[str]) -> None:
    os.environ["TF_CONFIG"] = tf_config(addresses, int(os.environ["RANK"]))
    # Keras 2 for MultiWorkerMirroredStrategy (see TensorflowConfig); a value the user set wins.
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")


# -- driver side --------------------------------------------------------------------------------


class TensorflowBackend(Backend[TensorflowConfig]):
    """Writes ``TF_CONFIG`` (and ``TF_USE_LEGACY_KERAS``) on every worker before the loop starts."""

    def on_start(self, worker_group: Any, backend_config: TensorflowConfig) -> None:
        ports = worker_group.execute(free_port, timeout_s=TENSORFLOW_SETUP_TIMEOUT_S)
        addresses = [host_port(w.metadata.node_ip, port) for w, port in zip(worker_group.workers, ports, strict=True)]
        worker_group.execute(_set_environment, addresses, timeout_s=TENSORFLOW_SETUP_TIMEOUT_S)
