"""``--quick`` (``make test-quick``): which tests of each module the edit-loop tier keeps."""

from __future__ import annotations

import textwrap

from quick_tier import MODULE_BUDGET_S, kept


def test_the_quickest_tests_are_kept_within_the_budget_and_unknown_ones_always():
    seconds = {"m::a": 0.1, "m::b": MODULE_BUDGET_S - 1, "m::c": 5.0, "m::slow": 100.0}

    chosen = kept(["m::a", "m::b", "m::c", "m::slow", "m::new"], seconds)

    assert chosen == {"m::a", "m::c", "m::new"}  # b would pass the budget after c; new is not in the record
    assert kept(["m::slow"], seconds) == {"m::slow"}  # a module's quickest is kept whatever it costs


def test_tests_needing_a_fixture_of_their_own_are_left_out_unless_the_module_has_nothing_else():
    seconds = {"m::first": 90.0, "m::after": 0.01, "m::light": 3.0, "n::x": 40.0, "n::y": 50.0}

    # "after" looks quick in the record only because "first" set the module's cluster up.
    assert kept(["m::first", "m::after", "m::light"], seconds, frozenset({"m::first", "m::after"})) == {"m::light"}
    assert kept(["n::x", "n::y"], seconds, frozenset({"n::x", "n::y"})) == {"n::x"}


def test_the_tier_tells_a_module_scoped_fixture_from_the_sessions_shared_ones(pytester):
    pytester.makeconftest(
        textwrap.dedent(
            """
            import pytest

            pytest_plugins = ("quick_tier",)

            @pytest.fixture(scope="session")
            def prefect_server():
                return "shared by every module"
            """
        )
    )
    pytester.makepyfile(
        test_mixed=textwrap.dedent(
            """
            import pytest

            @pytest.fixture(scope="module")
            def cluster():
                return "minutes to build"

            def test_on_the_cluster(cluster):
                pass

            def test_on_the_shared_server(prefect_server):
                pass

            def test_plain():
                pass
            """
        ),
        test_cluster_only=textwrap.dedent(
            """
            import pytest

            @pytest.fixture(scope="module")
            def cluster():
                return "minutes to build"

            def test_one(cluster):
                pass
            """
        ),
    )

    result = pytester.runpytest("--quick", "-v", "-p", "no:cacheprovider")

    result.assert_outcomes(passed=3, deselected=1)
    result.stdout.fnmatch_lines(["*test_cluster_only.py::test_one PASSED*"])
    result.stdout.no_fnmatch_line("*test_on_the_cluster*")
