"""Pieces of the Ray backend that need no running Ray: records, programs, placement, deploy files.

PYTHONPATH=. python -m pytest -q tests/actors/test_parts.py
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from emulator.config.schema import RunConfig
from emulator.config.typed import from_dict
from emulator.errors import BackendError
from tests.conftest import ROOT, cluster_dict

pytest.importorskip("ray")

from actors.backend import import_ray, place_shards  # noqa: E402
from actors.shard_actor import decode_records, encode_records, localise_program  # noqa: E402


def test_records_round_trip_exactly():
    """Records come back as the same tuples, in order, big collective signatures included."""
    records = [(5000, 3, 17, 1, 1 << 20, 4000, 0, 7, 0, 2, 1 << 20), (6000, 1, 2, 9, 64, 10, 123, 0, 1, 0, 3 << 70)]
    assert decode_records(encode_records(records)) == records


def test_program_file_is_shipped_when_it_differs(tmp_path):
    """The driver's copy of the program wins over a missing or different file on the shard's host."""
    source = b"def main(gpu):\n    gpu.mark_iteration()\n"
    here = tmp_path / "prog.py"
    here.write_bytes(source)
    config = from_dict(RunConfig, {"program": f"{here}:main", "cluster": cluster_dict()}, "")
    assert localise_program(config, source) is config  # same file here: used as it is
    here.write_bytes(b"def main(gpu):\n    pass\n")  # this host's file is stale
    moved = localise_program(config, source)
    path, func = moved.program.rsplit(":", 1)
    assert func == "main" and Path(path).read_bytes() == source and Path(path).name == "prog.py"


class FakeRay:
    """``ray.nodes()`` of a cluster: head without CPUs, two workers (listed out of order)."""

    @staticmethod
    def nodes():
        node = lambda i, ip, cpus, alive=True: {"NodeID": f"n{i}", "NodeManagerAddress": ip, "Alive": alive,
                                                "Resources": {"CPU": cpus} if cpus else {}}  # fmt: skip
        return [node(3, "10.0.0.10", 1), node(1, "10.0.0.9", 4), node(0, "10.0.0.1", 0), node(2, "10.0.0.2", 8, False)]


def test_placement_round_robin_over_nodes_sorted_by_ip():
    """Shard i on node i % nodes (by IP, numerically); CPUs shared where shards outnumber them."""
    placement = place_shards(FakeRay, 5)
    assert [p["ip"] for p in placement] == ["10.0.0.9", "10.0.0.10"] * 2 + ["10.0.0.9"]
    assert [p["num_cpus"] for p in placement] == [1.0, 0.5, 1.0, 0.5, 1.0]


def test_missing_ray_is_one_clear_line(monkeypatch):
    """Without Ray the backend says how to install it."""
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(BackendError, match=r"^the Ray backend needs Ray: pip install"):
        import_ray()


def test_cli_writes_config_before_the_run(tmp_path, monkeypatch):
    """A run that fails still leaves its config.yaml in the run directory."""
    import emulator.runner.sequence
    from emulator.cli import main

    def lost(*args, **kwargs):
        raise BackendError("shard 1 on host 10.0.0.3 died: test")

    monkeypatch.setattr(emulator.runner.sequence, "execute", lost)
    out = tmp_path / "run"
    assert main(["run", str(ROOT / "configs/examples/ping-pong.yaml"), "--backend", "ray", "--out", str(out)]) == 2
    assert (out / "config.yaml").is_file() and not (out / "summary.json").exists()


def test_deploy_files_are_valid():
    """cluster.yaml passes Ray's own launcher schema; the role scripts parse."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(yaml.safe_load((ROOT / "deploy/ray/cluster.yaml").read_text()))
    validate_config(config)
    assert len(config["provider"]["worker_ips"]) == 3 and config["max_workers"] == 3
    for script in ("start-head.sh", "start-worker.sh", "ports.sh"):
        subprocess.run(["bash", "-n", str(ROOT / "deploy/ray" / script)], check=True)
