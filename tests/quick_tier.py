"""A pytest plugin: ``--quick``, the edit-loop tier (``make test-quick``).

Every test module keeps its quickest tests, by the seconds each took in a recorded full run
(``tests/durations.json``): the quickest always, then the next quickest while the module's kept
tests stay under ``MODULE_BUDGET_S`` in all. So every module is represented, each by what it can
check fast, and the tier's time is bounded by the number of modules, not by the slowest tests.
A test the record does not know yet (a new one) is kept: it has not shown that it is slow.

A test that needs a fixture of its module's own scope (a cluster, a benchmark run, a framework's
Ray) is left out when its module has tests that do not: the record puts that fixture's minutes on
whichever test set it up first, so a test after it looks quick there and is not quick alone. A
module all of whose tests need one keeps its quickest. The session's Ray and Prefect server
(``SHARED_FIXTURES``) count for nothing: every module shares them.

Refresh the record after tests change their cost, from a full run's JUnit report::

    .venv/bin/python -m pytest --junitxml=/tmp/junit.xml
    .venv/bin/python tests/quick_tier.py /tmp/junit.xml
"""

from __future__ import annotations

import collections
import json
import pathlib
import sys
import xml.etree.ElementTree as ElementTree

import pytest

#: The record: test id (``tests/test_x.py::test_y[param]``) -> seconds (setup, call and teardown).
RECORD = pathlib.Path(__file__).with_name("durations.json")
#: Seconds of recorded tests each module may keep, beyond its quickest test.
MODULE_BUDGET_S = 12.0
#: Fixtures set up once for the whole run (per pytest-xdist worker) and shared by every module.
SHARED_FIXTURES = frozenset({"_ray_session", "ray_local", "prefect_server", "prefect_harness"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick",
        action="store_true",
        help="the edit-loop tier: each module's quickest tests (tests/quick_tier.py)",
    )


def needs_own_setup(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture wider than one test that not every module shares."""
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    return any(
        found and found[-1].scope != "function" for name, found in definitions.items() if name not in SHARED_FIXTURES
    )


def kept(tests: list[str], seconds: dict[str, float], own_setup: frozenset[str] = frozenset()) -> set[str]:
    """Of one module's ``tests``, those the quick tier runs; ``own_setup``: those that need a
    fixture of their module's own (see the module's docstring)."""
    light = [t for t in tests if t not in own_setup]
    if not light:
        return {min(tests, key=lambda t: seconds.get(t, 0.0))} if tests else set()
    tests = light
    known = sorted((t for t in tests if t in seconds), key=lambda t: seconds[t])
    chosen = {t for t in tests if t not in seconds}
    spent = 0.0
    for position, test in enumerate(known):
        if position > 0 and spent + seconds[test] > MODULE_BUDGET_S:
            break
        chosen.add(test)
        spent += seconds[test]
    return chosen


@pytest.hookimpl(trylast=True)  # after conftest's ordering, which deselecting must not undo
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("quick"):
        return
    seconds = json.loads(RECORD.read_text()) if RECORD.exists() else {}
    by_module: dict[str, list[str]] = collections.defaultdict(list)
    for item in items:
        by_module[item.nodeid.split("::", 1)[0]].append(item.nodeid)
    own_setup = frozenset(item.nodeid for item in items if needs_own_setup(item))
    chosen = set().union(*(kept(tests, seconds, own_setup) for tests in by_module.values()))
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in chosen])
    items[:] = [item for item in items if item.nodeid in chosen]


def record_from_junit(report: pathlib.Path) -> dict[str, float]:
    """Each test's seconds from a JUnit XML report of a run (pytest's ``--junitxml``)."""
    seconds = {}
    for case in ElementTree.parse(report).iter("testcase"):
        parts = case.get("classname", "").split(".")  # tests.test_x, or tests.test_x.TestClass
        owner = f"::{parts.pop()}" if parts and parts[-1][:1].isupper() else ""
        seconds["/".join(parts) + f".py{owner}::{case.get('name')}"] = round(float(case.get("time", 0.0)), 2)
    return seconds


if __name__ == "__main__":
    RECORD.write_text(json.dumps(record_from_junit(pathlib.Path(sys.argv[1])), indent=0, sort_keys=True) + "\n")
