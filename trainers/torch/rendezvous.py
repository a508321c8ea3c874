"""Where the workers' torch process group meets: a store a kept worker hosts, one prefix a generation.

With ``env://`` rank 0 hosts the ``TCPStore`` inside its process group, which dies with the group;
a group re-formed around replaced ranks (``FLOWTRAIN_REPLACE_RANKS``) needs a store that outlived
the failure. So a worker process hosts one apart from its group, kept across resets, and each
formation uses keys under a prefix of its own (docs/design.md, step 5). The driver hosts nothing:
it never imports torch (1.2 s of CPU at the start of a script that does not import it itself).
"""

from __future__ import annotations

import datetime
import os
import threading
import uuid
from typing import Any

import ray

from trainers._internal.network import pin_collective_interface
from trainers._internal.workers.connections import forming_group
from trainers.torch.process import TorchProcess

_lock = threading.Lock()
#: The store this process hosts, once it hosts one.
_store: Any = None


def hosted_store_port() -> int | None:
    """Run in a worker: import ``torch.distributed`` (most of a worker's set-up, done by every
    worker at once), and return the port of the store this process hosts, or None."""
    import torch.distributed  # noqa: F401

    with _lock:
        return None if _store is None else int(_store.port)


def host_store() -> int:
    """Run in a worker: the port of the store this process hosts, started on first use."""
    global _store
    with _lock:
        if _store is None:
            import torch.distributed as dist

            _store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False)
        return int(_store.port)


def new_generation() -> str:
    """A key prefix no other formation of any group of this driver uses."""
    return f"flowtrain/{uuid.uuid4().hex}/"


def join_at_store(
    host: str, port: int, prefix: str, backend: str, timeout_s: float, env_by_rank: dict[int, dict[str, str]]
) -> None:
    """Run in a worker: leave any group this process is in, then join the generation ``prefix`` at
    the store ``host:port`` (``MASTER_ADDR``/``MASTER_PORT``) with this worker's ``RANK``,
    ``WORLD_SIZE`` and the variables ``env_by_rank`` holds for it."""
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": host, "MASTER_PORT": str(port), **env_by_rank.get(int(os.environ["RANK"]), {})})
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.PrefixStore(prefix, dist.TCPStore(host, port, is_master=False, timeout=timeout))
    join_process_group(backend, timeout_s, store=store)


def join_process_group(backend: str, timeout_s: float, **meeting: Any) -> None:
    """Join the workers' ``backend`` process group (leaving one this process is in), its rank
    and size from the environment; ``meeting`` says where the ranks meet (``init_method=`` or
    ``store=``, as ``torch.distributed.init_process_group`` takes them)."""
    import torch.distributed as dist

    TorchProcess.leave_group()
    pin_collective_interface(ray.util.get_node_ip_address())
    with forming_group(store_port=hosted_store_port()):
        dist.init_process_group(
            backend=backend,
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
            timeout=datetime.timedelta(seconds=timeout_s),
            **meeting,
        )
