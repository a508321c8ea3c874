"""The one rule for reusing worker processes (``trainers._internal.workers.reuse``), reason by reason, and
what a reused process puts back (``fresh_process``), without Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from storage import settings
from trainers._internal.workers import reuse
from trainers._internal.workers.fresh_process import ProcessBaseline, installed_roots, is_user_module
from trainers._internal.workers.reuse import GroupFacts, Reuse, refusal
from trainers.torch.process import TORCH_START_SEED, TorchProcess

TORCH = GroupFacts(backend_reuses=True, backend_name="torch")


@pytest.mark.parametrize(
    ("facts", "reuse_", "reason"),
    [
        (TORCH, Reuse.WITHIN_RUN, None),
        (TORCH, Reuse.BETWEEN_RUNS, None),
        (GroupFacts(backend_reuses=False, backend_name="xgboost"), Reuse.WITHIN_RUN, "the xgboost backend has not"),
        (GroupFacts(backend_reuses=False, backend_name="xgboost"), Reuse.BETWEEN_RUNS, "Backend.reuses_workers"),
        (GroupFacts(backend_reuses=True, backend_name="torch", tpu_slices=True), Reuse.WITHIN_RUN, "TPU slices"),
        (GroupFacts(backend_reuses=True, backend_name="torch", elastic=True), Reuse.WITHIN_RUN, "elastic run"),
        (GroupFacts(backend_reuses=True, backend_name="torch", elastic=True), Reuse.BETWEEN_RUNS, None),
        (GroupFacts(backend_reuses=True, backend_name="torch", in_tune_trial=True), Reuse.BETWEEN_RUNS, "Tune trial"),
        (GroupFacts(backend_reuses=True, backend_name="torch", in_tune_trial=True), Reuse.WITHIN_RUN, None),
        (
            GroupFacts(backend_reuses=True, backend_name="torch", resources=("CPU", "GPU")),
            Reuse.BETWEEN_RUNS,
            "hold GPU",
        ),
        (GroupFacts(backend_reuses=True, backend_name="torch", resources=("CPU", "GPU")), Reuse.WITHIN_RUN, None),
    ],
)
def test_each_reason_a_group_is_not_reused(facts, reuse_, reason):
    found = refusal(facts, reuse_)
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found


def test_replacing_can_be_turned_off_and_a_bad_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("FLOWTRAIN_REPLACE_RANKS", "0")
    assert refusal(TORCH, Reuse.WITHIN_RUN) == "FLOWTRAIN_REPLACE_RANKS=0"
    assert refusal(TORCH, Reuse.BETWEEN_RUNS) is None
    monkeypatch.setenv("FLOWTRAIN_REPLACE_RANKS", "perhaps")
    with pytest.raises(ValueError, match="FLOWTRAIN_REPLACE_RANKS='perhaps'"):
        settings.REPLACE_RANKS.read()


def test_a_process_that_loaded_a_library_with_process_state_is_not_reused(monkeypatch):
    for name in reuse.KEEPS_PROCESS_STATE:  # this test process may have imported them for other tests
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert reuse.process_refusal() is None
    monkeypatch.setitem(sys.modules, "deepspeed", types.ModuleType("deepspeed"))
    assert "deepspeed" in (reuse.process_refusal() or "")


def test_user_modules_are_told_from_installed_ones(tmp_path):
    roots = installed_roots()
    mine = types.ModuleType("mine")
    mine.__file__ = str(tmp_path / "mine.py")
    assert is_user_module("mine", mine, roots)
    assert not is_user_module("json", sys.modules["json"], roots)  # the standard library
    assert not is_user_module("pytest", sys.modules["pytest"], roots)  # site-packages
    assert not is_user_module("trainers", sys.modules["trainers"], roots)  # flowtrain, an editable install
    assert not is_user_module("sys", sys, roots)  # built in


def test_restore_forgets_user_modules_and_puts_torch_and_the_environment_back(tmp_path, monkeypatch):
    import torch

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "edited_here.py").write_text("VALUE = 1\n")
    baseline = ProcessBaseline.capture()
    cwd = os.getcwd()
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    data_context = sys.modules["ray.data"].DataContext.get_current() if "ray.data" in sys.modules else None
    try:
        import edited_here  # noqa: F401 - imported after the baseline: the user's module

        os.environ["FLOWTRAIN_TEST_LEFT_BEHIND"] = "1"
        os.chdir(tmp_path)
        sys.path.append(str(tmp_path / "elsewhere"))
        torch.set_default_dtype(torch.float64)
        torch.manual_seed(3)
        forgotten = baseline.restore(TorchProcess)
        assert "edited_here" in forgotten and "edited_here" not in sys.modules
        assert "FLOWTRAIN_TEST_LEFT_BEHIND" not in os.environ and os.getcwd() == cwd
        assert str(tmp_path / "elsewhere") not in sys.path
        assert torch.get_default_dtype() == torch.float32 and torch.initial_seed() == TORCH_START_SEED
    finally:
        torch.set_default_dtype(dtype)
        torch.set_num_threads(threads)
        os.chdir(cwd)
        if data_context is not None:  # this test process's own, as the session left it
            from trainers._internal.ray_private import set_current_data_context

            set_current_data_context(data_context)


def test_deterministic_algorithms_are_put_back_without_importing_inductor():
    """``use_deterministic_algorithms`` imports torch's inductor config (0.8 s of a worker's CPU,
    once, at the end of every first ``fit()``): the reset calls it only when a run turned them on,
    and still turns them off when it did."""
    code = (
        "import sys, torch\n"
        "from trainers.torch.process import TorchProcess\n"
        "TorchProcess.reset()\n"
        "untouched = 'torch._inductor.config' not in sys.modules\n"
        "torch.use_deterministic_algorithms(True, warn_only=True)\n"
        "TorchProcess.reset()\n"
        "print(untouched, torch.are_deterministic_algorithms_enabled(),"
        " torch.is_deterministic_algorithms_warn_only_enabled(),"
        " sys.modules['torch._inductor.config'].deterministic)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["True", "False", "False", "False"], done.stdout + done.stderr


class _Model:
    """Stands in for a model that holds a torch process group."""


def test_a_failed_training_function_leaves_nothing_of_its_frames_alive(tmp_path):
    """The failure event holds the error until the controller acknowledges it; what the raising
    function held (a DDP model, so its gloo process group and sockets) must be free already, or
    the peers waiting in a collective with this rank would wait on (issue 46's kept survivors)."""
    import gc
    import weakref

    import pyarrow.fs as pafs

    from trainers._internal.events.messages import FailedEvent
    from trainers._internal.session.train_thread import run_training_function
    from worker_sessions import make_session

    events: list = []
    session = make_session(tmp_path, pafs.LocalFileSystem(), events)
    held = []

    def deeper(model):
        try:
            raise ValueError("the first error")
        except ValueError as first:
            raise RuntimeError("planted") from first

    def loop():
        model = _Model()
        held.append(weakref.ref(model))
        deeper(model)

    gc.disable()  # only references count: nothing is freed by a collection the test did not ask for
    try:
        run_training_function(loop, None, False, session, events.append)
        (failure,) = events
        assert isinstance(failure, FailedEvent) and str(failure.error) == "planted"
        assert failure.error.__traceback__ is not None and "deeper" in failure.traceback  # still told
        assert held[0]() is None, "the error sent to the controller keeps the training function's locals"
    finally:
        gc.enable()
