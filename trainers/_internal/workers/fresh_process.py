"""What a worker process puts back before it serves another attempt, so the user's code finds it
as a fresh process (docs/fault-tolerance.md, "A kept process is a fresh process to your code").

Python and every installed library already imported stay. The user's own modules (files outside
the installed packages, flowtrain's and Ray's) are forgotten, to be imported again from disk; the
framework's process-wide settings are its backend's to put back (``FrameworkProcess.reset``).
Processes of libraries that keep distributed state are never reused (``reuse.KEEPS_PROCESS_STATE``).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import random
import sys
import sysconfig

from trainers._internal.log_level import FLOWTRAIN_LOGGERS
from trainers._internal.ray_private import set_current_data_context
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
        for name in FLOWTRAIN_LOGGERS:
            logging.getLogger(name).setLevel(logging.NOTSET)
        forgotten = self.forget_user_modules()
        framework.reset()
        random.seed()
        # Only when it was imported: reaching numpy.random through numpy imports it (a dozen
        # modules, about 1.5 MB a worker), and a generator nobody used has no state to reset.
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()
        if "ray.data" in sys.modules:
            from ray.data import DataContext

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
            importlib.invalidate_caches()  # a module file created since the last import is found
        return sorted(names)
