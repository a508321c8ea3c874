"""Optional framework integrations: `import trainers` loads none of them; a missing one names its extra."""

from __future__ import annotations

import subprocess
import sys

import pytest

from trainers._extras import MissingExtraError, require


def test_importing_trainers_loads_no_framework_integration():
    code = (
        "import sys, trainers, trainers.torch\n"
        "print(sorted(m for m in ('lightning', 'transformers', 'accelerate') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_missing_framework_names_the_install_command():
    with pytest.raises(MissingExtraError, match=r"pip install 'flowtrain\[lightning\]'") as caught:
        require("flowtrain_no_such_framework", extra="lightning")
    assert isinstance(caught.value, ImportError) and caught.value.extra == "lightning"


@pytest.mark.parametrize(
    ("package", "blocked", "extra"),
    [
        ("trainers.lightning", "lightning", "lightning"),
        ("trainers.huggingface.transformers", "transformers", "transformers"),
    ],
)
def test_integration_without_its_framework_raises_import_error(package, blocked, extra):
    # A fresh interpreter where the framework cannot be imported (a None entry in sys.modules).
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        f"try:\n    import {package}\nexcept ImportError as e:\n    print(type(e).__name__, e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("MissingExtraError") and f"pip install 'flowtrain[{extra}]'" in out


def test_prepare_trainer_rejects_a_lightning_strategy_that_launches_its_own_processes(tmp_path):
    import lightning.pytorch as pl

    from trainers.lightning import prepare_trainer

    trainer = pl.Trainer(strategy="ddp", accelerator="cpu", devices=1, logger=False, default_root_dir=str(tmp_path))
    with pytest.raises(TypeError, match=r"strategy is DDPStrategy; use strategy=RayDDPStrategy\(\)"):
        prepare_trainer(trainer)


def test_transformers_prepare_trainer_names_a_world_size_mismatch(tmp_path, monkeypatch):
    import pyarrow.fs
    import transformers

    from trainers.context import StorageInfo, TrainContext, _set_context
    from trainers.huggingface.transformers import prepare_trainer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = transformers.BertForSequenceClassification(
        transformers.BertConfig(
            vocab_size=8, hidden_size=4, num_hidden_layers=1, num_attention_heads=1, intermediate_size=4
        )
    )
    # Arguments built where no process group exists (world size 1), used by a 2-worker run.
    args = transformers.TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    trainer = transformers.Trainer(model=model, args=args)
    storage = StorageInfo(str(tmp_path), str(tmp_path), str(tmp_path), pyarrow.fs.LocalFileSystem())
    _set_context(TrainContext("run", 2, 0, 0, 2, 0, storage))
    try:
        with pytest.raises(
            RuntimeError, match=r"world size of 1, but 2 workers train; create TrainingArguments inside"
        ):
            prepare_trainer(trainer)
    finally:
        _set_context(None)
