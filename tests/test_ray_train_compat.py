"""A script written for ray.train runs on flowtrain with only its imports switched."""

from __future__ import annotations

import difflib
import importlib.util
import pathlib
import re

import pytest

SCRIPT = pathlib.Path(__file__).with_name("ray_train_user_script.py")

#: The whole migration: these import lines, nothing else.
IMPORT_SWITCHES = [
    (r"^from ray import train$", "import trainers as train"),
    (r"^from ray\.train\.torch import ", "from trainers.torch import "),
    (r"^from ray\.train\.collective import ", "from trainers.collective import "),
    (r"^from ray\.train import ", "from trainers import "),
]


def switch_imports(source: str) -> str:
    lines = []
    for line in source.splitlines():
        for pattern, replacement in IMPORT_SWITCHES:
            line = re.sub(pattern, replacement, line)
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_only_import_lines_change():
    original = SCRIPT.read_text()
    switched = switch_imports(original)
    changed = [
        line[1:]
        for line in difflib.unified_diff(original.splitlines(), switched.splitlines(), lineterm="", n=0)
        if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))
    ]
    assert changed, "the switch must change something"
    assert all(line.startswith(("import ", "from ")) for line in changed), changed


@pytest.mark.usefixtures("ray_local")
def test_ray_train_script_runs_with_switched_imports(tmp_path):
    source = switch_imports(SCRIPT.read_text())
    assert "ray" not in "".join(line for line in source.splitlines() if line.startswith(("import", "from")))
    module_path = tmp_path / "switched_user_script.py"
    module_path.write_text(source)
    spec = importlib.util.spec_from_file_location("switched_user_script", module_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    result = module.main(str(tmp_path / "results"))
    assert list(result.metrics_dataframe["epoch"]) == [0, 1, 2]
    losses = list(result.metrics_dataframe["loss"])
    assert losses[-1] < losses[0]
    assert len(result.best_checkpoints) <= 3
    assert result.checkpoint is not None
