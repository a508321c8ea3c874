"""Production code is a budget (DEVELOPERS.md): a feature pays for its lines.

``BUDGET`` is the line count of the production packages after the last fold (issue 60); a change
that grows them past it fails here and has to fold something else or raise the figure in the same
commit, with the reason in its message. The issue's own target is 20,500 lines.
"""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("trainers", "storage", "tasks", "flows")
BUDGET = 21_800


def production_lines(root: pathlib.Path) -> int:
    """Lines of every ``.py`` file under the production packages, as ``wc -l`` counts them."""
    return sum(path.read_bytes().count(b"\n") for package in PACKAGES for path in (root / package).rglob("*.py"))


def test_production_code_stays_within_its_line_budget():
    lines = production_lines(ROOT)
    assert lines <= BUDGET, f"production code is {lines} lines, over its budget of {BUDGET}: fold before adding"


def test_the_count_is_wc_l_of_every_production_module(tmp_path):
    (tmp_path / "trainers" / "sub").mkdir(parents=True)
    (tmp_path / "trainers" / "sub" / "a.py").write_text("x = 1\ny = 2\n")
    (tmp_path / "storage").mkdir()
    (tmp_path / "storage" / "b.py").write_text("z = 3\n")
    (tmp_path / "storage" / "notes.md").write_text("not code\n")
    assert production_lines(tmp_path) == 3
