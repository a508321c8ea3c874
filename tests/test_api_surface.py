"""Every public name of the installed ``ray.train`` (2.60) exists in flowtrain and takes the same
parameters: names, order, how they are passed, and defaults that are plain values.

A Ray Train user changes imports and nothing else; this holds only where the API exists. The
few deliberate differences are listed in ``DIFFERENCES`` with the reason for each; anything else
missing fails here, one test per public name.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import pathlib
import warnings
from typing import Any

import pytest

#: Ray Train's public modules and ours, side by side.
MODULES = {
    "ray.train": "trainers",
    "ray.train.torch": "trainers.torch",
    "ray.train.xgboost": "trainers.xgboost",
    "ray.train.lightgbm": "trainers.lightgbm",
    "ray.train.lightning": "trainers.lightning",
    "ray.train.huggingface.transformers": "trainers.huggingface.transformers",
    "ray.train.collective": "trainers.collective",
    "ray.train.torch.xla": "trainers.torch.xla",
    "ray.train.tensorflow": "trainers.tensorflow",
    "ray.train.tensorflow.keras": "trainers.tensorflow.keras",
    "ray.train.v2.jax": "trainers.jax",
    "ray.air.integrations.mlflow": "trainers.integrations.mlflow",
}

#: Deliberate differences, each with its reason. Keys: "module.Name" (the whole name),
#: "module.Name(param)" (one parameter), or "module.Name.attribute" (one attribute): those are not
#: compared. A key ending in " (behaviour)" documents a name that is here with Ray's parameters but
#: behaves differently on purpose; it is still compared.
DIFFERENCES: dict[str, str] = {
    "ray.train.torch.accelerate (behaviour)": (
        "Ray 2.60 raises DeprecationWarning from accelerate, prepare_optimizer and backward; flowtrain "
        "warns with a DeprecationWarning and keeps Ray Train V1's working mixed precision, so V1 code "
        "moved here keeps training (code written for 2.60 never calls them)."
    ),
    "ray.train.TrainContext (behaviour)": (
        "Ray 2.60 raises DeprecationWarning from get_metadata() and get_trial_name(); flowtrain returns "
        "the trainer's metadata= and the run's name, since it keeps metadata= working."
    ),
    "ray.train.torch.TorchTrainer (behaviour)": (
        "Ray 2.60 raises DeprecationWarning for resume_from_checkpoint= and metadata=; issue 25 asks for "
        "resume_from_checkpoint to start a run with no checkpoint of its own, and metadata= reaches "
        "get_context().get_metadata()."
    ),
    "ray.train.get_all_reported_checkpoints (behaviour)": (
        "Listed in report order; Ray orders them by CheckpointConfig's score when one is set. Sort by "
        "ReportedCheckpoint.metrics yourself for a ranking."
    ),
    "ray.train.ValidationTaskConfig (behaviour)": (
        "A timeout_s <= 0 or fn_kwargs the validation function does not take raise ValueError/TypeError "
        "when built; Ray asserts, or finds out in the validation task."
    ),
    "ray.train.report (behaviour)": (
        "checkpoint_dir_name: a name the run already keeps is refused with ValueError (Ray mixes the two "
        "checkpoints' files); default names are checkpoint_NNNNNN (Ray: a timestamp). NO_UPLOAD takes a "
        "folder directly inside the run folder (Ray also accepts deeper ones)."
    ),
    "ray.train.SyncConfig": (
        "Deprecated in Ray Train V2 (its RunConfig raises DeprecationWarning when one is passed); "
        "flowtrain's RunConfig(sync_config=...) raises the same, so the class itself is not needed."
    ),
    "ray.train.RunConfig.storage_context": "Ray's internal storage object; flowtrain keeps run storage in storage.RunStorage.",
    "ray.train.ScalingConfig.from_placement_group_factory": (
        "Ray Train V1's Tune bridge; flowtrain's trainers.tune.trial_resources builds Tune resources from a ScalingConfig."
    ),
}

#: Parameters whose default differs on purpose (same meaning, another spelling), with the reason.
DEFAULT_DIFFERENCES: dict[str, str] = {}


def _public_names(module: Any) -> list[str]:
    if hasattr(module, "__all__"):
        return list(module.__all__)
    # A module without __all__ (ray.train.tensorflow.keras): the names Ray marks as public API there.
    return [
        name
        for name, obj in vars(module).items()
        if getattr(obj, "__module__", None) == module.__name__ and vars(obj).get("_annotated") == name
        if isinstance(obj, type) or callable(obj)
    ]


def _pairs() -> list[tuple[str, str, str]]:
    """(Ray module, our module, public name) for every public name of the installed Ray's modules."""
    pairs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for ray_name, ours in MODULES.items():
            module = importlib.import_module(ray_name)
            pairs.extend((ray_name, ours, name) for name in _public_names(module))
    return pairs


