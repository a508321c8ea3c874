"""Where everything of one run lives under ``{storage_path}/{name}``."""

from __future__ import annotations

import dataclasses

SNAPSHOT = "run.json"
SNAPSHOT_PREVIOUS = "run.json.prev"
SNAPSHOT_NEW = "run.json.new"
LEASE = "lease.json"
STAGING = ".staging"
COMMIT_MARKER = ".committed"
CHECKPOINT_PREFIX = "checkpoint_"


@dataclasses.dataclass(frozen=True)
class RunLayout:
    """Paths of one run's files, inside its filesystem. Workers get a copy to know where to upload."""

    run_path: str

    def _join(self, *parts: str) -> str:
        return "/".join([self.run_path.rstrip("/"), *parts])

    @property
    def snapshot(self) -> str:
        return self._join(SNAPSHOT)

    @property
    def snapshot_previous(self) -> str:
        return self._join(SNAPSHOT_PREVIOUS)

    @property
    def snapshot_new(self) -> str:
        return self._join(SNAPSHOT_NEW)

    @property
    def lease(self) -> str:
        return self._join(LEASE)

    @property
    def staging_root(self) -> str:
        return self._join(STAGING)

    def staging_path(self, attempt: int, report_index: int) -> str:
        """Where ranks upload the checkpoint files of their ``report_index``-th report in ``attempt``."""
        return self._join(STAGING, f"attempt_{attempt:04d}", f"report_{report_index:06d}")

    @staticmethod
    def checkpoint_name(seq: int) -> str:
        return f"{CHECKPOINT_PREFIX}{seq:06d}"

    def checkpoint_path(self, seq: int) -> str:
        """The folder of the committed checkpoint number ``seq``."""
        return self._join(self.checkpoint_name(seq))
