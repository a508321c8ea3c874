"""Imports point down only: flows -> tasks -> trainers -> storage (an AST scan of every module)."""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "storage": {"trainers", "tasks", "flows", "prefect", "ray"},
    "trainers": {"tasks", "flows", "prefect"},
    "tasks": {"flows"},
    "flows": {"ray"},
}


def imported_roots(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_lower_layers(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_roots(path) & FORBIDDEN[package]) for path in files
    }
    offenders = {path: bad for path, bad in offenders.items() if bad}
    assert not offenders, f"{package}/ must not import {sorted(FORBIDDEN[package])}: {offenders}"


def test_scan_catches_a_forbidden_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\nfrom prefect import flow\nimport ray.data\n")
    assert imported_roots(module) == {"os", "prefect", "ray"}