#: The public names of the pinned Ray, recorded so that collecting this module imports none of
#: Ray Train's framework modules (TensorFlow, Lightning, Transformers: a minute on 2 cores, in
#: every pytest-xdist worker). test_the_recorded_names_are_the_installed_rays_names keeps it true.
RECORDED = json.loads((pathlib.Path(__file__).parent / "ray_train_public_names.json").read_text())
PAIRS = [(ray_name, MODULES[ray_name], name) for ray_name, names in RECORDED["names"].items() for name in names]


def _signature(obj: Any) -> inspect.Signature | None:
    try:
        return _options_written_out(obj, inspect.signature(obj))
    except (TypeError, ValueError):
        return None


def _options_written_out(obj: Any, signature: inspect.Signature) -> inspect.Signature:
    """A framework trainer's signature with its ``**options`` (or GBDT's ``**kwargs``) replaced by
    the keywords they stand for, its config's and ``TrainerOptions``': a keyword Ray takes that
    neither names is then reported missing, as it would be from a written-out signature."""
    config_arg = getattr(obj, "_backend_config_arg", None)
    if not (isinstance(obj, type) and obj.__module__.startswith("trainers.")) or config_arg is None:
        return signature
    from trainers.data_parallel_trainer import TrainerOptions

    named = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    keywords = [k for k in (config_arg[0], *TrainerOptions.__annotations__) if k not in signature.parameters]
    return signature.replace(
        parameters=named + [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in keywords]
    )


def _plain(value: Any) -> Any:
    """A default as something comparable across the two libraries (None for "not comparable")."""
    if isinstance(value, enum.Enum):
        return ("enum", type(value).__name__, value.name)
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("value", value)
    return None


def parameter_problems(ray_obj: Any, our_obj: Any, label: str) -> list[str]:
    """What a call written for ``ray_obj`` would find different in ``our_obj``."""
    theirs, ours = _signature(ray_obj), _signature(our_obj)
    if theirs is None or ours is None:
        return []
    our_params = list(ours.parameters.values())
    by_name = {p.name: p for p in our_params}
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in our_params)
    problems = []
    positional_index = 0
    for param in theirs.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        key = f"{label}({param.name})"
        if key in DIFFERENCES:
            continue
        mine = by_name.get(param.name)
        if mine is None:
            if not takes_kwargs or param.kind is not param.KEYWORD_ONLY:
                problems.append(f"{key}: missing")
            continue
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            # A call may pass it by position: ours must sit at the same place.
            if our_params.index(mine) != positional_index or mine.kind not in (
                mine.POSITIONAL_ONLY,
                mine.POSITIONAL_OR_KEYWORD,
            ):
                problems.append(
                    f"{key}: Ray takes it as positional #{positional_index}, ours is {mine.kind.description} #{our_params.index(mine)}"
                )
            positional_index += 1
        elif mine.kind not in (mine.KEYWORD_ONLY, mine.POSITIONAL_OR_KEYWORD):
            problems.append(f"{key}: Ray takes it by keyword, ours cannot")
        if mine.default is mine.empty and param.default is not param.empty:
            # (Optional here but required in Ray is fine: every call written for Ray passes it.)
            problems.append(f"{key}: required here, optional in Ray")
        elif param.default is not param.empty and key not in DEFAULT_DIFFERENCES:
            theirs_default, ours_default = _plain(param.default), _plain(mine.default)
            if theirs_default is not None and theirs_default != ours_default:
                problems.append(f"{key}: default {param.default!r} in Ray, {mine.default!r} here")
    return problems


