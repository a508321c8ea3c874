"""The Ray cluster as flowtrain sees it: join it, read what its nodes hold, and check that a
``ScalingConfig`` can ever be placed on it, before anything is reserved.

``fit()`` does all of this itself. These are for code that plans around the cluster, e.g. a sweep
deciding how many trials train at once::

    from trainers.cluster import bundles_that_fit, check_feasible, cluster_nodes, ensure_ray

    ensure_ray()
    nodes = cluster_nodes()
    check_feasible(scaling, nodes)      # InsufficientResourcesError saying what is missing
    trials = sum(bundles_that_fit(node, scaling.worker_resources) for node in nodes) // scaling.num_workers
"""

from trainers._internal.ray_init import ensure_ray
from trainers._internal.workers.resources import bundles_that_fit, check_feasible, cluster_nodes

__all__ = ["bundles_that_fit", "check_feasible", "cluster_nodes", "ensure_ray"]
