"""The one codec of the run record's typed records (run.json, the health files, the doctor's
report): a dataclass to a JSON-ready dict and back, driven by its fields and type hints (nested
records, tuples as lists, int keys as text, unknown keys ignored, missing ones defaulted; see
docs/design.md). A float hinted ``Round6`` (``Round4``) is written rounded to 6 (4) decimals; a
value hinted ``Any`` (user metrics) passes as it is, for ``storage.metric_values`` to tag. A class
may say ``JSON_OMITS_DEFAULTS = True`` (fields at their default are not written) or
``JSON_AS_LIST = True`` (written as a list of its values, read by position); a field with
``metadata=UNWRITTEN`` is not part of the record.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TypeVar

from storage.metric_values import Encoded
from storage.metric_values import encode as encode_values

T = TypeVar("T")

#: Floats written rounded to 6 and to 4 decimals (the int is the number of decimals).
Round6 = Annotated[float, 6]
Round4 = Annotated[float, 4]

#: A field's metadata for what a record holds in memory but never writes.
UNWRITTEN: Mapping[str, bool] = types.MappingProxyType({"written": False})


class Record:
    """A dataclass written and read by this codec, as ``record.to_json()`` and
    ``Kind.from_json(body)``."""

    def to_json(self) -> Any:
        return to_json(self)

    @classmethod
    def from_json(cls: type[T], body: Any) -> T:
        return from_json(cls, body)


def to_json(record: Any) -> Any:
    """``record`` (a dataclass) as a dict, or a list for a ``JSON_AS_LIST`` class. A
    ``JSON_ONCE`` class (a frozen record never changed once made) is encoded once and its body
    kept on it: run.json rewrites such records at every commit."""
    kind: Any = type(record)
    once = getattr(kind, "JSON_ONCE", False)
    if once and _ENCODED in record.__dict__:
        return record.__dict__[_ENCODED]
    values = [(field, hint, getattr(record, field.name)) for field, hint in _fields(kind)]
    if getattr(kind, "JSON_AS_LIST", False):
        body: Any = [_encode(hint, value) for _, hint, value in values]
    else:
        if getattr(kind, "JSON_OMITS_DEFAULTS", False):
            values = [(field, hint, value) for field, hint, value in values if value != _default(field)]
        body = {field.name: _encode(hint, value) for field, hint, value in values}
    if once:
        body = Encoded(encode_values(body))  # its metric values tagged once too (``storage.metric_values``)
        object.__setattr__(record, _ENCODED, body)  # past the frozen dataclass's own __setattr__
    return body


#: Where a ``JSON_ONCE`` record keeps its encoded body (not a field: equality and repr ignore it).
_ENCODED = "_codec_body"


def from_json(kind: type[T], body: Any) -> T:
    """The ``kind`` (a dataclass) that ``body`` holds: a dict by name, or a list by position."""
    fields = _fields(typing.cast(Any, kind))
    if isinstance(body, list):
        pairs = list(zip(fields, body, strict=False))
    else:
        pairs = [((field, hint), body[field.name]) for field, hint in fields if field.name in body]
    return kind(**{field.name: _decode(hint, value) for (field, hint), value in pairs})


@functools.cache
def _fields(kind: Any) -> tuple[tuple[dataclasses.Field, Any], ...]:
    hints = typing.get_type_hints(kind, include_extras=True)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(kind) if f.metadata.get("written", True))


def _default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default  # MISSING for a field without one: never equal to a value


def _parts(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    """``hint`` without ``| None``, as (its origin, its arguments): ``(tuple, (int, ...))``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return (typing.get_origin(hint) or hint), typing.get_args(hint)


def _items(origin: Any, args: tuple[Any, ...]) -> Any:
    """The hint of each item of a tuple or list: one per position, or the same for all."""
    if origin is tuple and args and args[-1] is not Ellipsis:
        return args
    return itertools.repeat(args[0] if args else Any)


@functools.cache
def _encoding(hint: Any) -> tuple[int | None, Any, tuple[Any, ...], bool]:
    """What ``_encode`` needs of ``hint``, worked out once per hint (a commit writes hundreds of
    values): the digits an ``Annotated`` float rounds to, its origin and arguments, and whether it is
    a record."""
    if typing.get_origin(hint) is Annotated:
        return typing.get_args(hint)[1], None, (), False
    origin, args = _parts(hint)
    return None, origin, args, dataclasses.is_dataclass(origin)


def _encode(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    digits, origin, args, is_record = _encoding(hint)
    if digits is not None:
        return round(value, digits)
    if is_record:
        return to_json(value)
    if origin in (tuple, list, Sequence):
        return [_encode(item, v) for item, v in zip(_items(origin, args), value, strict=False)]
    if origin in (dict, Mapping):
        key, item = args or (Any, Any)
        if key is int:
            return {str(k): _encode(item, v) for k, v in sorted(value.items())}
        return {k: _encode(item, v) for k, v in value.items()}
    return value


def _decode(hint: Any, body: Any) -> Any:
    if body is None:
        return None
    if typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    origin, args = _parts(hint)
    if isinstance(origin, type) and dataclasses.is_dataclass(origin):
        return from_json(origin, body)
    if origin in (tuple, list, Sequence):
        items = [_decode(item, b) for item, b in zip(_items(origin, args), body, strict=False)]
        return items if origin is list else tuple(items)
    if origin in (dict, Mapping):
        key, item = args or (Any, Any)
        return {(int(k) if key is int else k): _decode(item, v) for k, v in body.items()}
    if origin is float and isinstance(body, int) and not isinstance(body, bool):
        return float(body)
    return body
