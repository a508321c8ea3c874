"""As many Parquet footer readers as a dataset's files can use, not Ray Data's fixed 32.

Every time Ray Data 2.60 executes a ``read_parquet`` dataset (each epoch of a ``streaming_split``,
for one), it lists the files and starts a pool of ``FooterReader`` actors, 32 of them
unless ``RAY_DATA_PARQUET_FOOTER_NUM_ACTORS`` says otherwise, then hands them the files 10 at a
time and kills the pool when the listing ends. Each actor is a new Python process that imports Ray
Data and pyarrow. With 8 files one actor does all the work, and the other 31 only take CPU from
the training workers starting beside them: on 2 cores a 250k-row epoch waited 2.6-4.0 s for its
first batch, against 1.4 s with one actor.

``right_size_footer_readers`` makes a dataset's Parquet listings start one actor per batch of
files they will actually read (at most Ray Data's setting): the listing looks at the first
``actors x batch`` files before starting the pool. Nothing else about the read changes.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Iterator

try:
    from ray.data._internal.datasource_v2.formats.parquet.footer_file_indexer import FooterFileIndexer
except ImportError:  # a Ray Data without the footer indexer: nothing to right-size
    FooterFileIndexer = None  # type: ignore[assignment,misc]


def right_size_footer_readers(dataset: Any) -> None:
    """Let every Parquet listing in ``dataset``'s plan start only the footer readers it needs.

    Changes the dataset in place (its listings' indexers); a dataset with no Parquet V2 listing, or a
    Ray Data whose internals differ from those this module knows, is left as it is.
    """
    if FooterFileIndexer is None:
        return
    plan = getattr(dataset, "_logical_plan", None)
    for op in _operators(getattr(plan, "dag", None)):
        indexer = getattr(op, "file_indexer", None)
        if type(indexer) is FooterFileIndexer and _has_pool_settings(indexer):
            indexer.__class__ = RightSizedFooterIndexer


def _operators(op: Any) -> Iterator[Any]:
    seen: set[int] = set()
    pending = [op] if op is not None else []
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        pending.extend(getattr(current, "input_dependencies", None) or [])


def _has_pool_settings(indexer: Any) -> bool:
    return all(hasattr(indexer, name) for name in ("_num_actors", "_footer_batch_size", "_iter_file_infos_for_list"))


if FooterFileIndexer is not None:

    class RightSizedFooterIndexer(FooterFileIndexer):  # type: ignore[misc,valid-type]
        """Ray Data's Parquet footer indexer, with a pool no larger than its files need."""

        def _iter_file_infos_for_list(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
            # Ray Data asks for the files first and starts the pool right after, from
            # ``self._num_actors``. Listing is lazy, so read ahead as far as a full pool could take
            # (the rest of a bigger listing stays lazy) and size the pool to what was found. The
            # configured size is kept apart: a later listing of a grown folder may need it all.
            limit = self.__dict__.setdefault("_configured_num_actors", max(1, self._num_actors))
            per_actor = max(1, self._footer_batch_size)
            files = iter(super()._iter_file_infos_for_list(*args, **kwargs))
            ahead = list(itertools.islice(files, limit * per_actor))
            self._num_actors = max(1, min(limit, math.ceil(len(ahead) / per_actor)))
            return itertools.chain(ahead, files)
