"""pyarrow's filesystems load where they are used: a worker that never touches the run's storage
loads none, and a run on local disk never loads the S3, GCS, Azure and HDFS libraries.

Each check runs in a fresh interpreter, which is the only place "not imported" means anything.
"""

from __future__ import annotations

import ast
import pickle
import subprocess
import sys

import pyarrow.fs as pafs

from trainers.context import StorageInfo

REMOTE = ("pyarrow._s3fs", "pyarrow._gcsfs", "pyarrow._azurefs", "pyarrow._hdfs")


def loaded_after(code: str, argument: bytes = b"") -> dict[str, bool]:
    """Which pyarrow modules a fresh interpreter holds after running ``code`` (with ``argument``,
    pickled bytes, as ``sent``), and what ``code`` put in ``result``."""
    script = (
        "import pickle, sys\n"
        "sent = sys.stdin.buffer.read()\n"
        "result = {}\n"
        f"{code}\n"
        "result.update({m: m in sys.modules for m in ('pyarrow._fs', 'pyarrow.fs') + " + repr(REMOTE) + "})\n"
        "print(repr(result))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], input=argument, capture_output=True, check=True)
    return ast.literal_eval(done.stdout.decode().strip().splitlines()[-1])


def test_a_workers_storage_stays_unloaded_until_it_is_used(tmp_path):
    info = StorageInfo(str(tmp_path), str(tmp_path / "run"), str(tmp_path / "run"), pafs.LocalFileSystem())
    before = loaded_after("info = pickle.loads(sent); result['path'] = info.experiment_fs_path", pickle.dumps(info))
    assert before["path"] == str(tmp_path / "run")
    assert not before["pyarrow._fs"] and not before["pyarrow.fs"]

    used = loaded_after(
        "info = pickle.loads(sent); result['kind'] = type(info.storage_filesystem).__name__", pickle.dumps(info)
    )
    assert used["kind"] == "LocalFileSystem"
    assert used["pyarrow._fs"] and not any(used[m] for m in REMOTE)


def test_a_metrics_only_report_leaves_the_workers_storage_unloaded(tmp_path):
    info = StorageInfo(str(tmp_path), str(tmp_path / "run"), str(tmp_path / "run"), pafs.LocalFileSystem())
    code = (
        "from storage.layout import RunLayout\n"
        "from trainers._internal.session.worker_session import WorkerSession\n"
        "from trainers.context import TrainContext\n"
        "info, events = pickle.loads(sent), []\n"
        "session = WorkerSession(context=TrainContext('run', 1, 0, 0, 1, 0, info), attempt=1,\n"
        "    layout=RunLayout(info.experiment_fs_path), checkpoint=None, dataset_shards={}, emit=events.append)\n"
        "session.report({'loss': 0.5}, None)\n"
        "result['reported'] = [type(event).__name__ for event in events]"
    )
    reported = loaded_after(code, pickle.dumps(info))
    assert reported["reported"] == ["ReportEvent"]
    assert not reported["pyarrow._fs"] and not reported["pyarrow.fs"]


def test_a_worker_sees_a_local_marker_without_loading_pyarrow(tmp_path):
    marker = tmp_path / "lease.json"
    marker.write_text("{}")
    info = StorageInfo(str(tmp_path), str(tmp_path), str(tmp_path), pafs.LocalFileSystem())
    code = (
        "from trainers._internal.workers.shared_storage import what_this_node_sees\n"
        "shipped, marker = pickle.loads(sent)\n"
        "result['there'] = what_this_node_sees(shipped, marker)[1]\n"
        "result['missing'] = what_this_node_sees(shipped, marker + '.gone')[1]"
    )
    seen = loaded_after(code, pickle.dumps((info.shipped_filesystem, str(marker))))
    assert seen["there"] is None and seen["missing"] == "does not see it"
    assert not seen["pyarrow._fs"]


def test_a_run_on_local_disk_loads_no_remote_filesystem(tmp_path):
    code = (
        "from storage import Checkpoint, upload_directory\n"
        "from storage.filesystem import resolve_filesystem, exists, download_directory\n"
        f"folder = {str(tmp_path / 'ckpt')!r}\n"
        "import os; os.makedirs(folder); open(os.path.join(folder, 'w.txt'), 'w').write('1')\n"
        f"fs, root = resolve_filesystem({str(tmp_path / 'runs')!r})\n"
        "upload_directory(Checkpoint.from_directory(folder).path, fs, root + '/c1')\n"
        "download_directory(fs, root + '/c1', folder + '_back')\n"
        "result['copied'] = exists(fs, root + '/c1/w.txt') and os.path.exists(folder + '_back/w.txt')"
    )
    loaded = loaded_after(code)
    assert loaded["copied"]
    assert loaded["pyarrow._fs"] and not any(loaded[m] for m in REMOTE) and not loaded["pyarrow.fs"]


def test_a_remote_filesystem_is_rebuilt_with_all_of_pyarrow_fs(tmp_path):
    # The whole of pyarrow.fs registers the S3 library's clean-up at exit, so it comes first.
    remote = pafs.S3FileSystem(region="us-east-1", endpoint_override="127.0.0.1:9", anonymous=True)
    info = StorageInfo("s3://bucket/runs", "s3://bucket/runs/r", "bucket/runs/r", remote)
    rebuilt = loaded_after(
        "info = pickle.loads(sent); result['kind'] = type(info.storage_filesystem).__name__", pickle.dumps(info)
    )
    assert rebuilt["kind"] == "S3FileSystem"
    assert rebuilt["pyarrow.fs"] and rebuilt["pyarrow._s3fs"]
