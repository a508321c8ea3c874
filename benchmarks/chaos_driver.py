"""One driver of the chaos soak: ``python -m benchmarks.chaos_driver SPEC.json``.

Joins the Ray in ``RAY_ADDRESS``, runs ``fit()`` of the soak's loop (2 workers, gloo, DDP,
``FailureConfig(max_failures=-1)``) under the run name and storage the spec gives, and writes
down for the soak (which may SIGKILL this process at any moment):

- ``driver.jsonl``: each committed round (attempt, step, checkpoint folder, and who reported it:
  each rank's attempt, process and node), each restart with
  its failures, each event-road fault that fired;
- the spec's ``outcome`` file, once ``fit()`` returned or raised: the Result's history and
  return value, or the error and its causes.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from benchmarks import chaos_journal, chaos_storage
from benchmarks.chaos_loop import chaos_loop
from benchmarks.chaos_road import Road
from trainers import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig, TrainingFailedError, UserCallback
from trainers.torch import TorchTrainer


class Journal(UserCallback):
    """Writes what the controller did to ``driver.jsonl``; arms the event-road faults as steps commit."""

    def __init__(self, path: str, road: Road) -> None:
        self.path = path
        self.road = road

    def after_report(self, run_context, metrics, checkpoint):
        step = metrics[0]["step"]
        folder = os.path.basename(checkpoint.path.rstrip("/")) if checkpoint is not None else None
        # Who reported the round, rank by rank: (attempt, pid, node), as each rank's loop says.
        by = [[m.get("attempt"), m.get("pid"), m.get("node")] for m in metrics]
        chaos_journal.append(
            self.path, {"e": "commit", "attempt": run_context.attempt, "step": step, "checkpoint": folder, "by": by}
        )
        self._note(self.road.committed(step))

    def on_restart(self, run_context, failures, resume_from):
        described = [
            {"rank": f.world_rank, "kind": f.kind, "type": f.error_type, "message": f.message[:300]} for f in failures
        ]
        # How the workers restart (issue 46): ranks replaced and kept, or why every worker restarts.
        restart = run_context.restarts[-1] if getattr(run_context, "restarts", ()) else None
        how = (
            {"replaced": sorted(restart.replaced), "kept": list(restart.kept), "full_restart": restart.full_restart}
            if restart is not None
            else {}
        )
        chaos_journal.append(self.path, {"e": "restart", "attempt": run_context.attempt, "failures": described, **how})

    def finish(self) -> None:
        self._note(self.road.collect())

    def _note(self, fired: list[dict]) -> None:
        for fault in fired:
            chaos_journal.append(
                self.path, {"e": "road-fired", "id": fault["id"], "kind": fault["kind"], "rank": fault["rank"]}
            )


def causes(error: BaseException) -> list[str]:
    """``error`` and what caused it, outermost first, as "Type: message"."""
    chain, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        chain.append(f"{type(error).__name__}: {str(error)[:1000]}")
        error = error.__cause__ or error.__context__
    return chain


def main(spec_path: str) -> None:
    with open(spec_path) as file:
        spec = json.load(file)
    storage = spec["storage"]
    fs = chaos_storage.filesystem(
        storage["kind"],
        wrapped=storage["wrapped"],
        endpoint=storage.get("endpoint"),
        marks=spec["marks"],
        faults=spec["faults"],
        plant=spec.get("plant"),
    )
    road = Road(spec["faults"], spec["marks"], plant=spec.get("plant"))
    journal = Journal(spec["driver_log"], road)
    chaos_journal.append(spec["driver_log"], {"e": "driver", "pid": os.getpid()})
    trainer = TorchTrainer(
        chaos_loop,
        train_loop_config=spec["loop"],
        scaling_config=ScalingConfig(num_workers=spec["num_workers"]),
        run_config=RunConfig(
            name=spec["name"],
            storage_path=storage["path"],
            storage_filesystem=fs,
            checkpoint_config=CheckpointConfig(num_to_keep=spec["num_to_keep"], checkpoint_score_attribute="score"),
            failure_config=FailureConfig(max_failures=-1),
            callbacks=[journal],
        ),
    )
    outcome: dict[str, Any]
    try:
        with road.installed(spec.get("ack_timeout_s")):
            result = trainer.fit()
        outcome = {
            "status": "finished",
            "history": result.metrics_dataframe.to_dict("records"),
            "return_value": result.return_value,
        }
    except TrainingFailedError as error:
        outcome = {"status": "failed", "error": causes(error)}
    journal.finish()
    with open(spec["outcome"] + ".new", "w") as file:
        json.dump(outcome, file, default=str)
    os.replace(spec["outcome"] + ".new", spec["outcome"])


if __name__ == "__main__":
    main(sys.argv[1])
