"""What the GBDT core needs of one boosting library: the adapter each library's trainer gives."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

#: This worker's part of each dataset, read one at a time: (name, features, labels), "train" first.
Shards = Iterator[tuple[str, Any, Any]]


@dataclasses.dataclass(frozen=True)
class Library:
    """One boosting library as the core uses it; it travels to the workers with the parameter form."""

    #: The package's name, as users import it ("xgboost"); the trainer's config argument is ``<name>_config``.
    name: str
    #: The library's train function; the parameter form's extra keyword arguments are checked against it.
    train: Callable[..., Any]
    #: The arguments of ``train`` the parameter form sets itself.
    reserved: tuple[str, ...]
    #: The dtype the workers read features in.
    feature_dtype: Any
    #: The library's ``RayTrainReportCallback``; its ``get_model(checkpoint)`` reads a model back.
    report_callback: type[Any]
    #: How many boosting rounds a model holds.
    num_rounds: Callable[[Any], int]
    #: ``boost(form, shards, booster, num_boost_round, callbacks, train_kwargs)``: build the library's
    #: datasets from this worker's shards and train ``num_boost_round`` more rounds on top of ``booster``
    #: (None: from scratch).
    boost: Callable[[Any, Shards, Any, int, list, dict], None]
