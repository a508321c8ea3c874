"""The in-loop API outside a loop, metric conversion, and the terminal progress line."""

from __future__ import annotations

import io

import pytest

import trainers
from trainers._internal.run.progress import ProgressLine
from trainers._internal.session.worker_session import plain_metrics


@pytest.mark.parametrize(
    "call",
    [lambda: trainers.report({"a": 1}), trainers.get_checkpoint, trainers.get_context, trainers.get_dataset_shard],
)
def test_loop_functions_outside_a_loop_say_where_they_work(call):
    with pytest.raises(RuntimeError, match=r"works only inside train_loop_per_worker"):
        call()


def test_metrics_become_plain_python_numbers():
    import numpy as np
    import torch

    metrics = plain_metrics(
        {"t": torch.tensor(1.5), "n": np.float32(2.0), "i": np.int64(3), "nested": {"x": torch.tensor([4])}, "s": "ok"}
    )
    assert metrics == {"t": 1.5, "n": 2.0, "i": 3, "nested": {"x": 4}, "s": "ok"}
    assert type(metrics["t"]) is float and type(metrics["i"]) is int


class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_line_shows_attempt_reports_metrics_in_a_terminal_only():
    terminal = FakeTerminal()
    line = ProgressLine("run", terminal)
    line.update(1, {"loss": 0.123456, "epoch": 2})
    line.close()
    assert "[run] attempt 1 | reports 1 | loss=0.1235 epoch=2" in terminal.getvalue()

    piped = io.StringIO()
    quiet = ProgressLine("run", piped)
    quiet.update(1, {"loss": 1.0})
    quiet.note("restarting")
    quiet.close()
    assert piped.getvalue() == ""
