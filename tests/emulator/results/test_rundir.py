"""The run directory: files, links.csv against the summary, the per-rank breakdown, trace ranks."""

from __future__ import annotations

import json

import pytest

from emulator.config.cluster import ClusterConfig
from emulator.config.loader import load_run
from emulator.config.typed import from_dict
from emulator.errors import ConfigError
from emulator.results.rundir import read_run_dir
from emulator.results.tables import parse_rank_spec, rank_rows
from emulator.runner.sequence import execute
from netmodel.topology import Topology
from tests.conftest import cluster_dict

FILES = ("config.yaml", "summary.json", "links.csv", "ranks.csv", "histograms.csv", "timeline.csv", "trace.json")


def test_run_directory_has_every_file(dp_dir):
    """`emulator run` writes the resolved config, summary, tables and trace."""
    assert sorted(p.name for p in dp_dir.iterdir()) == sorted(FILES)


def test_resolved_config_reproduces_the_run(dp_dir):
    """Rerunning config.yaml alone gives the same fingerprint."""
    summary, _, _ = execute(load_run(dp_dir / "config.yaml"))
    assert summary["fingerprint"] == json.loads((dp_dir / "summary.json").read_text())["fingerprint"]


def test_link_bytes_add_up_to_bytes_per_tier(dp_dir):
    """Sender-side link bytes of a tier equal the summary's bytes of the messages crossing it."""
    data = read_run_dir(dp_dir)
    by_tier = data.summary["bytes_by_tier"]
    tiers = list(by_tier)
    assert all(by_tier[t] > 0 for t in tiers), by_tier  # the fixture sends traffic over every tier

    def link_bytes(tier, directions):
        return sum(r["bytes"] for r in data.links if r["tier"] == tier and r["direction"] in directions)

    assert link_bytes(tiers[0], ("tx",)) == link_bytes(tiers[0], ("rx",)) == by_tier[tiers[0]]
    for k in range(1, len(tiers)):
        crossing = sum(by_tier[t] for t in tiers[k:])  # a message over the spine also crosses the leaf
        assert link_bytes(tiers[k], ("tx", "up")) == link_bytes(tiers[k], ("rx", "down")) == crossing
    assert sum(r["messages"] for r in data.links if r["direction"] == "tx") == sum(
        data.summary["messages_by_tier"].values()
    )


def test_links_table_columns(dp_dir):
    """Every link is listed, with endpoints, capacity and utilisation = busy / run time."""
    data = read_run_dir(dp_dir)
    sim_ns = data.summary["sim_time_s"] * 1e9
    assert len(data.links) == len(Topology(load_run(dp_dir / "config.yaml").cluster).link_bw)
    row = next(r for r in data.links if r["name"] == "node1.nic3.tx")
    assert (row["src"], row["dst"], row["node"], row["tier"]) == ("node1.nic3", "ib-leaf#0.rail3", 1, "ib-leaf")
    up = next(r for r in data.links if r["name"] == "node2.nic5.ib-leaf-ib-spine.up")
    assert (up["src"], up["dst"]) == ("ib-leaf#1.rail5", "ib-spine#0")
    for r in data.links:
        assert r["utilisation"] == pytest.approx(r["busy_ns"] / sim_ns, abs=1e-6)


def test_histograms_match_summary(dp_dir):
    """Per-tier histogram rows hold the summary's counts; per-kind rows count the same messages."""
    data = read_run_dir(dp_dir)
    per_tier = {}
    for r in data.histograms:
        if r["by"] == "tier":
            per_tier.setdefault(r["key"], {})[r["label"]] = r["messages"]
    assert per_tier == data.summary["message_size_histogram"]
    kinds = sum(r["messages"] for r in data.histograms if r["by"] == "kind")
    assert kinds == sum(data.summary["messages_by_tier"].values())


def test_timeline_adds_up_and_stays_within_capacity(dp_dir):
    """Timeline bytes per tier sum to the summary's; no time bucket shows more than 100 % utilisation."""
    data = read_run_dir(dp_dir)
    for tier, nbytes in data.summary["bytes_by_tier"].items():
        assert sum(r["message_bytes"] for r in data.timeline if r["tier"] == tier) == nbytes
    assert 0.5 < max(r["utilisation"] for r in data.timeline) <= 1.0 + 1e-6


