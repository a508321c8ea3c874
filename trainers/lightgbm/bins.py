"""Bin boundaries computed from every worker's rows, so distributed LightGBM bins as one process does.

LightGBM turns each feature into at most ``max_bin`` bins, with boundaries found in a sample of
the training rows (``bin_construct_sample_cnt``, 200 000 by default). In distributed training
each worker only holds its shard, and LightGBM takes each feature's boundaries from one
worker's shard alone: the trees then split on other thresholds than a single process would
and the model is measurably worse on small data. ``shared_bins`` gathers a sample from every
worker instead (all rows, when the whole training set is no larger than the sample size) and
builds the same reference ``lightgbm.Dataset`` on every worker; training datasets made with
``reference=`` it use its bins.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import lightgbm
import numpy as np

#: LightGBM's parameter names for the sample size, and its default.
_SAMPLE_ALIASES = ("bin_construct_sample_cnt", "subsample_for_bin")
_DEFAULT_SAMPLE = 200_000
#: Network parameters: not for a Dataset (the reference is built before the network is up).
_NETWORK_KEYS = {
    "machines",
    "machine_list_filename",
    "machine_list_file",
    "machine_list",
    "mlist",
    "local_listen_port",
    "local_port",
    "port",
    "num_machines",
    "num_machine",
    "time_out",
}

_exchanges = itertools.count()
#: This worker's handle on its attempt's rendezvous actor, by name.
_actors: dict[str, Any] = {}


class Rendezvous:
    """A small actor through which the workers of one attempt swap values (all-gather)."""

    def __init__(self, world_size: int) -> None:
        self._world_size = world_size
        self._rounds: dict[str, tuple[dict[int, Any], asyncio.Event]] = {}

    async def exchange(self, key: str, rank: int, value: Any) -> list[Any]:
        """Give ``value``; once every rank gave one under ``key``, get all of them in rank order."""
        values, complete = self._rounds.setdefault(key, ({}, asyncio.Event()))
        values[rank] = value
        if len(values) == self._world_size:
            complete.set()
        await complete.wait()
        return [values[r] for r in range(self._world_size)]


def _all_gather(key: str, value: Any) -> list[Any]:
    import ray

    from trainers.context import get_context
    from trainers.lightgbm import config

    if config._rendezvous is None:
        raise RuntimeError(
            "shared_bins() with several workers works only inside a LightGBMTrainer's training function."
        )
    context = get_context()
    actor = _actors.get(config._rendezvous)
    if actor is None:
        # The first rank to ask creates it; it dies with that worker. Every worker keeps its
        # handle: Ray removes an actor nobody holds a handle to, even between two exchanges.
        actor = _actors[config._rendezvous] = (
            ray.remote(Rendezvous)
            .options(name=config._rendezvous, get_if_exists=True, num_cpus=0)
            .remote(context.get_world_size())
        )
    return ray.get(actor.exchange.remote(key, context.get_world_rank(), value))  # type: ignore[union-attr]  # Ray's ActorHandle types an async method without its .remote


def _rows(data: Any, index: np.ndarray) -> Any:
    return data.iloc[index] if hasattr(data, "iloc") else np.asarray(data)[index]


def _concat(parts: list[Any]) -> Any:
    if hasattr(parts[0], "iloc"):
        import pandas as pd

        return pd.concat(parts, ignore_index=True)
    return np.concatenate(parts)


def shared_bins(data: Any, params: dict[str, Any] | None = None, **dataset_kwargs: Any) -> lightgbm.Dataset:
    """A reference ``lightgbm.Dataset`` whose bins come from every worker's rows.

    Call it on every worker with this worker's features (a numpy array or pandas DataFrame) and
    the parameters you give ``lightgbm.train``, then build the training set with it::

        reference = trainers.lightgbm.shared_bins(x, params)
        train_set = lightgbm.Dataset(x, label=y, reference=reference)

    With one worker it simply bins ``data``. ``dataset_kwargs`` (``feature_name=``,
    ``categorical_feature=``, ...) go to the reference Dataset; pass the same to your training set.
    """
    from trainers.context import get_context

    params = {k: v for k, v in (params or {}).items() if k not in _NETWORK_KEYS}
    context = get_context()
    sample = data
    if context.get_world_size() > 1:
        call = next(_exchanges)
        counts = _all_gather(f"{call}/rows", len(data))
        wanted = next((int(params[name]) for name in _SAMPLE_ALIASES if name in params), _DEFAULT_SAMPLE)
        total = sum(counts)
        take = len(data) if total <= wanted else min(len(data), round(wanted * len(data) / total))
        seed = int(params.get("data_random_seed", params.get("seed", 1))) + context.get_world_rank()
        index = np.sort(np.random.default_rng(seed).choice(len(data), size=take, replace=False))
        import ray

        # A list around the reference keeps Ray from fetching the rows into the rendezvous actor.
        refs = _all_gather(f"{call}/sample", [ray.put(_rows(data, index))])
        sample = _concat(ray.get([ref for (ref,) in refs]))
    reference = lightgbm.Dataset(sample, params=params, free_raw_data=True, **dataset_kwargs)
    return reference.construct()
