"""`make lint` catches what it is there for: the project's own ruff and mypy settings, run on a copy
of the package layout with planted mistakes, fail and name them; .ci/run and the pre-commit hooks
run the commands `make lint` runs."""

import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT

PACKAGES = ("trainers", "storage", "tasks", "flows")

#: An annotated function returning the wrong type, one per checked package (mypy must see all four).
WRONG_TYPE = """
def count_workers(num_workers: int) -> str:
    return num_workers
"""
#: An unused import, a zip() without strict= and single quotes (ruff check and ruff format).
LINT_AND_FORMAT = """import os


def pairs(names: list[str], values: list[int]) -> list[tuple[str, int]]:
    return list(zip(names, values)) + [('a', 1)]
"""


@pytest.fixture(scope="module")
def layout(tmp_path_factory) -> pathlib.Path:
    """The checked packages, empty but for the planted modules, beside the project's pyproject.toml."""
    root = tmp_path_factory.mktemp("lint")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    for package in PACKAGES:
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")
        (root / package / "planted.py").write_text(WRONG_TYPE)
    (root / "tasks" / "style.py").write_text(LINT_AND_FORMAT)
    return root


def run(root: pathlib.Path, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *command], cwd=root, capture_output=True, text=True, timeout=300)


def test_mypy_with_the_project_config_fails_on_a_wrong_type_in_every_checked_package(layout):
    found = run(layout, "mypy")
    assert found.returncode == 1, found.stdout + found.stderr
    for package in PACKAGES:
        assert (
            f'{package}/planted.py:3: error: Incompatible return value type (got "int", expected "str")  [return-value]'
            in found.stdout
        ), found.stdout


def test_ruff_with_the_project_config_fails_on_lint_and_formatting(layout):
    lint = run(layout, "ruff", "check", "--output-format", "concise", "tasks/style.py")
    assert lint.returncode == 1
    assert "tasks/style.py:1:8: F401" in lint.stdout and "B905" in lint.stdout, lint.stdout
    form = run(layout, "ruff", "format", "--check", "tasks/style.py")
    assert form.returncode == 1 and "1 file would be reformatted" in form.stdout, form.stdout
    assert '[("a", 1)]' in form.stdout  # double quotes


def lint_recipe() -> list[str]:
    """The commands of the Makefile's ``lint`` target, with ``$(VENV)`` as ``.venv``."""
    recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, "the Makefile has no lint target"
    return [line.strip().replace("$(VENV)", ".venv") for line in recipe.group(1).splitlines()]


def test_ci_and_pre_commit_run_what_make_lint_runs():
    assert lint_recipe() == [".venv/bin/ruff check .", ".venv/bin/ruff format --check .", ".venv/bin/mypy"]
    steps = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert "make lint" in steps and steps.index("make lint") < steps.index("make test")
    hooks = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())["repos"][0]["hooks"]
    # A hook is given the changed files in place of `.` (--force-exclude keeps ruff's excludes).
    entries = [hook["entry"].replace(" --force-exclude", "") for hook in hooks]
    assert entries == [command.removesuffix(" .") for command in lint_recipe()]
    assert all(hook["language"] == "system" for hook in hooks)
