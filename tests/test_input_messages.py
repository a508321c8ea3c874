"""Each bad input a user can give the flows and the storage layer fails with an error that names
the field and says what to give instead, before anything runs (pure checks: no Ray, no Prefect).

Found by a line-coverage run of the whole suite (2026-12-03): these messages had no test, and one
form they guard (a random search's ``randint`` with fractional bounds) failed later, in
``random.randrange``, with an error that named neither the parameter nor the fix.
"""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from storage.filesystem import resolve_filesystem
from storage.layout import check_dir_name
from tasks.params import RunSettings, Validation, import_function, import_object, resolve_train_loop
from tasks.sweep import Distribution, Search
from tasks.train import _callbacks

NOT_A_CALLBACK = 3


@pytest.mark.parametrize(
    ("draw", "within"),
    [
        ({"kind": "uniform", "low": -1, "high": 1}, lambda v: isinstance(v, float) and -1 <= v < 1),
        ({"kind": "loguniform", "low": 1e-4, "high": 1e-1}, lambda v: 1e-4 <= v < 1e-1),
        ({"kind": "randint", "low": 2, "high": 5}, lambda v: type(v) is int and 2 <= v < 5),
        ({"kind": "choice", "values": ["relu", "tanh"]}, lambda v: v in ("relu", "tanh")),
    ],
)
def test_every_kind_of_random_draw_stays_in_its_range(draw, within):
    distribution = Distribution(**draw)
    rng = random.Random(0)
    values = [distribution.sample(rng) for _ in range(200)]
    assert all(within(v) for v in values)
    assert len(set(values)) > 1


@pytest.mark.parametrize(
    ("draw", "message"),
    [
        ({"kind": "choice", "values": []}, r"kind='choice' needs a non-empty 'values' list and no low/high"),
        ({"kind": "choice", "values": [1], "low": 0}, r"kind='choice' needs a non-empty 'values' list"),
        ({"kind": "uniform", "low": 0, "high": 1, "values": [1]}, r"takes low and high, not values=\[1\]; use kind="),
        ({"kind": "uniform", "low": 1}, r"kind='uniform' needs low < high; got low=1.0, high=None"),
        ({"kind": "loguniform", "low": 0, "high": 1}, r"kind='loguniform' needs low > 0; got low=0.0"),
        ({"kind": "randint", "low": 1.5, "high": 2}, r"kind='randint' needs whole numbers; got low=1.5, high=2.0"),
    ],
)
def test_a_bad_random_draw_names_its_kind_and_the_fix(draw, message):
    with pytest.raises(ValidationError, match=message):
        Search(metric="loss", random={"lr": draw})


@pytest.mark.parametrize(
    ("search", "message"),
    [
        ({"grid": {"lr": [], "wd": [0.1]}}, r"search.grid: \['lr'\] have no values; give each at least one"),
        (
            {"grid": {"lr": [0.1]}, "random": {"lr": {"kind": "uniform", "low": 0, "high": 1}}},
            r"search: \['lr'\] are in both grid and random; keep each parameter in one of them",
        ),
    ],
)
def test_a_bad_search_names_the_parameters_and_the_fix(search, message):
    with pytest.raises(ValidationError, match=message):
        Search(metric="loss", **search)


def test_a_bad_import_path_names_the_field_and_what_is_missing():
    with pytest.raises(ValidationError, match=r"callbacks='no_colon': name it as package.module:name, e.g."):
        RunSettings(callbacks=["no_colon"])
    with pytest.raises(ValidationError, match=r"validation.fn='a b:c': name it as package.module:name"):
        Validation(fn="a b:c")
    with pytest.raises(ValueError, match=r"train_loop='no_such_module:f': cannot import 'no_such_module'"):
        resolve_train_loop("no_such_module:f")
    with pytest.raises(ValueError, match=r"validation_fn='random:no_such': module 'random' has no 'no_such'"):
        import_object("validation_fn", "random:no_such")
    with pytest.raises(ValueError, match=r"train_loop='math:pi' names a float, not a function"):
        import_function("train_loop", "math:pi")
    assert resolve_train_loop("random:shuffle") is random.shuffle


def test_a_callback_that_is_not_a_user_callback_is_named():
    path = f"{__name__}:NOT_A_CALLBACK"
    with pytest.raises(ValueError, match=rf"callbacks: '{path}' is not a trainers.UserCallback subclass"):
        _callbacks([path])


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", r"report\(checkpoint_dir_name\)='': must be a non-empty folder name such as 'epoch_3'"),
        ("a/b", r"must be one folder name directly inside the run folder, without '/' or '..'; put the step"),
        ("..", r"must be one folder name directly inside the run folder"),
        (".hidden", r"names starting with '.' and .* are flowtrain's own files in the run folder; choose another"),
        ("run.json", r"names starting with '.' and .* are flowtrain's own files"),
    ],
)
def test_a_checkpoint_folder_name_that_cannot_be_one_says_why(name, message):
    with pytest.raises(ValueError, match=message):
        check_dir_name(name)
    assert check_dir_name("epoch_3") == "epoch_3"


def test_a_relative_storage_path_asks_for_an_absolute_one():
    with pytest.raises(ValueError, match=r"storage path 'runs/here' is relative: give an absolute path or a URI"):
        resolve_filesystem("runs/here")