def member_problems(ray_obj: Any, our_obj: Any, label: str) -> list[str]:
    """Public attributes and methods of a Ray class missing from ours, or taking other parameters."""
    problems = []
    if isinstance(ray_obj, type) and issubclass(ray_obj, enum.Enum):
        missing = set(ray_obj.__members__) - set(getattr(our_obj, "__members__", {}))
        return [f"{label}.{name}: missing member" for name in sorted(missing)]
    for name in dir(ray_obj):
        if name.startswith("_") or f"{label}.{name}" in DIFFERENCES:
            continue
        if isinstance(ray_obj, type) and issubclass(ray_obj, BaseException) and hasattr(BaseException, name):
            continue
        if not hasattr(our_obj, name):
            problems.append(f"{label}.{name}: missing")
            continue
        theirs = inspect.getattr_static(ray_obj, name)
        if isinstance(theirs, (staticmethod, classmethod)) or inspect.isfunction(theirs):
            problems.extend(parameter_problems(getattr(ray_obj, name), getattr(our_obj, name), f"{label}.{name}"))
    return problems


@pytest.mark.parametrize("ray_module, our_module, name", PAIRS, ids=[f"{m}.{n}" for m, _, n in PAIRS])
def test_every_public_name_of_ray_train_exists_here_with_its_parameters(ray_module, our_module, name):
    label = f"{ray_module}.{name}"
    if label in DIFFERENCES:  # (a " (behaviour)" entry is another key: still compared)
        return
    ours_module = importlib.import_module(our_module)
    assert hasattr(ours_module, name), f"{our_module}.{name} is missing (Ray has {label})"
    assert name in getattr(ours_module, "__all__", [name]), f"{our_module}.__all__ lacks {name!r}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ray_obj = getattr(importlib.import_module(ray_module), name)
    our_obj = getattr(ours_module, name)
    if not callable(ray_obj) and not isinstance(ray_obj, type):
        assert our_obj == ray_obj, f"{our_module}.{name} = {our_obj!r}, Ray's is {ray_obj!r}"
        return
    problems = parameter_problems(ray_obj, our_obj, label)
    if isinstance(ray_obj, type):
        problems += member_problems(ray_obj, our_obj, label)
    assert not problems, "\n".join(problems)


def test_the_comparison_notices_a_missing_parameter_and_a_moved_one():
    """The checks above can fail: a stand-in that drops or reorders a parameter is caught."""

    def ray_style(metrics, checkpoint=None, *, mode="SYNC"):
        pass

    def drops_one(metrics, *, mode="SYNC"):
        pass

    def reorders(checkpoint=None, metrics=None, *, mode="SYNC"):
        pass

    def other_default(metrics, checkpoint=None, *, mode="ASYNC"):
        pass

    assert parameter_problems(ray_style, ray_style, "f") == []
    assert parameter_problems(ray_style, drops_one, "f") == ["f(checkpoint): missing"]
    assert any("positional #0" in p for p in parameter_problems(ray_style, reorders, "f"))
    assert parameter_problems(ray_style, other_default, "f") == ["f(mode): default 'SYNC' in Ray, 'ASYNC' here"]

    # A trainer's **options count only for the keywords TrainerOptions names.
    from trainers.torch import TorchTrainer

    def ray_trainer(train_loop_per_worker, *, torch_config=None, run_config=None, new_in_ray=None):
        pass

    assert parameter_problems(ray_trainer, TorchTrainer, "T") == ["T(new_in_ray): missing"]


def test_every_difference_listed_is_still_a_difference():
    """The list stays short: an entry Ray no longer has, or that flowtrain now matches, must go."""
    labels = {f"{m}.{n}" for m, _, n in PAIRS}
    for key in DIFFERENCES:
        base = key.removesuffix(" (behaviour)").split("(")[0]
        owner = base if base in labels else base.rpartition(".")[0]
        assert owner in labels, f"DIFFERENCES names {key}, which is not a public name of ray.train 2.60"


def test_the_recorded_names_are_the_installed_rays_names():
    """The names the tests above are made from are those of the installed Ray: when Ray is upgraded,
    this fails until tests/ray_train_public_names.json is written again from it."""
    import ray

    assert RECORDED["ray"] == ray.__version__, (
        f"names recorded from Ray {RECORDED['ray']}, Ray {ray.__version__} installed"
    )
    assert _pairs() == PAIRS
