"""One Ray for every test of the Ray backend: a four-node ``ray.cluster_utils.Cluster`` of one CPU each
(four CPUs in all), so that every test also runs shards pinned across Ray nodes, up to one per node."""

from __future__ import annotations

import logging

import pytest

RAY_NODES = 4


@pytest.fixture(scope="session")
def ray_cluster():
    """Start the four-node Ray once per session; shut it down at the end."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    store = 80 << 20
    head = {"num_cpus": 1, "object_store_memory": store, "include_dashboard": False}  # CI installs ray[default]
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for _ in range(RAY_NODES - 1):
        cluster.add_node(num_cpus=1, object_store_memory=store)
    ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()
