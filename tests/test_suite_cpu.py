"""benchmarks.suite_cpu: a command's CPU charged to the kinds of process that used it."""

from __future__ import annotations

import json
import sys

from benchmarks import suite_cpu


def test_processes_are_counted_by_kind():
    assert suite_cpu.kind_of("ray::TrainWorker.next_events") == "ray actor/task TrainWorker"
    assert suite_cpu.kind_of("ray::IDLE") == "ray actor/task IDLE"
    assert suite_cpu.kind_of("/venv/lib/ray/core/src/ray/gcs/gcs_server --port=1") == "ray gcs_server"
    # Options name other programs' files: a starting worker is not the raylet whose socket it gets.
    worker = "/venv/bin/python /venv/lib/ray/_private/workers/default_worker.py --raylet-name=/tmp/ray/sockets/raylet"
    assert suite_cpu.kind_of(worker) == "ray worker, starting"
    assert suite_cpu.kind_of("/venv/lib/ray/core/src/ray/raylet/raylet --store_socket_name=/x") == "ray raylet"
    assert suite_cpu.kind_of("/venv/bin/python -m pytest --durations=25") == "pytest"
    assert suite_cpu.kind_of("/venv/bin/prefect server start --host 127.0.0.1") == "prefect server"
    assert suite_cpu.kind_of("/usr/bin/python3 -m tasks.example_data") == "python -m tasks.example_data"
    assert suite_cpu.kind_of("") == "other"


def test_a_busy_command_is_charged_its_cpu_and_its_exit_status_kept(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    # A second of CPU, then a pause longer than a reading's interval (what a process uses after the
    # last reading before it ends is not seen), then exit 3.
    busy = "import sys, time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass\ntime.sleep(0.6)\nsys.exit(3)"
    status = suite_cpu.main(["--out", str(out), "--interval", "0.2", "--", sys.executable, "-c", busy])
    assert status == 3
    table = json.loads(out.read_text())
    assert table["returncode"] == 3 and table["command"][0] == sys.executable
    assert table["cpu_s"] >= 0.9 and table["wall_s"] >= 0.9 and table["cores_busy"] > 0
    mine = [kind for kind in table["cpu_s_by_kind"] if kind.startswith("python -c")]
    assert mine and table["cpu_s_by_kind"][mine[0]] >= 0.9, table
    assert "CPU s" in capsys.readouterr().out
