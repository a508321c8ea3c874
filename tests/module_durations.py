"""A pytest plugin: the slowest test modules, after pytest's slowest tests.

``--durations`` names single tests; what makes this suite slow is as often a module's shared
start (a cluster, a Prefect server) spread over its tests. Each module's time is the sum of its
tests' setup, call and teardown (module-scoped fixtures land in the first setup and the last
teardown), so the modules' times add up to the suite's.
"""

from __future__ import annotations

import collections

import pytest

#: How many modules the summary names.
SHOWN = 15


class ModuleDurations:
    """One session's seconds and tests per module."""

    def __init__(self) -> None:
        self.seconds: collections.Counter[str] = collections.Counter()
        self.tests: collections.Counter[str] = collections.Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Add one phase of one test to its module's time (under pytest-xdist, on the controller)."""
        module = report.nodeid.split("::", 1)[0]
        self.seconds[module] += report.duration
        if report.when == "call":
            self.tests[module] += 1

    @pytest.hookimpl(trylast=True)  # after pytest's own --durations table
    def pytest_terminal_summary(self, terminalreporter) -> None:
        """Print the slowest modules with their share of the suite's time."""
        total = sum(self.seconds.values())
        if not total:
            return
        terminalreporter.write_sep("=", f"slowest {SHOWN} modules")
        for module, seconds in self.seconds.most_common(SHOWN):
            share = 100 * seconds / total
            terminalreporter.write_line(f"{seconds:8.2f}s {share:5.1f}%  {module} ({self.tests[module]} tests)")
        terminalreporter.write_line(f"{total:8.2f}s in all, {len(self.seconds)} modules")


def pytest_configure(config: pytest.Config) -> None:
    # An instance per session: a suite run inside a test (pytester) keeps its own counts.
    config.pluginmanager.register(ModuleDurations(), "module-durations")
