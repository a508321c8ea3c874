"""The Prefect sweep flow under prefect_test_harness, on the session's real local Ray and real files."""

from __future__ import annotations

import json
import pathlib

import pytest
import ray
from pydantic import ValidationError

import pipeline_loops
import tune_loops
from conftest import train_worker_actors
from run_history import recorded_reports
from tasks.params import Scaling, TorchTraining
from tasks.sweep import Search, trial_name, trials_the_cluster_holds

pytestmark = pytest.mark.usefixtures("prefect_harness", "ray_local")

SEARCH = {"metric": "loss", "mode": "min", "grid": {"lr": [0.0, 0.3, 0.1]}, "max_concurrent_trials": 2}


def _table(key: str) -> list[dict]:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    latest = max(found, key=lambda a: a.created)
    return json.loads(latest.data)


def _trial_task_runs(sweep_name: str) -> list:
    from prefect import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    with get_client(sync_client=True) as client:
        return client.read_task_runs(
            task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_=f"trial {sweep_name}-"))
        )


def _snapshots(folder: pathlib.Path) -> dict[str, bytes]:
    return {run.name: (run / "run.json").read_bytes() for run in sorted(folder.iterdir()) if run.is_dir()}


def test_sweep_ranks_trials_retries_a_failed_one_and_a_rerun_reuses_them(tmp_path):
    from flows.sweep import sweep

    storage = tmp_path / "results"
    arguments = dict(
        search=SEARCH,
        train_loop="tune_loops:regression_loop",
        train_loop_config={"epochs": 3},
        scaling={"num_workers": 1},
        failures={"max_failures": 0, "controller_failure_limit": 1, "retry_delay_s": 0},
        run={"name": "lr-sweep", "storage_path": str(storage), "callbacks": ["pipeline_loops:FailOnceCallback"]},
    )
    pipeline_loops.FailOnceCallback.marker = tmp_path / "driver-failed"  # one trial's driver fails once
    try:
        state = sweep(**arguments, return_state=True)
    finally:
        pipeline_loops.FailOnceCallback.marker = None
    assert state.is_completed(), state
    first = state.result()

    # Ranked by the last loss, best first; lr=0 never learns.
    assert [t["params"]["lr"] for t in first["trials"]] == [0.3, 0.1, 0.0]
    scores = [t["score"] for t in first["trials"]]
    assert scores == sorted(scores) and first["best"]["params"] == {"lr": 0.3}
    assert {t["status"] for t in first["trials"]} == {"trained"}
    table = _table("lr-sweep-trials")
    assert [row["param/lr"] for row in table] == [0.3, 0.1, 0.0] and [row["rank"] for row in table] == [1, 2, 3]
    assert [row["loss"] for row in table] == scores

    # Each trial is its own run under the sweep's folder, named from its config.
    sweep_folder = storage / "lr-sweep"
    names = {t["name"] for t in first["trials"]}
    assert {p.name for p in sweep_folder.iterdir()} == names
    for outcome in first["trials"]:
        reports = recorded_reports(sweep_folder / outcome["name"])
        assert [r["metrics"]["epoch"] for r in reports] == [0, 1, 2]  # the retried trial resumed, no repeats
        assert pathlib.Path(outcome["checkpoint_path"]).parent == sweep_folder / outcome["name"]

    # The driver failure was retried by Prefect (FailureConfig.controller_failure_limit), in the same task run.
    assert (tmp_path / "driver-failed").exists()
    counts = sorted(run.run_count for run in _trial_task_runs("lr-sweep"))
    assert counts[-1] == 2 and len(counts) == 3

    # A second run of the same sweep trains nothing: same runs, same snapshots, no new reports.
    before = _snapshots(sweep_folder)
    again = sweep(**arguments, return_state=True)
    assert again.is_completed(), again
    second = again.result()
    assert {t["status"] for t in second["trials"]} == {"reused"}
    assert [(t["name"], t["score"], t["run_path"]) for t in second["trials"]] == [
        (t["name"], t["score"], t["run_path"]) for t in first["trials"]
    ]
    assert _snapshots(sweep_folder) == before
    assert [row["status"] for row in _table("lr-sweep-trials")] == ["reused"] * 3


