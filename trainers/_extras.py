"""Optional framework integrations (Lightning, Transformers, Accelerate, ...): imported only when
used, and when one is missing, an error that says which extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingExtraError(ImportError):
    """A framework integration was used without its optional dependency installed.

    ``extra`` names the flowtrain extra that installs it (``pip install 'flowtrain[extra]'``).
    """

    def __init__(self, module: str, extra: str) -> None:
        self.module = module
        self.extra: str | None = extra  # None: no flowtrain extra installs it (TorchXLAMissingError)
        super().__init__(
            f"trainers' {extra} integration needs the {module!r} package, which is not installed: "
            f"run pip install 'flowtrain[{extra}]'.",
            name=module,
        )


def require(module: str, *, extra: str) -> ModuleType:
    """Import ``module``, or raise :class:`MissingExtraError` naming ``pip install 'flowtrain[extra]'``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        # Only a missing framework is our message; a broken install inside it keeps its own error.
        if error.name is None or module.split(".")[0] != error.name.split(".")[0]:
            raise
        raise MissingExtraError(module, extra) from error
