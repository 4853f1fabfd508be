"""``emulator plan``: enumeration, memory rejection, ranking against the emulation, files and CLI."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from emulator.api import load_config, run
from emulator.errors import ConfigError
from emulator.hardware.gpus import get_gpu
from emulator.plan import KNOBS, enumerate_candidates, plan, rank_candidates
from emulator.workloads.memory import stage_memory
from netmodel.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
RUN_22B = ROOT / "configs" / "runs" / "megatron-22b-8gpu.yaml"


@pytest.fixture(scope="module")
def ranked():
    base = load_config(RUN_22B)
    candidates, tried, truncated = enumerate_candidates(base)
    return base, rank_candidates(candidates, Topology(base.cluster)), tried, truncated


def test_enumeration_yields_only_valid_configs(ranked):
    base, candidates, tried, truncated = ranked
    assert not truncated and tried >= len(candidates) > 100
    seen = set()
    for c in candidates:
        k = c.knobs
        assert k["parallel.tensor"] * k["parallel.pipeline"] * k["parallel.data"] == 8
        assert 8 % k["parallel.tensor"] == 0  # inside a node
        assert base.model.num_layers % (k["parallel.pipeline"] * k["parallel.virtual_stages"]) == 0
        assert k["parallel.sequence_parallel"] is False or k["parallel.tensor"] > 1
        assert (k["parallel.virtual_stages"] > 1) == (k["parallel.schedule"] == "interleaved-1f1b")
        key = tuple(k[name] for name in KNOBS)
        assert key not in seen
        seen.add(key)
    for c in candidates[::25]:  # the file loads with the knobs as overrides, as the sweep loads it
        loaded = load_config(RUN_22B, c.overrides())
        assert loaded.parallel.data == c.knobs["parallel.data"]
        assert loaded.training.micro_batch_size == c.knobs["training.micro_batch_size"]


def test_enumeration_is_bounded():
    candidates, tried, truncated = enumerate_candidates(load_config(RUN_22B), limit=40)
    assert truncated and tried == 40 and len(candidates) <= 40


def test_memory_rejection_is_the_memory_model(ranked):
    _, candidates, _, _ = ranked
    capacity = get_gpu("a100-sxm-80gb").hbm_bytes
    fits = 0
    for c in candidates:
        stages = [stage_memory(c.config, s) for s in range(c.config.parallel.pipeline)]
        assert c.estimate.fits == all(s.peak_bytes <= capacity for s in stages)
        assert c.estimate.peak_memory_bytes == max(s.peak_bytes for s in stages)
        assert (c.rank is not None) == c.estimate.fits
        fits += c.estimate.fits
    assert 0 < fits < len(candidates)  # some of the 22B's splits do not fit on 80 GB


def test_ranking_agrees_with_the_emulation(ranked):
    """The best estimated candidate is within 5% of the best emulated among a spread of candidates,
    and candidates whose estimates differ by more than 25% are emulated in the same order."""
    _, candidates, _, _ = ranked
    fitting = [c for c in candidates if c.rank is not None]
    picks = [fitting[0], fitting[len(fitting) // 4], fitting[len(fitting) // 2], fitting[-1]]
    emulated = [run(c.config, trace_ranks="none").summary["iteration_time_s"] for c in picks]
    assert emulated[0] <= min(emulated) * 1.05
    estimated = [c.estimate.iteration_time_s for c in picks]
    for i in range(len(picks)):
        for j in range(i + 1, len(picks)):
            if estimated[j] > estimated[i] * 1.25:
                assert emulated[j] > emulated[i], (picks[i].knobs, picks[j].knobs)


def test_cli_writes_plan_csv_and_a_runnable_best_yaml(tmp_path, capsys):
    out = tmp_path / "plan"
    from emulator.cli import main

    assert main(["plan", str(RUN_22B), "--top", "2", "--workers", "2", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "estimate vs emulation over 2 emulated" in printed and "best (emulated)" in printed
    rows = list(csv.DictReader((out / "plan.csv").open()))
    base = load_config(RUN_22B)
    candidates, _, _ = enumerate_candidates(base)
    assert len(rows) == len(candidates)
    emulated = [r for r in rows if r["emulated_status"]]
    assert [r["rank"] for r in emulated] == ["1", "2"] and all(r["emulated_status"] == "ok" for r in emulated)
    for r in emulated:
        error = (float(r["est_iteration_time_s"]) - float(r["emulated_iteration_time_s"])) / float(
            r["emulated_iteration_time_s"]
        )
        assert float(r["estimate_error"]) == pytest.approx(error, abs=1e-3)
    best_row = min(emulated, key=lambda r: float(r["emulated_iteration_time_s"]))
    best = load_config(out / "best.yaml")
    assert best.name == base.name
    assert best.parallel.tensor == int(best_row["parallel.tensor"])
    assert best.parallel.zero_stage == int(best_row["parallel.zero_stage"])
    assert best.training.recompute == best_row["training.recompute"]
    assert main(["run", str(out / "best.yaml"), "--out", str(tmp_path / "best-run")]) == 0
    rerun = load_config(tmp_path / "best-run" / "config.yaml")
    assert rerun.parallel.pipeline == int(best_row["parallel.pipeline"])
    import json

    summary = json.loads((tmp_path / "best-run" / "summary.json").read_text())
    assert summary["iteration_time_s"] == pytest.approx(float(best_row["emulated_iteration_time_s"]), rel=1e-9)


def test_top_zero_estimates_only(tmp_path):
    result = plan(RUN_22B, top=0, out=tmp_path / "p", quiet=True)
    assert not result.emulated and result.best is result.fitting[0]
    best = load_config(tmp_path / "p" / "best.yaml")
    assert best.parallel.tensor == result.best.knobs["parallel.tensor"]


def test_user_errors(tmp_path):
    with pytest.raises(ConfigError, match="--top"):
        plan(RUN_22B, top=-1, out=tmp_path / "neg")
    program_run = ROOT / "configs" / "examples" / "data-parallel.yaml"
    with pytest.raises(ConfigError, match="model"):
        plan(program_run, top=0, out=tmp_path / "noprog")
    # nothing fits: a 22B model on one GPU
    with pytest.raises(ConfigError, match="fits in memory"):
        plan(RUN_22B, top=0, out=tmp_path / "one", overrides=["cluster.gpus_per_node=1", "parallel.tensor=1"])


def test_emulations_stop_at_the_wall_time_budget(tmp_path, capsys):
    """The first batch always runs; none starts that would end past --max-wall-s."""
    result = plan(RUN_22B, top=3, out=tmp_path / "p", workers=1, quiet=True, max_wall_s=1e-6)
    assert len(result.emulated) == 1 and result.emulated[0].rank == 1
    assert "emulated 1 of the top 3" in capsys.readouterr().err
    result = plan(RUN_22B, top=3, out=tmp_path / "q", workers=1, quiet=True, max_wall_s=None)
    assert len(result.emulated) == 3
