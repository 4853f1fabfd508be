"""One Ray for every test of the Ray backend: a four-node ``ray.cluster_utils.Cluster`` of one CPU each
(four CPUs in all), so that every test also runs shards pinned across Ray nodes, up to one per node.

Tests that kill or freeze a shard's process take ``own_ray_cluster`` instead: a cluster of their
module's own, so that a raylet brought down with a killed worker takes no other test with it.
"""

from __future__ import annotations

import logging

import pytest

RAY_NODES = 4
STORE_BYTES = 80 << 20
_SESSION: dict = {}  # the session's cluster, to reconnect to after a module ran on its own


def _start(ray, nodes: int):
    from ray.cluster_utils import Cluster

    head = {"num_cpus": 1, "object_store_memory": STORE_BYTES, "include_dashboard": False}  # CI installs ray[default]
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for _ in range(nodes - 1):
        cluster.add_node(num_cpus=1, object_store_memory=STORE_BYTES)
    _connect(ray, cluster)
    cluster.wait_for_nodes()
    return cluster


def _connect(ray, cluster) -> None:
    ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)


@pytest.fixture(scope="session")
def ray_cluster():
    """Start the four-node Ray once per session; shut it down at the end."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    cluster = _SESSION["cluster"] = _start(ray, RAY_NODES)
    yield cluster
    _SESSION.clear()
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture(scope="module")
def own_ray_cluster():
    """A two-node Ray cluster for one module of tests that kill shard processes; the driver leaves
    the session's cluster (if it was started) for the module and returns to it afterwards."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        ray.shutdown()
    cluster = _start(ray, 2)
    yield cluster
    ray.shutdown()
    cluster.shutdown()
    if "cluster" in _SESSION:
        _connect(ray, _SESSION["cluster"])
