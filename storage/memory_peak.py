"""``MemoryPeak``: the most memory one rank's process held, as a worker sends it and run.json keeps
it. A module of its own: every worker imports it, and none needs the rest of ``storage.health``."""

from __future__ import annotations

import dataclasses

from storage.codec import Record


@dataclasses.dataclass(frozen=True)
class MemoryPeak(Record):
    """The most memory one rank's process has held in this attempt: its resident set (RSS) and,
    when it used CUDA, what PyTorch's caching allocator allocated and reserved on its device."""

    JSON_OMITS_DEFAULTS = True  # None figures are not written

    rss_bytes: int
    cuda_allocated_bytes: int | None = None
    cuda_reserved_bytes: int | None = None
    #: The tightest memory limit on the process when it was measured (its cgroup's, or
    #: ``RLIMIT_AS``), None when there is none.
    limit_bytes: int | None = None

    def at_least(self, other: MemoryPeak | None) -> MemoryPeak:
        """The larger of the two peaks, figure by figure (this peak's limit)."""
        if other is None:
            return self
        return MemoryPeak(
            max(self.rss_bytes, other.rss_bytes),
            _larger(self.cuda_allocated_bytes, other.cuda_allocated_bytes),
            _larger(self.cuda_reserved_bytes, other.cuda_reserved_bytes),
            self.limit_bytes,
        )

    def describe(self) -> str:
        """``"RSS 1.2 GiB"``, with its limit and the CUDA figures when there are any."""
        text = f"RSS {_size(self.rss_bytes)}"
        if self.limit_bytes is not None:
            text += f" of a {_size(self.limit_bytes)} limit"
        if self.cuda_allocated_bytes is not None:
            text += f", CUDA allocated {_size(self.cuda_allocated_bytes)}"
        if self.cuda_reserved_bytes is not None:
            text += f", reserved {_size(self.cuda_reserved_bytes)}"
        return text

    @property
    def near_limit(self) -> bool:
        """Whether the resident set was within a fifth of the process's limit: a process killed
        then was most likely killed for memory."""
        return self.limit_bytes is not None and self.rss_bytes >= 0.8 * self.limit_bytes


def _larger(first: int | None, second: int | None) -> int | None:
    return max((value for value in (first, second) if value is not None), default=None)


def _size(num_bytes: int) -> str:
    """``num_bytes`` in B, KiB, MiB or GiB, to 3 significant digits (never in exponent form)."""
    value, units = float(num_bytes), ["B", "KiB", "MiB", "GiB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:.0f} {units[0]}" if value >= 100 else f"{value:.3g} {units[0]}"
