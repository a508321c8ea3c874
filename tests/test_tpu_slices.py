"""JaxTrainer on multi-host TPU slices, on a fake TPU cluster built as Ray's own
``test_jax_trainer.py`` builds one: four 1-CPU Ray nodes with TPU resources and Ray's TPU labels
and variables make two v4-16 slices (topology 2x2x2) of two 4-chip hosts each."""

from __future__ import annotations

import pytest

import jax_loops
from conftest import assert_no_leaks
from test_jax import PerRank
from trainers import RunConfig, ScalingConfig
from trainers._internal.workers.tpu import multislice_env

POD_TYPE = "v4-16"
TOPOLOGY = "2x2x2"


def tpu_host(slice_name: str, worker_id: str) -> dict:
    """``Cluster.add_node`` arguments of one host of a slice (host 0 carries the slice's head resource)."""
    resources = {"TPU": 4, "accelerator_type:TPU-V4": 1}
    if worker_id == "0":
        resources[f"TPU-{POD_TYPE}-head"] = 1
    return {
        "num_cpus": 1,
        "resources": resources,
        "labels": {
            "ray.io/tpu-slice-name": slice_name,
            "ray.io/tpu-worker-id": worker_id,
            "ray.io/tpu-pod-type": POD_TYPE,
        },
        # Ray finds a host's slice name in TPU_NAME (as on KubeRay).
        "env_vars": {
            "TPU_NAME": slice_name,
            "TPU_WORKER_ID": worker_id,
            "TPU_ACCELERATOR_TYPE": POD_TYPE,
            "TPU_TOPOLOGY": TOPOLOGY,
        },
    }


@pytest.fixture(scope="module")
def tpu_cluster():
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()  # the suite's shared single-node Ray; ray_local restarts it when needed
    cluster = Cluster(initialize_head=True, head_node_args={**tpu_host("slice-A", "0"), "include_dashboard": False})
    for host in (("slice-A", "1"), ("slice-B", "0"), ("slice-B", "1")):
        cluster.add_node(**tpu_host(*host))
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_four_workers_take_a_host_each_across_two_slices_with_rays_megascale_variables(tpu_cluster, tmp_path):
    from trainers.jax import JaxTrainer

    seen = PerRank()
    result = JaxTrainer(
        jax_loops.tpu_placement_loop,
        scaling_config=ScalingConfig(use_tpu=True, accelerator_type="TPU-V4", topology=TOPOLOGY, num_workers=4),
        run_config=RunConfig(
            name="tpu",
            storage_path=str(tmp_path),
            callbacks=[seen],
            worker_runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}},  # the chips are fake
        ),
    ).fit()
    assert result.error is None
    assert_no_leaks()  # the slices' head reservations went with the workers' group
    (reports,) = seen.reports
    assert [r["rank"] for r in reports] == [0, 1, 2, 3]
    assert len({r["node"] for r in reports}) == 4  # a whole host each
    # Ranks follow the slices (by slice name, as Ray's by TPU pod name), so slice ids are contiguous.
    assert [r["slice"] for r in reports] == ["slice-A", "slice-A", "slice-B", "slice-B"]
    assert {r["MEGASCALE_COORDINATOR_ADDRESS"] for r in reports} == {reports[0]["node_ip"]}
    assert {r["MEGASCALE_NUM_SLICES"] for r in reports} == {"2"}
    assert [r["MEGASCALE_SLICE_ID"] for r in reports] == ["0", "0", "1", "1"]


def test_workers_that_fill_one_slice_get_no_megascale_variables():
    # As in Ray: the variables describe several slices; JAX needs none on one.
    assert multislice_env("10.0.0.1", 1, num_workers=2, workers_per_slice=2) == {}
    assert multislice_env("10.0.0.1", 5, num_workers=8, workers_per_slice=4)["MEGASCALE_SLICE_ID"] == "1"
