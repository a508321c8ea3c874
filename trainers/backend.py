"""Backends set up a framework's communication on the workers (developer API, as in Ray Train;
docs/frameworks.md, "Another framework: write a backend"). A ``BackendConfig`` names its
``Backend``; torch (with torch-xla), XGBoost, LightGBM, TensorFlow and JAX are backends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

#: The config class a backend is given (``class TorchBackend(Backend[TorchConfig])``).
ConfigT = TypeVar("ConfigT", bound="BackendConfig")


class FrameworkProcess:
    """What a worker's process asks of the framework that trains in it where only the framework
    knows the answer: stopping an attempt, resetting the process, the pre-flight probe, the
    device's memory. Run in the workers; every method is static, so the class travels by name.
    The default knows no framework. A backend names its own (``Backend.process``); torch's is
    ``trainers.torch.process.TorchProcess``."""

    @staticmethod
    def interrupt() -> None:
        """The attempt stops: make the collectives that wait on a device fail now (NCCL's abort).
        Called before the training thread is waited for, also when it has ended after a failure."""

    @staticmethod
    def leave_group() -> None:
        """Leave this process's collective group, once its training thread has ended, so that the
        peers still waiting on it in a collective fail at once and the process can join another."""

    @staticmethod
    def unusable() -> str | None:
        """Why this process cannot train again (a device left broken by an abort), or None."""
        return None

    @staticmethod
    def reset() -> None:
        """Put the framework's process-wide settings and random generators back as a new process has them."""

    @staticmethod
    def probe(use_gpu: bool) -> dict[str, Any] | None:
        """The pre-flight probe of one worker: ``{"gflops", "bus_gbps", "interface"}``, or None when
        the framework has none (the check is then not run)."""
        return None

    @staticmethod
    def device_peaks() -> tuple[int, int] | None:
        """Bytes allocated and reserved on this process's device at their peaks, or None without one."""
        return None

    @staticmethod
    def reset_device_peaks() -> None:
        """Start the device's peaks over (a kept process reports its next attempt's own)."""

    @staticmethod
    def watch_device_memory() -> None:
        """An attempt starts: record the device's allocations, for a snapshot if it runs out
        (``FLOWTRAIN_CUDA_MEMORY_SNAPSHOT``)."""

    @staticmethod
    def device_memory_summary() -> str | None:
        """The device's memory in words, for a rank that ran out of it; None without a device."""
        return None

    @staticmethod
    def save_device_snapshot(local_path: str) -> bool:
        """Write the recorded allocations to ``local_path``; False when nothing was recorded."""
        return False


class Backend(Generic[ConfigT]):
    """Hooks around the life of a worker group. The default does nothing."""

    #: What the workers' processes ask of the framework (run in the workers).
    process: ClassVar[type[FrameworkProcess]] = FrameworkProcess

    #: Whether a clean run's worker processes may serve the next run of the same shape in this
    #: driver (see ``FLOWTRAIN_KEEP_WORKERS_S``): only when ``on_start`` can set the backend up again
    #: in a process that ran it before, after ``on_shutdown``. The default backend (nothing to set
    #: up) and torch's can; a backend of your own is not kept unless it says so.
    reuses_workers: ClassVar[bool] = False

    def on_start(self, worker_group: Any, backend_config: ConfigT) -> None:
        """Set up communication between the workers (e.g. a torch process group), once they are up
        and ranked and before the training function starts."""

    def on_training_start(self, worker_group: Any, backend_config: ConfigT) -> None:
        """Called right before the training function starts on the workers."""

    def on_shutdown(self, worker_group: Any, backend_config: ConfigT) -> None:
        """A run ended cleanly: tear down what ``on_start`` set up, before the workers are stopped
        or parked (they are killed afterwards anyway)."""


class BackendConfig:
    """Configuration of a backend; ``backend_cls`` names the Backend it configures."""

    #: Texts of the errors ``is_setup_clash`` counts as setup clashes (none by default).
    _setup_clashes: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """The configuration's fields as a dict (as Ray's ``BackendConfig.to_dict``)."""
        return dataclasses.asdict(self) if dataclasses.is_dataclass(self) else dict(vars(self))

    @property
    def backend_cls(self) -> type[Backend[Any]]:
        return Backend

    @property
    def train_func_context(self) -> Callable[[], contextlib.AbstractContextManager[Any]]:
        """A function returning the context manager each worker enters around the training
        function, after ``get_context()`` works and in the thread that trains. Default: none."""
        return contextlib.nullcontext

    def is_setup_clash(self, error: BaseException) -> bool:
        """True when ``error`` (raised on a worker) is a clash while the workers connect that a fresh
        start resolves (a port another process took between its reservation and its use): the
        worker group then restarts without spending ``FailureConfig.max_failures`` (at most
        ``SETUP_CLASH_RESTARTS`` times per ``fit()``). Default: the error's text holds one of
        ``_setup_clashes``."""
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
