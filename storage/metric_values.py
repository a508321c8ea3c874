"""Metric values in run.json: JSON where they are JSON, a tagged form where they are not.

``report()`` takes any picklable value, as Ray Train does (what comes back, and why to trust
run.json as you trust the checkpoints: docs/getting-started.md, "Metric values"). A tuple, a
datetime or date (ISO text; one in a named time zone is pickled), a ``Decimal`` (its text) and
anything else picklable (base64, with its repr) is written as ``{"__flowtrain_value__": TYPE,
"value": ...}``; subclasses of int, float and str (a numpy float64, an IntEnum) as plain numbers
and text.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import logging
import pickle
from typing import Any

#: The key that marks an encoded value; a user's dict holding it is itself encoded.
TAG = "__flowtrain_value__"

logger = logging.getLogger(__name__)


class Encoded(dict):
    """A body already in ``encode``'s form, which ``encode`` passes as it is: a record encoded once
    (``codec``'s ``JSON_ONCE``) is not walked again at every write."""

    def text(self) -> str:
        """The body as ``json.dumps`` writes it, made at the first call."""
        if "_text" not in self.__dict__:
            self._text = json.dumps(self, allow_nan=True)
        return self._text


def encode(value: Any) -> Any:
    """``value`` as something ``json.dumps`` writes and ``decode`` reads back."""
    if value is None or isinstance(value, (str, int, float)):  # bool is an int
        return value
    if isinstance(value, list):
        return [encode(item) for item in value]
    if type(value) is dict and all(isinstance(key, str) for key in value):
        encoded = {key: encode(item) for key, item in value.items()}
        return {TAG: "dict", "value": encoded} if TAG in value else encoded
    if type(value) is Encoded:
        return value
    if type(value) is tuple:
        return {TAG: "tuple", "value": [encode(item) for item in value]}
    # A fixed offset survives ISO text; a named zone (zoneinfo) is pickled to keep its rules.
    fixed_offset = isinstance(getattr(value, "tzinfo", None), (type(None), datetime.timezone))
    if type(value) in (datetime.datetime, datetime.date) and fixed_offset:
        return {TAG: type(value).__name__, "value": value.isoformat()}
    if type(value) is decimal.Decimal:
        return {TAG: "decimal", "value": str(value)}
    try:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as error:  # noqa: BLE001 - pickling raises TypeError, PicklingError, AttributeError, ...
        logger.warning(
            "run.json: a %s value cannot be pickled (%s); its repr is stored instead: %.200r",
            type(value).__name__,
            error,
            value,
        )
        return repr(value)
    return {TAG: "pickle", "value": base64.b64encode(data).decode("ascii"), "repr": repr(value)[:200]}


def decode(value: Any) -> Any:
    """What ``encode`` wrote, as the value it was (as near as the notes above allow)."""
    if isinstance(value, list):
        return [decode(item) for item in value]
    if not isinstance(value, dict):
        return value
    kind = value.get(TAG)
    if kind is None:
        return {key: decode(item) for key, item in value.items()}
    inner: Any = value.get("value")  # its type follows from the tag
    if kind == "dict":
        return {key: decode(item) for key, item in inner.items()}
    if kind == "tuple":
        return tuple(decode(item) for item in inner)
    if kind == "datetime":
        return datetime.datetime.fromisoformat(inner)
    if kind == "date":
        return datetime.date.fromisoformat(inner)
    if kind == "decimal":
        return decimal.Decimal(inner)
    if kind == "pickle":
        try:
            return pickle.loads(base64.b64decode(inner))
        except Exception as error:  # noqa: BLE001 - e.g. its class is not importable here
            logger.warning(
                "run.json: a stored metric value cannot be unpickled here (%s); its repr is given: %s",
                error,
                value.get("repr"),
            )
            return value.get("repr")
    return value  # written by a newer flowtrain: left as it is