def test_bad_sweep_parameters_fail_before_any_worker_starts(tmp_path):
    from flows.sweep import sweep

    before = set(train_worker_actors())
    common = dict(train_loop="tune_loops:regression_loop", run={"name": "bad", "storage_path": str(tmp_path)})
    with pytest.raises(Exception, match=r"give a grid .* or random distributions; both are empty"):
        sweep(search={"metric": "loss"}, **common)
    with pytest.raises(Exception, match=r"kind='uniform' needs low < high; got low=1.0, high=0.0"):
        sweep(search={"metric": "loss", "random": {"lr": {"kind": "uniform", "low": 1, "high": 0}}}, **common)
    state = sweep(
        search={**SEARCH, "max_concurrent_trials": 9}, scaling={"num_workers": 1}, return_state=True, **common
    )
    assert state.is_failed()
    # One trial a CPU: the session's Ray has 4, unless a module before this one on this pytest
    # process left a Ray of its own running (fit() starts one with a CPU a core when none runs).
    cpus = int(ray.cluster_resources()["CPU"])
    with pytest.raises(
        ValueError, match=rf"search.max_concurrent_trials=9: the Ray cluster holds only {cpus} trial\(s\) .* lower it"
    ):
        state.result()
    state = sweep(search=SEARCH, scaling={"num_workers": 9}, return_state=True, **common)
    with pytest.raises(ValueError, match=r"ScalingConfig asks for 9 workers"):
        state.result()
    assert set(train_worker_actors()) == before
    assert not (tmp_path / "bad").exists()  # no trial run was even created


def test_search_proposes_the_same_trials_every_time():
    search = Search(
        metric="loss",
        grid={"hidden": [8, 16]},
        random={
            "lr": {"kind": "loguniform", "low": 1e-4, "high": 1e-1},
            "act": {"kind": "choice", "values": ["relu", "tanh"]},
        },
        num_samples=3,
        seed=7,
    )
    configs = search.configs()
    assert len(configs) == 6 and configs == search.configs()
    assert [c["hidden"] for c in configs] == [8, 8, 8, 16, 16, 16]
    assert all(1e-4 <= c["lr"] < 1e-1 and c["act"] in ("relu", "tanh") for c in configs)
    assert configs != Search(**{**search.model_dump(), "seed": 8}).configs()
    scaling = Scaling(num_workers=1)
    name = trial_name("s", "m:f", {"lr": 0.1, "epochs": 3}, scaling)
    assert name == trial_name("s", "m:f", {"epochs": 3, "lr": 0.1}, scaling)  # key order does not matter
    assert name != trial_name("s", "m:f", {"lr": 0.2, "epochs": 3}, scaling)
    assert name != trial_name("s", "m:f", {"lr": 0.1, "epochs": 3}, Scaling(num_workers=2))
    # Trial names must not change across upgrades, or a rerun retrains what it had trained.
    assert trial_name("s", "m:f", {"lr": 0.1}, Scaling(num_workers=1)) == "s-5ed9946fb140"
    assert trial_name("s", "m:f", {"lr": 0.1}, Scaling(num_workers=1, accelerator_type="A100")) != "s-5ed9946fb140"
    assert Scaling(accelerator_type="A100").to_config().worker_resources["accelerator_type:A100"] == 0.001
    with pytest.raises(ValueError, match=r"search.num_samples=2: a grid without random parameters"):
        Search(metric="loss", grid={"lr": [0.1]}, num_samples=2)


def test_a_sweep_trial_and_a_pipeline_run_read_the_number_of_reports_from_the_same_config_keys():
    """The progress artifact's "out of N": a sweep trial built its training from ``epochs`` alone
    while the pipeline also read ``num_epochs`` and ``num_boost_round``; both now build it through
    ``TorchTraining``, which holds the one rule."""
    for key in ("epochs", "num_epochs", "num_boost_round"):
        assert TorchTraining(train_loop="m:f", train_loop_config={key: 3, "lr": 0.1}).expected_reports == 3
    assert TorchTraining(train_loop="m:f", train_loop_config={"epochs": 2.5}).expected_reports is None
    assert TorchTraining(train_loop="m:f").expected_reports is None
    assert TorchTraining(train_loop="m:f", train_loop_config={"epochs": 3}, expected_reports=7).expected_reports == 7
    with pytest.raises(ValidationError, match="train_loop_config"):  # a bad config is still pydantic's clear error
        TorchTraining(train_loop="m:f", train_loop_config=[("epochs", 3)])


