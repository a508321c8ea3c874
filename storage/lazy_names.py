"""A package's public names, each imported from its module on first use (PEP 562).

``storage``, ``trainers`` and ``trainers.torch`` load a public name only when it is asked for:
every training worker imports those packages, and loading everything they export there cost each
worker process CPU at start-up for modules it never runs. Each package names its public names once,
as the imports of its ``if TYPE_CHECKING:`` block (what IDEs and type checkers read); this module
reads that block to know where each name lives.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

#: One ``from ... import ...`` statement of a ``TYPE_CHECKING`` block: the module, then the names
#: (in parentheses, or on the line).
IMPORT = re.compile(r"from ([\w.]+) import (?:\(([^)]*)\)|([^\n]*))")


def lazy_names(namespace: dict[str, Any]) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for the package whose ``globals()`` is
    ``namespace``: its public names are what its ``if TYPE_CHECKING:`` block imports
    (``from storage.checkpoint import Checkpoint``; ``from trainers import collective`` names a
    submodule). A name loaded once is put in ``namespace``, so later lookups never reach
    ``__getattr__`` again."""
    package = namespace["__name__"]
    with open(namespace["__file__"], encoding="utf-8") as source:
        block = source.read().split("\nif TYPE_CHECKING:", 1)[1]  # the block ends the file
    # ``from module import a, b`` or, as ruff formats a long one, ``from module import (a, b,)``;
    # read as text, not with ast: every worker imports these packages, and importing ast alone costs ~1.5 ms.
    home_of = {
        name: module
        for module, wrapped, plain in IMPORT.findall(block)
        for name in re.findall(r"\w+", wrapped or plain.partition("#")[0])
    }
    public = sorted(home_of)

    def load(name: str) -> Any:
        if name not in home_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        home = home_of[name]
        value = (
            importlib.import_module(f"{package}.{name}")
            if home == package
            else getattr(importlib.import_module(home), name)
        )
        namespace[name] = value
        return value

    def listing() -> list[str]:
        return sorted(set(namespace) | set(public))

    return public, load, listing
