"""The slowest-modules table printed after the suite (tests/module_durations.py)."""

from __future__ import annotations


def test_modules_are_ranked_by_the_sum_of_their_tests_phases(pytester):
    pytester.makepyfile(
        test_slow="""
import time
import pytest

@pytest.fixture(scope="module")
def started():
    time.sleep(0.3)  # a module's shared start lands in its first test's setup
    yield

def test_one(started):
    pass

def test_two(started):
    pass
""",
        test_quick="def test_quick():\n    pass\n",
    )
    result = pytester.runpytest("-p", "module_durations", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3)
    lines = result.outlines[
        result.outlines.index(next(line for line in result.outlines if "slowest 15 modules" in line)) :
    ]
    ranked = [line for line in lines if "test_" in line and ".py" in line]
    assert "test_slow.py (2 tests)" in ranked[0] and "test_quick.py (1 tests)" in ranked[1]
    assert float(ranked[0].split("s", 1)[0]) >= 0.3
    assert lines[len(ranked) + 1].strip().endswith("in all, 2 modules")
