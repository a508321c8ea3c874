"""A package's public names, each imported from its module on first use (PEP 562).

``storage``, ``trainers`` and ``trainers.torch`` list where each public name lives and load it
only when it is asked for: every training worker imports those packages, and loading everything
they export there cost each worker process CPU at start-up for modules it never runs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(
    package: str, homes: dict[str, tuple[str, ...]], namespace: dict[str, Any], submodules: tuple[str, ...] = ()
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package``, whose names live in the modules
    ``homes`` lists (``{"storage.checkpoint": ("Checkpoint",)}``); ``submodules`` are public too
    (``trainers.collective``). ``namespace`` is the package's ``globals()``: a name loaded once is
    put there, so later lookups never reach ``__getattr__`` again."""
    home_of = {name: module for module, names in homes.items() for name in names}
    public = sorted([*home_of, *submodules])

    def load(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        if name not in home_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home_of[name]), name)
        namespace[name] = value
        return value

    def listing() -> list[str]:
        return sorted(set(namespace) | set(public))

    return public, load, listing