def test_breakdown_adds_up_to_run_time(dp_dir):
    """compute + exposed communication + bubble + idle is the run's virtual time on every rank."""
    data = read_run_dir(dp_dir)
    sim_ns = round(data.summary["sim_time_s"] * 1e9)
    for r in data.ranks:
        assert r["compute_ns"] + r["exposed_comm_ns"] + r["bubble_ns"] + r["idle_ns"] == sim_ns
        assert r["exposed_comm_ns"] + r["overlapped_comm_ns"] == r["comm_ns"]
    assert all(r["exposed_comm_ns"] > 0 and r["overlapped_comm_ns"] > 0 for r in data.ranks)


def test_waiting_on_the_pipeline_stream_is_bubble(run):
    """The compute stream waiting for a receive on stream "pp" counts as bubble, not communication."""

    def program(gpu):
        if gpu.rank == 0:
            gpu.compute("stage0", duration_ns=50_000)
            gpu.send(1, 1 << 20, stream="pp")
        elif gpu.rank == 1:
            gpu.recv(0, 1 << 20, stream="pp")
            gpu.compute("stage1", duration_ns=50_000)

    _, result, topo = run(program, cluster_dict(nodes=1, gpus=2))
    row = rank_rows(result, topo)[1]
    recv_done = result.ranks[1].final_time_ns - 50_000
    assert row["bubble_ns"] == recv_done > 50_000
    assert row["exposed_comm_ns"] == 0 and row["compute_ns"] == 50_000


@pytest.mark.parametrize(
    "spec,expected",
    [(None, list(range(8))), ("none", []), ("all", list(range(16))), ("0-2,9", [0, 1, 2, 9]), ([3, 1, 3], [1, 3])],
)
def test_parse_rank_spec(spec, expected):
    """--trace-ranks: default first node, none, all, ranges and lists."""
    topo = Topology(from_dict(ClusterConfig, cluster_dict(nodes=2), "cluster"))
    assert parse_rank_spec(spec, topo) == expected


@pytest.mark.parametrize("spec", ["0-99", "x", "3-a"])
def test_parse_rank_spec_errors(spec):
    """Bad rank lists are user errors naming the flag."""
    topo = Topology(from_dict(ClusterConfig, cluster_dict(nodes=2), "cluster"))
    with pytest.raises(ConfigError, match="--trace-ranks"):
        parse_rank_spec(spec, topo)


def test_plain_csv_lines_are_what_the_csv_module_writes(tmp_path):
    """write_csv's direct formatting (plain values) writes what csv.DictWriter writes."""
    import csv

    from emulator.results.rundir import write_csv
    from emulator.results.tables import csv_plain

    columns = ("tier", "bucket", "start_s", "utilisation", "bytes")
    rows = [{"tier": "ib-leaf", "bucket": b, "start_s": b * 1_000_000 / 1e9, "utilisation": round(b / 7, 6),
             "bytes": b << 40} for b in range(0, 3000, 7)]  # fmt: skip
    rows.append({"tier": "nvswitch", "bucket": 1 << 60, "start_s": 1e300, "utilisation": 0.0, "bytes": -1})
    expected = tmp_path / "dict.csv"
    with expected.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    for plain in (True, False):
        write_csv(tmp_path / "fast.csv", rows, columns, plain=plain)
        assert (tmp_path / "fast.csv").read_bytes() == expected.read_bytes()
    assert csv_plain(["nvswitch", "ib-leaf"]) and not csv_plain(["a,b"]) and not csv_plain(['q"']) \
        and not csv_plain([""])  # fmt: skip


def test_rows_are_plain_only_with_ints_floats_and_unquoted_text():
    """rows_plain: the rows that write_csv may format directly (ranks.csv, histograms.csv)."""
    from emulator.results.tables import rows_plain

    row = {"rank": 3, "gpu": "H100", "compute_slowdown": 1.25}
    assert rows_plain([row, row]) and rows_plain([])
    for bad in (True, None, "a,b", 'q"', "", "two\nlines", b"bytes"):
        assert not rows_plain([row, {**row, "gpu": bad}]), bad
