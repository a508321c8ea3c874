"""Backends set up a framework's communication on the workers (developer API, as in Ray Train).

A ``BackendConfig`` names its ``Backend``; the trainer calls ``on_start`` after the workers are up
and ranked and before the training function starts, and ``on_shutdown`` before they are stopped.
A config may also give ``train_func_context``: every worker runs the training function inside it
(XGBoost's collective communicator is entered this way). Torch, XGBoost and LightGBM are
backends; you can write your own.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

#: The config class a backend is given (``class TorchBackend(Backend[TorchConfig])``).
ConfigT = TypeVar("ConfigT", bound="BackendConfig")


class Backend(Generic[ConfigT]):
    """Hooks around the life of a worker group. The default does nothing."""

    #: Whether a clean run's worker processes may serve the next run of the same shape in this
    #: driver (see ``FLOWTRAIN_KEEP_WORKERS_S``): only when ``on_start`` can set the backend up again
    #: in a process that ran it before, after ``on_shutdown``. The default backend (nothing to set
    #: up) and torch's can; a backend of your own is not kept unless it says so.
    reuses_workers: ClassVar[bool] = False

    def on_start(self, worker_group: Any, backend_config: ConfigT) -> None:
        """Set up communication between the workers (e.g. a torch process group)."""

    def on_training_start(self, worker_group: Any, backend_config: ConfigT) -> None:
        """Called right before the training function starts on the workers."""

    def on_shutdown(self, worker_group: Any, backend_config: ConfigT) -> None:
        """Tear down what ``on_start`` set up; the workers are killed afterwards anyway."""


class BackendConfig:
    """Configuration of a backend; ``backend_cls`` names the Backend it configures."""

    #: Texts of the errors ``is_setup_clash`` counts as setup clashes (none by default).
    _setup_clashes: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """The configuration's fields as a dict (as Ray's ``BackendConfig.to_dict``)."""
        import dataclasses

        if dataclasses.is_dataclass(self):
            return dataclasses.asdict(self)
        return dict(vars(self))

    @property
    def backend_cls(self) -> type[Backend[Any]]:
        return Backend

    @property
    def train_func_context(self) -> Callable[[], contextlib.AbstractContextManager[Any]]:
        """A function returning the context manager each worker enters around the training
        function, after ``get_context()`` works and in the thread that trains. Default: none."""
        return contextlib.nullcontext

    def is_setup_clash(self, error: BaseException) -> bool:
        """True when ``error`` (raised on a worker) is a clash while the workers connect that a
        fresh start resolves, such as a port another process took between its reservation and
        its use. The trainer then restarts the worker group without spending
        ``FailureConfig.max_failures`` (at most ``SETUP_CLASH_RESTARTS`` times in one ``fit()``).
        Default: when the error's text holds one of the config's ``_setup_clashes``."""
        return any(text in str(error) for text in self._setup_clashes)

    #: A short name shown in logs (``"torch"``), or None.
    framework: ClassVar[str | None] = None

    def collective_backend(self, use_gpu: bool) -> str | None:
        """The library the workers' collectives run on (``"nccl"``, ``"gloo"``), or None when the
        backend sets up none. A hang found in an NCCL run is raised as ``NCCLHangError``."""
        return None


def free_port() -> int:
    """A TCP port free on this node right now (asked of the OS, not guessed): a backend runs it
    on the worker that will listen on the port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def host_port(host: str, port: int | str) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
