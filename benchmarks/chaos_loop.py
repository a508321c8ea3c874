"""The chaos soak's training loop: a small seeded DDP model whose every run computes the same.

Each step trains on a fixed slice of a seeded data set (each rank its share of the global batch),
reports rank 0's loss, a hash of the weights after the step and a score retention ranks by; every
``every``-th step each rank also writes its file of the checkpoint, ``r{rank}-s{step}.pt`` (rank
0's holds the model and optimizer the run resumes from). So a run that restarts from its
checkpoints reports what a run without faults reports, bit for bit, and ends with its weights.

Three of the soak's faults strike from here (the others from its storage wrapper, the event
channel's hook, or the soak itself): ``kill-step`` (SIGKILL between the optimizer step and
``report()``), ``raise`` (an exception there) and ``kill-collective`` (SIGKILL while waiting in
DDP's all-reduce: the other ranks enter it late). Each fires once, whichever attempt reaches it
first. A step also sleeps ``pace_s``, as real work would take time: the soak, which kills the
driver or removes a node once a step is committed, then strikes near that step, not at the end.

Every rank appends a line to ``rank{rank}.jsonl`` when its attempt starts (with its process and
node) and whenever ``report()`` returned, which the soak holds against what the driver committed;
each report and each checkpoint file names the attempt, process and node that made it.
"""

from __future__ import annotations

import glob
import hashlib
import os
import signal
import tempfile
import threading
import time
from typing import Any

from benchmarks import chaos_journal

FEATURES = 8
ROWS = 256
GLOBAL_BATCH = 32
#: How long the other ranks stay out of the all-reduce while a ``kill-collective`` victim waits in it.
COLLECTIVE_HOLD_S = 0.5


def state_file(rank: int, step: int) -> str:
    """The name of rank ``rank``'s file in the checkpoint of step ``step``."""
    return f"r{rank}-s{step:06d}.pt"


def weights_hash(state: dict[str, Any]) -> str:
    """A short hash of a model's ``state_dict()`` (equal hashes: bitwise equal weights)."""
    digest = hashlib.sha256()
    for name, tensor in state.items():
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def score(step: int) -> float:
    """What retention ranks a checkpoint by: a fixed jumble of the step, so the best checkpoints
    are seldom the latest and "best n plus the latest" keeps n + 1."""
    return (step * 7919 % 31) / 31.0


def chaos_loop(config: dict) -> dict:
    """The loop every worker runs (``config``: seed, steps, every, pace_s, log_dir, marks, faults)."""
    import torch

    from trainers import Checkpoint, get_checkpoint, get_context, report
    from trainers.torch import prepare_model

    context = get_context()
    rank, size = context.get_world_rank(), context.get_world_size()
    attempt = context.get_attempt()
    log = os.path.join(config["log_dir"], f"rank{rank}.jsonl")
    torch.manual_seed(config["seed"])
    model = torch.nn.Sequential(torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    start = 0
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            (path,) = glob.glob(os.path.join(folder, "r0-s*.pt"))
            state = torch.load(path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"] + 1
    model = prepare_model(model)
    module = getattr(model, "module", model)
    generator = torch.Generator().manual_seed(config["seed"])
    x = torch.randn(ROWS, FEATURES, generator=generator)
    y = torch.sin(x @ torch.randn(FEATURES, 1, generator=generator))
    import ray

    node = ray.util.get_node_ip_address()
    chaos_journal.append(
        log, {"e": "start", "attempt": attempt, "rank": rank, "pid": os.getpid(), "node": node, "step": start}
    )
    faults = [f for f in config["faults"] if f["kind"] in ("kill-step", "kill-collective", "raise")]
    marks = config["marks"]
    for step in range(start, config["steps"]):
        pending = [f for f in faults if f["step"] == step and not chaos_journal.fired(marks, f["id"])]
        time.sleep(config["pace_s"])
        first = step * GLOBAL_BATCH % ROWS
        xb, yb = x[first : first + GLOBAL_BATCH][rank::size], y[first : first + GLOBAL_BATCH][rank::size]
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        for fault in pending:
            if fault["kind"] == "kill-collective":
                if fault["rank"] == rank:
                    threading.Timer(COLLECTIVE_HOLD_S / 3, _kill, args=(marks, fault)).start()
                else:
                    time.sleep(COLLECTIVE_HOLD_S)  # the victim waits in the all-reduce meanwhile
        loss.backward()  # DDP's all-reduce of the gradients
        optimizer.step()
        for fault in pending:
            if fault["kind"] == "kill-step" and fault["rank"] == rank:
                _kill(marks, fault)
            if fault["kind"] == "raise" and fault["rank"] == rank and chaos_journal.fire(marks, fault["id"]):
                raise RuntimeError(f"chaos: injected failure at step {step}")
        digest = weights_hash(module.state_dict())
        metrics = {"step": step, "loss": loss.item() if rank == 0 else None, "weights": digest, "score": score(step)}
        metrics.update(attempt=attempt, pid=os.getpid(), node=node)  # who reported it (see chaos_check.fenced_rounds)
        checkpointed = step % config["every"] == config["every"] - 1 or step == config["steps"] - 1
        if checkpointed:
            with tempfile.TemporaryDirectory() as folder:
                # Who wrote it (the soak on hosts holds it against the rank's start in that attempt).
                state = {
                    "step": step,
                    "rank": rank,
                    "weights": digest,
                    "attempt": attempt,
                    "pid": os.getpid(),
                    "node": node,
                }
                if rank == 0:
                    state.update(model=module.state_dict(), optimizer=optimizer.state_dict())
                torch.save(state, os.path.join(folder, state_file(rank, step)))
                report(metrics, checkpoint=Checkpoint.from_directory(folder))
        else:
            report(metrics)
        chaos_journal.append(
            log, {"e": "returned", "attempt": attempt, "rank": rank, "step": step, "checkpoint": checkpointed}
        )
    return {"weights": weights_hash(module.state_dict())}


def _kill(marks: str, fault: dict) -> None:
    if chaos_journal.fire(marks, fault["id"]):
        os.kill(os.getpid(), signal.SIGKILL)
