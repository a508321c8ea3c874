"""The ``FLOWTRAIN_*`` variables: read in one module (``storage.settings``), listed in one page
(docs/settings.md), and a bad value of each fails naming it."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest

from storage import settings
from trainers import DataParallelTrainer, RunConfig, ScalingConfig

ROOT = pathlib.Path(__file__).resolve().parent.parent
PRODUCTION = ("trainers", "storage", "tasks", "flows")
SETTINGS_MODULE = ROOT / "storage" / "settings.py"
NAMES = {setting.name for setting in settings.ALL}


def _production_modules() -> list[pathlib.Path]:
    return sorted(path for package in PRODUCTION for path in (ROOT / package).rglob("*.py"))


def test_no_module_but_the_settings_module_names_a_flowtrain_variable():
    """A string that is a variable's name (or the start of one) is how a module reads it; every
    other module uses ``storage.settings`` (its text may mention the names, in docstrings and errors)."""
    found = []
    for path in _production_modules():
        if path == SETTINGS_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and re.fullmatch(r"FLOWTRAIN_[A-Z0-9_]*", str(node.value)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == [], "read these through storage.settings:\n" + "\n".join(found)


def test_the_docs_table_lists_every_setting_as_the_module_has_it():
    rows = []
    for line in (ROOT / "docs" / "settings.md").read_text().splitlines():
        if line.startswith("| `FLOWTRAIN_"):
            name, default, rule = (cell.strip().strip("`") for cell in line.strip("|").split("|")[:3])
            rows.append((name, default, rule))
    assert rows == [(s.name, s.default_text, s.rule) for s in settings.ALL]


def test_every_flowtrain_variable_the_docs_and_the_code_mention_exists():
    """No page or docstring names a variable that is gone (or mistyped); ``FLOWTRAIN_UPLOAD_*``
    names a family."""
    texts = [*ROOT.joinpath("docs").rglob("*.md"), ROOT / "README.md", *_production_modules()]
    unknown = set()
    for path in texts:
        for name in re.findall(r"FLOWTRAIN_[A-Z0-9_]+", path.read_text()):
            family = name.endswith("_") and any(known.startswith(name) for known in NAMES)
            if name not in NAMES and not family and name != "FLOWTRAIN_LOGGERS":  # a Python name
                unknown.add(f"{path.relative_to(ROOT)}: {name}")
    assert unknown == set()


#: Values each kind of setting refuses, by the type of its default (a choice: by its rule).
BAD = {
    bool: ["maybe", "2"],
    int: ["one", "1.5", "-1"],
    float: ["fast", "-1"],
    "choice": ["sometimes"],
    "path": ["relative/folder"],
}


def _kind(setting: settings.Setting) -> object:
    if setting.rule.startswith("one of"):
        return "choice"
    if setting is settings.STORAGE_PATH:
        return "path"
    return float if setting is settings.WORKER_START_TIMEOUT_S else type(setting.default)


@pytest.mark.parametrize("setting", settings.ALL, ids=lambda s: s.name)
def test_a_bad_value_of_each_setting_names_the_variable_the_value_and_the_rule(setting, monkeypatch):
    monkeypatch.delenv(setting.name, raising=False)
    assert setting.read() == setting.default
    monkeypatch.setenv(setting.name, "  ")  # empty: unset
    assert setting.read() == setting.default
    for bad in BAD[_kind(setting)]:
        monkeypatch.setenv(setting.name, bad)
        with pytest.raises(ValueError) as caught:
            setting.read()
        assert str(caught.value) == f"{setting.name}={bad!r}: must be {setting.rule} (unset: {setting.default_text})."
        with pytest.raises(ValueError, match=re.escape(setting.name)):
            settings.check_all()


def test_values_are_read_when_asked_not_at_import(monkeypatch):
    monkeypatch.setenv("FLOWTRAIN_SPARE_WORKERS", "3")
    monkeypatch.setenv("FLOWTRAIN_PREFLIGHT", " ON ")
    monkeypatch.setenv("FLOWTRAIN_REPLACE_RANKS", "no")
    monkeypatch.setenv("FLOWTRAIN_STORAGE_PATH", "s3://bucket/runs")
    assert settings.SPARE_WORKERS.read() == 3 and settings.PREFLIGHT.read() == "on"
    assert settings.REPLACE_RANKS.read() is False and settings.STORAGE_PATH.read() == "s3://bucket/runs"
    monkeypatch.setenv("FLOWTRAIN_SPARE_WORKERS", "0")
    assert settings.SPARE_WORKERS.read() == 0
    assert settings.SPARE_WORKERS.read({"FLOWTRAIN_SPARE_WORKERS": "2"}) == 2  # another environment


def test_a_value_given_in_code_meets_the_same_rule():
    from trainers.health import PreflightSettings, StragglerSettings

    with pytest.raises(ValueError, match=r"FLOWTRAIN_STRAGGLER_FACTOR=0\.9: must be a factor above 1"):
        StragglerSettings(factor=0.9)
    with pytest.raises(ValueError, match="FLOWTRAIN_PREFLIGHT='sometimes': must be one of auto, on, off"):
        PreflightSettings(mode="sometimes")
    assert StragglerSettings() == StragglerSettings(settings.STRAGGLER_FACTOR.default, settings.STRAGGLER_STEPS.default)


def test_fit_fails_on_a_bad_value_before_anything_starts(tmp_path, monkeypatch):
    """Even a setting only the workers' uploads use: nothing is made, not even the run's folder."""
    monkeypatch.setenv("FLOWTRAIN_UPLOAD_THREADS", "0")
    trainer = DataParallelTrainer(
        lambda: None,
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="bad-setting", storage_path=str(tmp_path)),
    )
    with pytest.raises(ValueError, match="FLOWTRAIN_UPLOAD_THREADS='0': must be a whole number >= 1"):
        trainer.fit()
    assert list(tmp_path.iterdir()) == []


def test_every_clock_of_trainers_is_in_the_tuning_index():
    """A module-level number named ``*_S`` (seconds) outside ``trainers/tuning.py`` is a clock
    the index misses."""
    found = []
    for path in sorted((ROOT / "trainers").rglob("*.py")):
        if path.name == "tuning.py" and path.parent.name == "trainers":
            continue
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            value = getattr(node, "value", None)
            if isinstance(target, ast.Name) and target.id.endswith("_S") and isinstance(value, ast.Constant):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {target.id}")
    assert found == [], "move these into trainers/tuning.py:\n" + "\n".join(found)
