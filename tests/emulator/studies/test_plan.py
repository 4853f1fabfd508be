"""``emulator plan``: enumeration, memory rejection, ranking against the emulation, files and CLI."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from emulator.api import load_config, run
from emulator.errors import ConfigError
from emulator.hardware.gpus import get_gpu
from emulator.studies.plan import (
    KNOBS,
    balanced_layers,
    enumerate_candidates,
    fit_in_memory,
    plan,
    proportional_layers,
    rank_candidates,
    uneven_partitions,
)
from emulator.workloads.memory import stage_memory
from netmodel.topology import Topology

ROOT = Path(__file__).resolve().parents[3]
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
        assert k["parallel.tensor"] * k["parallel.context"] * k["parallel.pipeline"] * k["parallel.data"] == 8
        assert 2048 % (2 * k["parallel.context"]) == 0  # the sequence splits into 2 * context chunks
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


HETERO = ROOT / "configs" / "runs" / "hetero-uneven-pipeline.yaml"


def test_proportional_split_by_hand():
    """Two GPU types, the second twice as fast per layer: 40 layers split 13/27 (13.33 and 26.67 rounded
    by largest remainder); balancing 2 ms of logits on the fast stage moves one layer to the slow one."""
    assert proportional_layers(40, [2, 1]) == [13, 27]
    assert sorted(proportional_layers(10, [1, 1, 1])) == [3, 3, 4]
    assert balanced_layers(40, [2, 1], [0, 0]) == [13, 27]  # max(26, 27) beats max(28, 26)
    assert balanced_layers(40, [2, 1], [0, 2]) == [14, 26]  # max(28, 28)
    parts = uneven_partitions(40, [(2, 0), (1, 2)])
    assert parts[:2] == [(13, 27), (14, 26)] and all(sum(p) == 40 and min(p) >= 1 for p in parts)


def test_uneven_partitions_are_valid_and_respect_memory():
    """On the A100 + H100 cluster: every uneven candidate loads as a run file, gives the H100 stages at
    least as many layers as the A100 stages, and its fitting flag is the memory model's."""
    base = load_config(HETERO)
    candidates, _, _ = enumerate_candidates(base, limit=4000)
    uneven = [c for c in candidates if c.knobs["parallel.pipeline_layers"] is not None]
    assert uneven and any(c.knobs["parallel.pipeline_layers"] is None for c in candidates)
    ranked = rank_candidates(uneven, Topology(base.cluster))
    for c in ranked[:: max(1, len(ranked) // 40)]:
        layers = c.knobs["parallel.pipeline_layers"]
        loaded = load_config(HETERO, c.overrides())
        assert loaded.parallel.pipeline_layers == list(layers)
        assert sum(layers) * loaded.parallel.virtual_stages == base.model.num_layers
        stages = [stage_memory(loaded, s) for s in range(loaded.parallel.pipeline)]
        assert c.estimate.fits == all(s.peak_bytes <= s.capacity_bytes for s in stages)
        half = len(layers) // 2  # stages of the first half on the A100 nodes, the rest on the H100s
        if len(layers) % 2 == 0:
            assert min(layers[half:]) >= max(layers[:half]) - 1, layers


def test_memory_moves_layers_off_a_stage_that_does_not_fit():
    """A partition that puts almost every layer of a 40-layer 13B model on stage 0 (tensor 2, no
    recomputation, 4 microbatches in flight there: ~190 GiB) is moved until every stage fits."""
    knobs = {"training.recompute": "none", "parallel.tensor": 2, "parallel.data": 4}
    config = load_config(HETERO, {**knobs, "parallel.pipeline_layers": [37, 1, 1, 1]})
    assert stage_memory(config, 0).peak_bytes > stage_memory(config, 0).capacity_bytes
    layers = fit_in_memory(config, (37, 1, 1, 1))
    assert sum(layers) == 40 and layers[0] < 37
    moved = load_config(HETERO, {**knobs, "parallel.pipeline_layers": list(layers)})
    assert all(stage_memory(moved, s).peak_bytes <= stage_memory(moved, s).capacity_bytes for s in range(4))


# the run's batch (32) under -m slow; 4 by default: 10.5k candidates to enumerate and estimate instead
# of 35k, a quarter of the time (the same pipelines, partitions and layouts: only the micro-batch and
# data-parallel sizes that no longer divide the batch drop out)
@pytest.mark.parametrize("batch", [4, pytest.param(None, marks=pytest.mark.slow)])
def test_hetero_plan_beats_the_even_split(tmp_path, batch):
    """The planner's best emulated plan on the A100 + H100 run is no slower than the run's even split;
    plan.csv carries the partition and best.yaml runs it (with the plan's --set batch). A planner that
    picks the slowest fitting plans fails it at either batch."""
    sets = {} if batch is None else {"training.global_batch_size": batch}
    even = run(load_config(HETERO, {"parallel.pipeline_layers": None, **sets}), trace_ranks="none").summary
    result = plan(HETERO, top=2, workers=2, out=tmp_path / "p", quiet=True,
                  overrides=[f"{key}={value}" for key, value in sets.items()])
    best = result.best
    assert best.emulated.get("status") == "ok"
    assert float(best.emulated["iteration_time_s"]) <= even["iteration_time_s"]
    rows = list(csv.DictReader((tmp_path / "p" / "plan.csv").open()))
    assert any(r["parallel.pipeline_layers"].startswith("[") for r in rows)
    assert any(r["parallel.pipeline_layers"] == "" for r in rows)
    planned = load_config(tmp_path / "p" / "best.yaml")
    assert planned.training.global_batch_size == (batch or 32)
    assert planned.parallel.pipeline_layers == (list(best.knobs["parallel.pipeline_layers"])
                                                if best.knobs["parallel.pipeline_layers"] else None)  # fmt: skip


def test_planned_example_runs_and_beats_the_shipped_split():
    """configs/runs/hetero-uneven-pipeline-planned.yaml: the same model, cluster and batch, faster."""
    planned_config = load_config(ROOT / "configs" / "runs" / "hetero-uneven-pipeline-planned.yaml")
    shipped_config = load_config(HETERO)
    assert planned_config.model == shipped_config.model
    assert planned_config.training.global_batch_size == shipped_config.training.global_batch_size
    planned = run(planned_config, trace_ranks="none").summary["iteration_time_s"]
    shipped = run(shipped_config, trace_ranks="none").summary["iteration_time_s"]
    even = run(load_config(HETERO, {"parallel.pipeline_layers": None}), trace_ranks="none").summary
    assert planned < shipped < even["iteration_time_s"]


def test_plan_searches_context_and_keeps_the_recipe_knobs():
    """Context sizes that split the sequence are candidates; the run's TP overlap (where sequence
    parallel), attention kernel, gradient dtype and hybrid sharding (under ZeRO-3) are kept."""
    base = load_config(RUN_22B.parent / "llama31-70b-cp-64gpu.yaml",
                       {"training.grad_reduce_dtype": "bf16", "training.global_batch_size": 16})  # fmt: skip
    candidates, _, truncated = enumerate_candidates(base, limit=3000)
    assert candidates
    contexts = {c.knobs["parallel.context"] for c in candidates}
    assert {1, 2, 4} <= contexts
    for c in candidates:
        p, t = c.config.parallel, c.config.training
        assert t.attention == "flash" and t.grad_reduce_dtype == "bf16"
        assert p.tp_comm_overlap == (p.sequence_parallel and p.tensor > 1)
        assert p.tensor * p.context * p.pipeline * p.data == 64


def test_plan_searches_expert_parallelism_for_a_moe_model():
    base = load_config(RUN_22B.parent / "mixtral-8x7b-ep8-64gpu.yaml", {"training.global_batch_size": 64})
    candidates, _, _ = enumerate_candidates(base, limit=4000)
    experts = {c.knobs["parallel.expert"] for c in candidates}
    assert {1, 2, 4, 8} <= experts and all(8 % e == 0 for e in experts)
    dense = load_config(RUN_22B)
    assert {c.knobs["parallel.expert"] for c in enumerate_candidates(dense, limit=200)[0]} == {1}
