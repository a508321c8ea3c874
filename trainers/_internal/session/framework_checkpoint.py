"""The common part of ``TorchCheckpoint``, ``XGBoostCheckpoint`` and ``LightGBMCheckpoint``: a
``trainers.Checkpoint`` holding one model file and, optionally, a fitted Ray Data preprocessor
stored in its metadata as Ray Train stores it."""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, TypeVar

from storage import Checkpoint
from storage.filesystem import pafs

#: Metadata key of the pickled preprocessor (Ray Train's key, so either side reads the other's).
PREPROCESSOR_KEY = "preprocessor_pkl"

_Self = TypeVar("_Self", bound="FrameworkCheckpoint")


class FrameworkCheckpoint(Checkpoint):
    """A checkpoint that knows the file its framework's model is saved in. Ray Train deprecated
    these classes; they are kept so its code keeps working (the first built warns)."""

    #: The model's file name inside the checkpoint folder.
    MODEL_FILENAME: ClassVar[str] = ""
    #: Other file names ``get_model`` accepts when ``MODEL_FILENAME`` is absent (the report
    #: callback's default, so the trainers' checkpoints load too).
    _OTHER_MODEL_FILENAMES: ClassVar[tuple[str, ...]] = ()
    #: What to use instead, for the deprecation warning.
    _INSTEAD: ClassVar[str] = "trainers.Checkpoint"
    _warned: ClassVar[bool] = False

    def __init__(self, path: str | os.PathLike, filesystem: pafs.FileSystem | None = None) -> None:
        cls = type(self)
        if not cls.__dict__.get("_warned", False):
            cls._warned = True
            warnings.warn(
                f"{cls.__name__} is kept for Ray Train code (Ray deprecated it); new code can use {cls._INSTEAD}.",
                DeprecationWarning,
                stacklevel=3,
            )
        super().__init__(path, filesystem)

    def get_preprocessor(self) -> Any | None:
        """The preprocessor stored with ``set_preprocessor`` (or ``from_model(preprocessor=...)``), or None.

        It is unpickled: load checkpoints only from sources you trust.
        """
        blob = self.get_metadata().get(PREPROCESSOR_KEY)
        if blob is None:
            return None
        import ray.cloudpickle

        return ray.cloudpickle.loads(bytes.fromhex(blob))

    def set_preprocessor(self, preprocessor: Any) -> None:
        """Store a fitted preprocessor (e.g. a ``ray.data.preprocessor.Preprocessor``) with the checkpoint."""
        import ray.cloudpickle

        self.update_metadata({PREPROCESSOR_KEY: ray.cloudpickle.dumps(preprocessor).hex()})

    @classmethod
    def _from_saved(
        cls: type[_Self],
        save: Callable[[str], None],
        *,
        preprocessor: Any | None,
        path: str | os.PathLike | None,
        method: str,
    ) -> _Self:
        """A checkpoint of ``path`` (a new temporary folder by default) after ``save(model file)``."""
        if path is not None and not os.path.isdir(os.fspath(path)):
            raise ValueError(
                f"{cls.__name__}.{method}(path={os.fspath(path)!r}): must be an existing folder "
                "(create it first, ideally empty: the whole folder becomes the checkpoint)."
            )
        folder = os.fspath(path) if path is not None else tempfile.mkdtemp(prefix="flowtrain-checkpoint-")
        save(os.path.join(folder, cls.MODEL_FILENAME))
        checkpoint = cls.from_directory(folder)
        if preprocessor is not None:
            checkpoint.set_preprocessor(preprocessor)
        return checkpoint

    @contextlib.contextmanager
    def _model_file(self) -> Iterator[str]:
        """The local path of the model file, with an error naming what the checkpoint holds."""
        names = (self.MODEL_FILENAME, *self._OTHER_MODEL_FILENAMES)
        with self.as_directory() as folder:
            for name in names:
                if os.path.isfile(os.path.join(folder, name)):
                    yield os.path.join(folder, name)
                    return
            raise FileNotFoundError(
                f"{type(self).__name__}.get_model: the checkpoint {self.path} has no "
                f"{' or '.join(repr(n) for n in names)}; it holds {sorted(os.listdir(folder))}. "
                f"Build it with {type(self).__name__}.from_model, or load another file name with "
                "the report callback's get_model(checkpoint, filename=...)."
            )