def test_elastic_trials_are_counted_at_their_max_workers():
    """Trials with scaling.min_workers may grow to num_workers, so the cluster holds as many of them
    at once as of fixed ones (this divided by the (min, max) pair before)."""
    fixed = trials_the_cluster_holds(Scaling(num_workers=2))
    assert fixed >= 1
    assert trials_the_cluster_holds(Scaling(num_workers=2, min_workers=1)) == fixed


def test_sweep_over_datasets_reads_them_once_and_trains_every_trial_on_them(tmp_path):
    from flows.sweep import sweep
    from pipeline_loops import write_classification_parquet

    data = write_classification_parquet(tmp_path / "data")
    state = sweep(
        search={"metric": "valid_loss", "mode": "min", "grid": {"lr": [0.05, 0.001]}},
        train_loop="tasks.loops:tabular_mlp_loop",
        train_loop_config={"label_column": "label", "epochs": 1},
        datasets={"train": {"uri": data}, "valid": {"uri": data}},
        scaling={"num_workers": 1},
        run={"name": "mlp-sweep", "storage_path": str(tmp_path / "results")},
        return_state=True,
    )
    assert state.is_completed(), state
    trials = state.result()["trials"]
    assert sorted(t["params"]["lr"] for t in trials) == [0.001, 0.05]
    scores = [t["score"] for t in trials]
    assert scores == sorted(scores) and all(s is not None for s in scores)
    assert all(t["metrics"]["train_rows"] == 512 and t["metrics"]["valid_rows"] == 512 for t in trials)


def test_a_failed_trial_is_ranked_last_with_its_error_and_the_others_still_count(tmp_path):
    from flows.sweep import sweep

    state = sweep(
        search={"metric": "loss", "grid": {"lr": [-1.0, 0.1]}},  # torch's SGD rejects a negative lr
        train_loop=tune_loops.regression_loop,  # ad hoc: a function, not an import path
        train_loop_config={"epochs": 1},
        scaling={"num_workers": 1},
        failures={"max_failures": 0, "controller_failure_limit": 2, "retry_delay_s": 0},
        run={"name": "half-bad", "storage_path": str(tmp_path / "results")},
        return_state=True,
    )
    assert state.is_completed(), state
    trials = state.result()["trials"]
    assert [(t["params"]["lr"], t["status"]) for t in trials] == [(0.1, "trained"), (-1.0, "failed")]
    assert "WorkerGroupError" in trials[1]["error"] and "Invalid learning rate" in trials[1]["error"]
    runs = {run.name: run.run_count for run in _trial_task_runs("half-bad")}
    assert runs[f"trial {trials[1]['name']}"] == 1  # a spent worker budget is not retried by Prefect
    assert trials[0]["name"] == trial_name(
        "half-bad", "tune_loops:regression_loop", {"epochs": 1, "lr": 0.1}, Scaling(num_workers=1)
    )
    table = _table("half-bad-trials")
    assert [row["status"] for row in table] == ["trained", "failed"] and table[1]["rank"] is None


@pytest.mark.filterwarnings("ignore:Artifact creation outside of a flow or task run")  # the task called as a function
def test_a_sweep_fails_naming_why_when_no_trial_can_be_ranked():
    """The ranking still publishes the table (a reader sees every trial's error), then fails the
    flow: when every trial failed, with the first error, and when none reported the metric, with the
    metrics they did report."""
    from tasks.sweep import SweepError, TrialOutcome, rank_trials

    search = Search(**SEARCH)
    failed = [TrialOutcome(name=f"t{i}", params={"lr": i}, status="failed", error=f"boom {i}") for i in range(2)]
    with pytest.raises(SweepError, match=r"sweep 'all-failed': all 2 trial\(s\) failed; the first: boom 0"):
        rank_trials.fn("all-failed", search, failed)
    assert [row["error"] for row in _table("all-failed-trials")] == ["boom 0", "boom 1"]
    unscored = [
        TrialOutcome(name="t", params={"lr": 0.1}, status="trained", metrics={"accuracy": 0.9, "epoch": 2}),
        failed[0],
    ]
    with pytest.raises(
        SweepError, match=r"search.metric='loss': no trial reported it; they reported \['accuracy', 'epoch'\]"
    ):
        rank_trials.fn("no-metric", search, unscored)
    ranked = rank_trials.fn(
        "ranked",
        search,
        [failed[0], *[TrialOutcome(name=f"s{v}", params={}, status="trained", score=v) for v in (0.3, 0.1)]],
    )
    assert [o.name for o in ranked] == ["s0.1", "s0.3", "t0"]
