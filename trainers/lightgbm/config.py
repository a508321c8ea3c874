"""LightGBMConfig and the lightgbm backend: LightGBM's own network between the workers.

Each worker binds a free port of its own OS and holds it until the training function asks for
``get_network_params()``, which frees it just before LightGBM binds it: two workers on a node never
share a port, and nothing else takes it while the group starts. A process that takes it in that
moment is a setup clash (``LightGBMConfig._setup_clashes``): a restart on new ports.
"""

from __future__ import annotations

import dataclasses
import socket
import uuid
from typing import Any

from trainers.backend import Backend, BackendConfig


@dataclasses.dataclass(frozen=True)
class LightGBMConfig(BackendConfig):
    """How the workers of a ``LightGBMTrainer`` find each other.

    Nothing to set: the trainer gives every worker a port and the list of all workers; inside
    your training function, ``trainers.lightgbm.get_network_params()`` returns them for
    ``lightgbm.train``. Same name as ``ray.train.lightgbm.LightGBMConfig``.
    """

    #: LightGBM could not bind the port this worker reserved (another process took it after
    #: ``get_network_params()`` released it): restart on new ports, free of the failure budget.
    _setup_clashes = ("Binding port",)

    framework = "lightgbm"

    @property
    def backend_cls(self) -> type[Backend]:
        return LightGBMBackend


# -- worker side --------------------------------------------------------------------------------

#: The socket holding this worker's LightGBM port until the training function asks for it.
_held: socket.socket | None = None
#: This worker's network parameters (None with one worker or outside a LightGBMTrainer).
_network: dict[str, Any] | None = None
#: The name of this attempt's rendezvous (see ``trainers.lightgbm.bins``).
_rendezvous: str | None = None


def _reserve_port() -> int:
    """Bind a free port on this node and keep it bound; return it."""
    global _held
    _release_port()
    _held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    _held.bind(("", 0))
    return _held.getsockname()[1]


def _release_port() -> None:
    global _held
    if _held is not None:
        _held.close()
        _held = None


def _set_network(addresses: list[tuple[str, int]], rendezvous: str) -> None:
    """Remember the network parameters; this worker is the entry whose port it holds."""
    global _network, _rendezvous
    assert _held is not None, "a port is reserved before the network is set"
    _network = {
        "machines": ",".join(f"{ip}:{p}" for ip, p in addresses),
        "local_listen_port": _held.getsockname()[1],
        "num_machines": len(addresses),
    }
    _rendezvous = rendezvous


def get_network_params() -> dict[str, Any]:
    """LightGBM's network parameters for this worker: ``machines``, ``local_listen_port`` and
    ``num_machines``, as ``ray.train.lightgbm.get_network_params()`` returns them.

    Merge them into ``lightgbm.train``'s parameters with ``tree_learner="data_parallel"`` (the
    default learner does not combine workers), right before the call (it frees the port kept for
    LightGBM): ``{"objective": "binary", "tree_learner": "data_parallel", **get_network_params()}``.
    With one worker (or ``num_workers=0``) it returns ``{}``: LightGBM then trains alone.

    Raises:
        RuntimeError: outside ``train_loop_per_worker``.
    """
    from trainers._internal.session.worker_session import get_session

    get_session("get_network_params")
    if _network is None:
        return {}
    _release_port()
    return dict(_network)


# -- driver side --------------------------------------------------------------------------------


class LightGBMBackend(Backend[LightGBMConfig]):
    """Reserves a port on every worker and gives each worker the list of all of them; nothing to
    tear down (the ports go with the worker processes)."""

    def on_start(self, worker_group: Any, backend_config: LightGBMConfig) -> None:
        if worker_group.world_size < 2:
            return
        # Every worker binds its own free port (held, so no two workers share one) ...
        ports = worker_group.execute(_reserve_port)
        addresses = [(worker.metadata.node_ip, port) for worker, port in zip(worker_group.workers, ports, strict=True)]
        # ... and learns everyone's, in world-rank order: LightGBM's ranks follow this list.
        worker_group.execute(_set_network, addresses, f"flowtrain-lightgbm-{uuid.uuid4().hex}")
