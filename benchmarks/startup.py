"""One measurement of the start-up workload, in a process of its own.

    python -m benchmarks.startup flowtrain|ray.train|raw     # prints one JSON line last

The process imports what a script would and starts Ray (for the two trainers; raw torch needs
none), then runs the trivial 2-worker job (one report) three times: the first run is timed
(``wall_s``: the first ``fit()`` of a process, from the call, Ray already up), the second too
(``again_wall_s``: the next ``fit()`` of the same shape, where flowtrain reuses the workers it kept
and the others start new processes), the third is sampled for the peak PSS of this process's tree
(``peak_pss_mb``: this process, the Ray processes it started and the workers), and for a second
after it. Sampling reads every
process's memory map, tens of ms each, which would slow the run it timed. A process of its own per measurement keeps what one implementation loaded, or left in
Ray's worker pool, out of the next one's time and memory. ``benchmarks.workloads.startup`` runs it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time

from benchmarks.scale_run import TreeSampler
from benchmarks.workloads import run_trivial_job

#: Seconds the PSS sampling goes on after the sampled run: flowtrain's run takes 0.05 s, shorter
#: than one sample of the tree, so a single sample at an arbitrary moment was its "peak" (25 MB
#: apart from one process to the next); the tree as the run leaves it counts too.
SETTLE_S = 1.0

#: What a script using each implementation imports at its top (module, name).
DRIVER_IMPORT = {
    "flowtrain": ("trainers.torch", "TorchTrainer"),
    "ray.train": ("ray.train.torch", "TorchTrainer"),
    "raw": ("torch.multiprocessing", "spawn"),
}


def measure(impl: str) -> dict:
    """Seconds of the first and the second run of the trivial job, and the peak PSS during a third."""
    module, name = DRIVER_IMPORT[impl]
    getattr(importlib.import_module(module), name)  # a script's imports: the timed run starts at the call
    if impl != "raw":
        import ray

        ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    storage = tempfile.mkdtemp(prefix="flowtrain-startup-")
    start = time.perf_counter()
    run_trivial_job(impl, storage, "startup-timed")
    wall_s = time.perf_counter() - start
    start = time.perf_counter()
    run_trivial_job(impl, storage, "startup-again")
    again_wall_s = time.perf_counter() - start
    sampler = TreeSampler(os.getpid(), interval_s=0.1).start()
    run_trivial_job(impl, storage, "startup-sampled")
    time.sleep(SETTLE_S)
    return {"wall_s": wall_s, "again_wall_s": again_wall_s, "peak_pss_mb": sampler.stop()["peak_pss_mb"]}


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1])), flush=True)
