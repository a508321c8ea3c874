"""TorchCheckpoint: a checkpoint holding a PyTorch model or its state dict, as in ``ray.train.torch``."""

from __future__ import annotations

import collections
import os
import warnings
from typing import Any, ClassVar

import torch
from torch.nn.modules.utils import consume_prefix_in_state_dict_if_present

from trainers._internal.session.framework_checkpoint import FrameworkCheckpoint


def _strip_ddp_prefix(state_dict: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``state_dict`` whose keys lose DistributedDataParallel's ``module.`` prefix."""
    copied = collections.OrderedDict(state_dict)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        # load_state_dict reads per-module versions from here; its keys carry the prefix too.
        copied._metadata = collections.OrderedDict(metadata)  # type: ignore[attr-defined]  # the attribute torch's state_dict() sets on its dict
    consume_prefix_in_state_dict_if_present(copied, "module.")
    return copied


class TorchCheckpoint(FrameworkCheckpoint):
    """A checkpoint with one file, ``model.pt``: a model's state dict (recommended) or a whole model.

    ``TorchCheckpoint.from_state_dict(model.state_dict())`` saves the weights (the
    ``module.`` prefix of a DistributedDataParallel model is dropped), and
    ``checkpoint.get_model(MyModel())`` loads them into a fresh model.
    """

    MODEL_FILENAME: ClassVar[str] = "model.pt"
    _INSTEAD: ClassVar[str] = "trainers.Checkpoint with torch.save/torch.load of a state dict"

    @classmethod
    def from_state_dict(cls, state_dict: dict[str, Any], *, preprocessor: Any | None = None) -> TorchCheckpoint:
        """A checkpoint in a new temporary folder holding ``state_dict`` (and ``preprocessor``, if given)."""
        if not isinstance(state_dict, dict):
            raise TypeError(
                f"TorchCheckpoint.from_state_dict(state_dict={type(state_dict).__name__}): pass model.state_dict(), a dict."
            )
        stripped = _strip_ddp_prefix(state_dict)
        return cls._from_saved(
            lambda path: torch.save(stripped, path), preprocessor=preprocessor, path=None, method="from_state_dict"
        )

    @classmethod
    def from_model(cls, model: torch.nn.Module, *, preprocessor: Any | None = None) -> TorchCheckpoint:
        """A checkpoint in a new temporary folder holding the whole ``model``, pickled.

        Loading it runs pickled code: prefer ``from_state_dict``, which stores weights only.
        """
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"TorchCheckpoint.from_model(model={type(model).__name__}): pass a torch.nn.Module.")
        warnings.warn(
            "TorchCheckpoint.from_model pickles the whole module, and loading a pickle can run any code: "
            "prefer TorchCheckpoint.from_state_dict.",
            DeprecationWarning,
            stacklevel=2,
        )
        return cls._from_saved(
            lambda path: torch.save(model, path), preprocessor=preprocessor, path=None, method="from_model"
        )

    def get_model(self, model: torch.nn.Module | None = None) -> torch.nn.Module:
        """The model stored in this checkpoint, on the CPU.

        For a state-dict checkpoint pass ``model`` (a freshly built module): the weights are
        loaded into it and it is returned. For a whole-model checkpoint ``model`` is not needed
        (and is ignored, with a warning). The file is unpickled: load only checkpoints you trust.

        Raises:
            FileNotFoundError: the checkpoint has no ``model.pt``.
            ValueError: it holds a state dict and no ``model`` was given.
        """
        with self._model_file() as path:
            saved = torch.load(path, map_location="cpu", weights_only=False)
        if isinstance(saved, torch.nn.Module):
            if model is not None:
                warnings.warn(
                    "TorchCheckpoint.get_model: the checkpoint holds a whole model; the model argument is ignored.",
                    stacklevel=2,
                )
            return saved
        if isinstance(saved, dict):
            if model is None:
                raise ValueError(
                    "TorchCheckpoint.get_model(): the checkpoint holds a state dict; pass a freshly built module, "
                    "get_model(MyModel()), to load it into."
                )
            model.load_state_dict(saved)
            return model
        raise ValueError(
            f"TorchCheckpoint.get_model: {os.path.basename(path)} holds a {type(saved).__name__}; "
            "expected a torch.nn.Module or a state dict."
        )
