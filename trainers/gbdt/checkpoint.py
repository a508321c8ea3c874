"""The part ``XGBoostCheckpoint`` and ``LightGBMCheckpoint`` share: a booster in one file."""

from __future__ import annotations

import os
from typing import Any, ClassVar, Self

from trainers._internal.session.framework_checkpoint import FrameworkCheckpoint


class GBDTCheckpoint(FrameworkCheckpoint):
    """A checkpoint with a boosting library's model: ``from_model(booster)``, then ``get_model()``."""

    _INSTEAD: ClassVar[str] = "trainers.Checkpoint with RayTrainReportCallback.get_model(checkpoint)"
    #: The library's booster class; what to pass for it, in words; how to read one from its file.
    _BOOSTER: ClassVar[type[Any]]
    _PASS_A_BOOSTER: ClassVar[str]
    _load_model: ClassVar[staticmethod[[str], Any]]

    @classmethod
    def from_model(
        cls, booster: Any, *, preprocessor: Any | None = None, path: str | os.PathLike | None = None
    ) -> Self:
        """A checkpoint of ``booster`` saved into ``path`` (an existing, preferably empty folder;
        a new temporary one by default), with ``preprocessor`` if given.

        For a scikit-learn style model pass its booster: ``model.get_booster()`` for xgboost,
        ``model.booster_`` for LightGBM.
        """
        if not isinstance(booster, cls._BOOSTER):
            raise TypeError(f"{cls.__name__}.from_model(booster={type(booster).__name__}): pass {cls._PASS_A_BOOSTER}.")
        return cls._from_saved(booster.save_model, preprocessor=preprocessor, path=path, method="from_model")

    def get_model(self) -> Any:
        """The booster stored in this checkpoint (an ``xgboost.Booster`` or a ``lightgbm.Booster``)."""
        with self._model_file() as path:
            return type(self)._load_model(path)
