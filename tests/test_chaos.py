"""The chaos soak (``python -m benchmarks.chaos``): its short schedule survives every fault it
injects, and it reports a planted defect.

Each soak runs as a subprocess with a two-node Ray of its own (it removes and adds nodes), so
these tests share nothing with the session's Ray.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys

import pytest

from benchmarks import chaos_road
from benchmarks.chaos_schedule import HOST, KINDS, WRAPPED, make_schedule
from benchmarks.chaos_soak import Settings
from conftest import ROOT

#: The short schedule: at least 30 faults of at least 6 kinds injected. A fault can miss its
#: moment when another takes its run past it first (a node lost while a rank waits to be killed
#: in its all-reduce), hence two to spare.
#: Ten faults to a run, not eight (a segment less: a driver's and a group's start), and half-open
#: connections given up after 3 s, not 15: the same faults and invariants, 275 s -> 225 s here.
SHORT = ["--faults", "32", "--seed", "1", "--per-run", "10", "--ack-timeout", "3"]
#: A soak's time is restarts and driver starts (2-3 s each on an idle 2-core machine, 10-20 s
#: when other suites load it): the suite's 600 s is too little for a loaded machine.
SOAK_TIMEOUT_S = 1800


def soak(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "chaos"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.chaos", *args, "--out", str(out)],
        cwd=ROOT,
        env=os.environ.copy(),
        capture_output=True,
        text=True,
        timeout=SOAK_TIMEOUT_S - 60,
    )
    table = tmp_path / "chaos.json"
    assert table.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    return done, json.loads(table.read_text())


def test_the_schedule_is_seeded_covers_every_kind_and_spaces_its_faults():
    # The kinds of the soak on one machine (the host kinds are tests/test_chaos_hosts.py's).
    kinds, settings = [k for k, kind in KINDS.items() if not kind.opt_in and kind.by != HOST], Settings()
    plans = make_schedule(32, 1, kinds, steps=settings.steps, every=settings.every, per_run=10)
    assert plans == make_schedule(32, 1, kinds, steps=settings.steps, every=settings.every, per_run=10)
    faults = [f for plan in plans for f in plan.faults]
    assert len(faults) == 32 and {f.kind for f in faults} == set(kinds)
    assert len({f.id for f in faults}) == 32
    for plan in plans:
        steps = [f.step for f in plan.faults]
        assert steps == sorted(steps) and all(b - a >= 2 for a, b in itertools.pairwise(steps))
        assert plan.wrapped == any(f.kind in WRAPPED for f in plan.faults)
        assert all(f.step % settings.every == settings.every - 1 for f in plan.faults if KINDS[f.kind].on_checkpoint)
    # The event road's faults share runs with driver kills only (a worker killed before it noticed
    # its connection broke takes its unacknowledged reports with it), one per rank, a half-open
    # connection last; they come first, so a defect on the event road shows in the first run
    # (--fail-fast stops there).
    road = {"event-drop", "event-half-open"}
    for plan in plans:
        found = [f for f in plan.faults if f.kind in road]
        assert not (found and {f.kind for f in plan.faults} & {"kill-step", "kill-collective", "raise", "node-loss"})
        assert len({f.rank for f in found}) == len(found)
        assert all(f is plan.faults[-1] for f in found if f.kind == "event-half-open")
    assert road & {f.kind for f in plans[0].faults}


@pytest.mark.timeout(SOAK_TIMEOUT_S)
def test_the_short_schedule_breaks_no_invariant(tmp_path):
    done, table = soak(tmp_path, *SHORT)
    assert done.returncode == 0, done.stdout[-5000:]
    assert table["invariants_broken"] == 0
    assert table["injected"] >= 30 and table["survived"] == table["injected"]
    assert sum(1 for counts in table["kinds"].values() if counts["injected"]) >= 6
    # A killed rank costs that rank only (issue 46): the soak's kills replace ranks in place.
    kills = [table["kinds"][kind] for kind in ("kill-step", "kill-collective") if kind in table["kinds"]]
    assert sum(counts["ranks_replaced"] for counts in kills) >= 1


@pytest.mark.timeout(SOAK_TIMEOUT_S)
def test_the_soak_reports_a_planted_defect(tmp_path):
    # The driver acknowledges a faulted connection's events without delivering them (what the
    # event road's acknowledgements guard against), through the tap the soak installs.
    plant = ["--plant", chaos_road.LOST_EVENTS]
    done, table = soak(tmp_path, *SHORT, *plant, "--fail-fast")
    assert done.returncode == 1, done.stdout[-5000:]
    assert table["invariants_broken"] >= 1
    assert "Invariants broken: **0**" not in done.stdout
