"""Shared fixtures: small clusters and a helper that runs a program inline."""

from __future__ import annotations

from pathlib import Path

import pytest

from emulator.backends.inline import run_inline
from emulator.config.schema import RunConfig
from emulator.config.typed import from_dict
from emulator.results.summary import summarize
from netmodel.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def cluster_dict(nodes=2, gpus=8, su_bw=300.0, su_lat=2.0, nic_count=8, nic_gbps=200.0, leaf_lat=5.0, **extra):
    d = {
        "nodes": nodes,
        "gpus_per_node": gpus,
        "gpu": "a100-sxm-80gb",
        "scale_up": {"bandwidth_GBps": su_bw, "latency_us": su_lat, "efficiency": 1.0},
        "nic": {"count": nic_count, "bandwidth_Gbps": nic_gbps, "efficiency": 1.0},
        "tiers": [{"name": "leaf", "span_nodes": 0, "latency_us": leaf_lat}],
    }
    d.update(extra)
    return d


def run_program(program, cluster=None, args=None, shards=1, trace_ranks=(), fast="intra_node", engine=None):
    """Run a Python function as every rank's program; returns (summary, result, topo)."""
    engine = {"fast_collectives": fast, **(engine or {})}
    data = {"program": "inline:program", "cluster": cluster or cluster_dict(), "engine": engine}
    config = from_dict(RunConfig, data, "")
    topo = Topology(config.cluster)
    result = run_inline(config, topo, shards, program=program, args=args or {}, trace_ranks=trace_ranks)
    return summarize(result, topo, 1.0, "inline", shards), result, topo


@pytest.fixture
def run():
    return run_program
