"""`emulator compare`: config changes and result deltas of two runs."""

from __future__ import annotations

import json

from emulator.cli import main
from emulator.results.compare import compare, flatten, result_figures
from emulator.results.rundir import read_run_dir
from tests.emulator.conftest import DP, DP_SMALL, cli_run


def test_compare_shows_the_deltas_of_one_knob(dp_dir, tmp_path, capsys):
    """Halving the gradients: one config change, halved bytes per tier, shorter communication."""
    smaller = tmp_path / "dp-small"
    cli_run(smaller, DP, *DP_SMALL, "--set", "program_args.grad_bytes=33554432")
    cmp = compare(dp_dir, smaller)
    assert [(c["key"], c["a"], c["b"]) for c in cmp["config"]] == [("program_args.grad_bytes", 67108864, 33554432)]
    assert not cmp["same_fingerprint"]
    rows = {r["key"]: r for r in cmp["results"]}
    for tier in ("nvswitch", "ib-leaf", "ib-spine"):
        row = rows[f"bytes_by_tier.{tier}"]
        assert row["b"] * 2 == row["a"] and row["delta"] == -row["b"] and row["relative"] == -0.5
    assert rows["ranks.mean.comm_ns"]["delta"] < 0
    assert not rows["world_size"]["changed"]

    assert main(["compare", str(dp_dir), str(smaller)]) == 0
    text = capsys.readouterr().out
    assert "program_args.grad_bytes: 67108864 -> 33554432" in text
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("bytes_by_tier.nvswitch"))
    assert "-50.0%" in line
    assert main(["compare", str(dp_dir), str(smaller), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config"] == cmp["config"]


def test_compare_a_run_with_itself(dp_dir):
    """No config change, the same fingerprint, no changed result except wall-clock figures."""
    cmp = compare(dp_dir, dp_dir)
    assert cmp["config"] == [] and cmp["same_fingerprint"]
    assert not [r for r in cmp["results"] if r["changed"]]


def test_flatten():
    """Nested dicts and lists flatten to dotted keys."""
    assert flatten({"a": {"b": [1, {"c": 2}]}, "d": None}) == {"a.b.0": 1, "a.b.1.c": 2, "d": None}


def test_per_dimension_means_and_older_run_directories(gpt_dir):
    """The per-rank means include the tensor and data-parallel waits; a run directory written before
    those columns existed compares without them."""
    data = read_run_dir(gpt_dir)
    figures = result_figures(data)
    assert figures["ranks.mean.exposed_tp_ns"] > 0 and "ranks.mean.exposed_dp_ns" in figures
    data.ranks = [{k: v for k, v in r.items() if k not in ("exposed_tp_ns", "exposed_dp_ns")} for r in data.ranks]
    older = result_figures(data)
    assert "ranks.mean.exposed_tp_ns" not in older
    assert older["ranks.mean.compute_ns"] == figures["ranks.mean.compute_ns"]
