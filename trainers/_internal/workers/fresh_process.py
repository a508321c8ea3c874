"""What a worker process puts back before it serves another attempt, so the user's code finds it
as a fresh process.

flowtrain reuses worker processes (a clean run's workers for the next ``fit()``, and the ranks
that survived a failure for the next attempt of the same run) because most of a worker's start is
importing: Ray, torch, ``torch._dynamo``. What is expensive and shared stays: Python itself and
every installed library already imported. Everything a run may have changed that a new process
would not show is put back:

- the environment variables, the working directory and ``sys.path``, as they were when the process
  started;
- flowtrain's log levels (``LoggingConfig``);
- the user's own modules: every module imported since the process started whose file is outside
  the installed packages (site-packages, the standard library, Ray, flowtrain) is forgotten, so the
  next attempt imports it again from disk: an edited module's new code, its globals as a fresh
  import sets them;
- the framework's process-wide settings and random generators, as its backend says
  (``FrameworkProcess.reset``: torch's in ``trainers.torch.process``); Python's ``random`` and
  NumPy's global generator re-seeded from the OS, as a new process does;
- Ray Data's ``DataContext`` (when Ray Data was imported): a new default one.

The framework's group is left by the worker (``TrainWorker.stop``) before this runs. Not put back: state a library keeps in C
that no API resets (a custom operator registered by a user module is registered again on re-import,
which torch refuses; such a module should register in an installed package), and the libraries that
keep process-wide distributed state, whose processes are never reused (``reuse.KEEPS_PROCESS_STATE``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import sys
import sysconfig

from trainers.backend import FrameworkProcess

#: Top-level packages whose modules are never forgotten: flowtrain's own (an editable install
#: lives outside site-packages) and Ray's (a worker's own machinery).
_KEPT_PACKAGES = frozenset({"trainers", "storage", "tasks", "flows", "ray"})


def installed_roots() -> tuple[str, ...]:
    """The folders installed code lives in: the standard library and every site-packages."""
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    return tuple(sorted(os.path.realpath(root) + os.sep for root in roots))


def is_user_module(name: str, module: object, installed: tuple[str, ...]) -> bool:
    """Whether ``module`` is the user's own code (re-imported from disk on reuse): it has a source
    file, outside every folder in ``installed`` and outside flowtrain's and Ray's packages."""
    if name == "__main__" or name.partition(".")[0] in _KEPT_PACKAGES:
        return False
    path = getattr(module, "__file__", None)
    if not isinstance(path, str) or not path:
        return False  # built-in, frozen, or a namespace package: nothing of the user's to reload
    return not os.path.realpath(path).startswith(installed)


@dataclasses.dataclass(frozen=True)
class ProcessBaseline:
    """A worker process as it was before it ran any attempt; ``restore`` puts it back."""

    environ: dict[str, str]
    cwd: str
    sys_path: list[str]
    #: The modules imported before any attempt ran: never forgotten.
    modules: frozenset[str]
    #: Modules imported since that were found installed (torch's thousands): never looked at again.
    installed_since: set[str] = dataclasses.field(default_factory=set)

    @classmethod
    def capture(cls) -> ProcessBaseline:
        return cls(dict(os.environ), os.getcwd(), list(sys.path), frozenset(sys.modules))

    def restore(self, framework: type[FrameworkProcess] = FrameworkProcess) -> list[str]:
        """Put the process back as ``capture`` found it (see the module's docstring), ``framework``'s
        process-wide settings too; returns the names of the user modules it forgot."""
        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        sys.path[:] = self.sys_path
        from trainers._internal.log_level import FLOWTRAIN_LOGGERS

        for name in FLOWTRAIN_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)
        forgotten = self.forget_user_modules()
        framework.reset()
        random.seed()
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()
        if "ray.data" in sys.modules:
            from ray.data import DataContext

            from trainers._internal.ray_private import set_current_data_context

            set_current_data_context(DataContext())
        return forgotten

    def forget_user_modules(self) -> list[str]:
        """Drop from ``sys.modules`` every user module imported since ``capture``."""
        installed = installed_roots()
        names = []
        for name, module in list(sys.modules.items()):
            if name in self.modules or name in self.installed_since or module is None:
                continue
            if is_user_module(name, module, installed):
                names.append(name)
            else:
                self.installed_since.add(name)
        for name in names:
            sys.modules.pop(name, None)
        if names:
            import importlib

            importlib.invalidate_caches()  # a module file created since the last import is found
        return sorted(names)
