"""``emulator plan RUN.yaml``: search the parallelisations of a run, emulate the most promising.

    emulator plan configs/runs/megatron-22b-8gpu.yaml --top 3 --out runs/plan-22b

From the run file's model, cluster and training batch (global batch, sequence length, precision),
:func:`enumerate_candidates` lists every valid combination of tensor parallelism (inside a node,
dividing the heads), context parallelism (:data:`CONTEXT_SIZES`, dividing the sequence), expert
parallelism for a MoE model (:data:`EXPERT_SIZES`, dividing the experts), pipeline
stages (dividing the layers evenly), data parallelism (the rest of the world), virtual stages
(interleaved 1F1B), micro-batch size, sequence parallelism, recomputation, ZeRO stage and schedule
- at most :data:`MAX_CANDIDATES`; the run's other knobs (TP overlap, gradient dtype, attention
kernel, hybrid sharding under ZeRO-3) are kept. Each gets the memory model of the emulation
(emulator/workloads/memory.py, against every stage's GPU capacity) and the closed-form estimate
of emulator/studies/estimate.py; the ``--top`` fastest that fit are emulated side by side with
the sweep machinery (emulator/studies/sweep.py). ``DIR/plan.csv`` has one row per candidate,
``DIR/emulated/`` the sweep of the emulated ones, ``DIR/best.yaml`` the run file of the best plan
(the best emulated one; the best estimated one when none was emulated), ready for ``emulator run``.

Heterogeneous clusters (node groups of different GPU types, configs/clusters/hetero-a100-h100.yaml):
pipeline stages take the node groups in order (Megatron order, pipeline outermost: stage ``s`` is
the ``s``-th block of ``world / pipeline`` ranks), so a stage's GPU type follows from the split.
Where the stages' layers take different times, the planner also enumerates uneven partitions
(``parallel.pipeline_layers``, :func:`uneven_partitions`), giving each stage layers in proportion
to its speed as HETHUB does (Xu et al. 2024, arXiv:2405.16256: layers split over heterogeneous
stages by their computing power and memory): the per-layer time of each stage's GPU type comes
from the estimate, and each partition is moved layer by layer off stages that would not fit in
memory. Pipeline sizes that do not divide the layers are then searched too. A base run's own
``pipeline_layers`` is not kept: the planner chooses them.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from emulator.errors import ConfigError
from emulator.studies.estimate import Estimate, Estimator
from emulator.studies.sweep import number  # the sweep's reading of a CSV figure (None when absent)

MAX_CANDIDATES = 100_000  # the enumeration stops here (and says so)
MICRO_BATCH_SIZES = (1, 2, 4, 8, 16)  # beyond 16 the activations of large models do not fit anyway
MAX_VIRTUAL_STAGES = 8
# context-parallel sizes searched: Llama 3 405B's 131k-token row uses 16, the 8K recipes 1 or 2
CONTEXT_SIZES = (1, 2, 4, 8, 16)
# expert-parallel sizes searched for a MoE model (those dividing its experts): Mixtral runs 8,
# DeepSeek-V3 64
EXPERT_SIZES = (1, 2, 4, 8, 16, 32, 64)
# wall seconds the emulations of one plan may take (batches stop starting past it): large runs take
# minutes per emulation (1024 GPUs: ~8 min here), and a plan is meant to answer within ~15 minutes
DEFAULT_MAX_WALL_S = 600.0
# the knobs of a candidate, as ``--set`` key paths, in plan.csv's column order
KNOBS = ("parallel.tensor", "parallel.context", "parallel.expert", "parallel.pipeline", "parallel.data",
         "parallel.virtual_stages",
         "parallel.pipeline_layers", "parallel.schedule", "parallel.sequence_parallel", "parallel.zero_stage",
         "training.micro_batch_size", "training.recompute")  # fmt: skip
SHORT = {"parallel.tensor": "tp", "parallel.context": "cp", "parallel.expert": "ep", "parallel.pipeline": "pp",
         "parallel.data": "dp",
         "parallel.virtual_stages": "v",
         "parallel.pipeline_layers": "layers",
         "parallel.schedule": "schedule", "parallel.sequence_parallel": "sp", "parallel.zero_stage": "zero",
         "training.micro_batch_size": "mbs", "training.recompute": "recompute"}  # fmt: skip


@dataclass
class Candidate:
    """One parallelisation: its knobs (``--set`` key paths), resolved config and estimate."""

    knobs: dict[str, Any]  # parallel.pipeline_layers: None (even) or a tuple of layers per stage
    config: Any
    estimate: Estimate | None = None
    rank: int | None = None  # position among the fitting candidates, by estimated time (1 = fastest)
    emulated: dict = field(default_factory=dict)  # the sweep's row, when emulated

    def overrides(self) -> dict[str, Any]:
        """The knobs as sweep overrides (an even candidate drops the base run's uneven partition)."""
        points = dict(self.knobs)
        layers = points["parallel.pipeline_layers"]
        points["parallel.pipeline_layers"] = list(layers) if layers is not None else None
        return points


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def proportional_layers(total: int, layer_ns: list[int]) -> list[int]:
    """``total`` layers over stages in proportion to their speed (1 / ``layer_ns``), at least one
    each, rounded by largest remainder so that they sum to ``total``."""
    speeds = [1 / t for t in layer_ns]
    shares = [total * v / sum(speeds) for v in speeds]
    layers = [max(1, int(x)) for x in shares]
    by_remainder = sorted(range(len(shares)), key=lambda s: layers[s] - shares[s])
    i = 0
    while sum(layers) != total:
        s = by_remainder[i % len(layers)]
        if sum(layers) < total:
            layers[s] += 1
        elif layers[s] > 1:
            layers[s] -= 1
        i += 1
    return layers


def balanced_layers(total: int, layer_ns: list[int], extra_ns: list[int]) -> list[int]:
    """The partition of ``total`` layers that minimises the slowest stage, ``layers * layer_ns +
    extra_ns`` (the embedding and the logits on the end stages): one layer at a time to the stage
    that ends up fastest with it (greedy, optimal for costs that grow linearly)."""
    layers = [1] * len(layer_ns)
    for _ in range(total - len(layer_ns)):
        s = min(range(len(layers)), key=lambda s: ((layers[s] + 1) * layer_ns[s] + extra_ns[s], s))
        layers[s] += 1
    return layers


def uneven_partitions(total: int, passes: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """The partitions of ``total`` layers worth estimating for stages of ``passes`` (per stage: one
    layer's and the end layers' time, :meth:`Estimator.stage_pass_ns`): in proportion to speed,
    balanced with the end layers, and the balanced one with one layer moved off its slowest stage
    to each other stage (the pipeline's fill and drain and the data-parallel tail are not in the
    balance, the estimate sorts them out)."""
    layer_ns = [t for t, _ in passes]
    extra_ns = [e for _, e in passes]
    balanced = balanced_layers(total, layer_ns, extra_ns)
    found = [tuple(proportional_layers(total, layer_ns)), tuple(balanced)]
    slowest = max(range(len(balanced)), key=lambda s: balanced[s] * layer_ns[s] + extra_ns[s])
    for s in range(len(balanced)):
        if s != slowest and balanced[slowest] > 1:
            moved = list(balanced)
            moved[slowest] -= 1
            moved[s] += 1
            found.append(tuple(moved))
    return list(dict.fromkeys(found))


def fit_in_memory(config, layers: tuple[int, ...]) -> tuple[int, ...]:
    """``layers`` with layers moved, one at a time, from the stage furthest over its GPU's memory to
    the one with the most room, until every stage fits (or no move helps: returned as it is, the
    estimate then marks it as not fitting)."""
    from emulator.workloads.memory import stage_memory

    config = dataclasses.replace(config, parallel=dataclasses.replace(config.parallel))
    layers = list(layers)
    for _ in range(sum(layers)):
        config.parallel.pipeline_layers = layers
        use = [m.peak_bytes / m.capacity_bytes if m.capacity_bytes else float("inf")
               for m in (stage_memory(config, s) for s in range(len(layers)))]  # fmt: skip
        over, room = max(range(len(use)), key=use.__getitem__), min(range(len(use)), key=use.__getitem__)
        if use[over] <= 1 or layers[over] <= 1 or over == room:
            break
        layers[over] -= 1
        layers[room] += 1
    return tuple(layers)


def is_heterogeneous(cluster) -> bool:
    """Node groups of more than one GPU type or scale-up: stages may differ in speed."""
    return len({(g.gpu, g.scale_up.bandwidth_GBps, g.scale_up.efficiency) for g in cluster.groups()}) > 1


def enumerate_candidates(base, limit: int = MAX_CANDIDATES, estimator=None) -> tuple[list[Candidate], int, bool]:
    """(valid candidates, combinations tried, whether ``limit`` cut the enumeration short).

    ``base``: the run's validated RunConfig (with a model). Every candidate is validated as
    ``emulator run`` would (the RunConfig rules and the layer shape's divisibility rules); the
    combinations that fail are counted, not kept. On a heterogeneous cluster, uneven partitions
    (:func:`uneven_partitions`) join the even ones, timed by ``estimator`` (an
    :class:`~emulator.studies.estimate.Estimator` of the cluster; built when not given).
    """
    from emulator.config.schema import ParallelConfig, RunConfig
    from emulator.workloads.data_parallel import zero_stages
    from emulator.workloads.layer_costs import RECOMPUTE_MODES
    from emulator.workloads.schedules import schedule_names
    from emulator.workloads.segments import layer_shape
    from emulator.workloads.tensor_parallel import sequence_parallel_options

    if base.model is None:
        raise ConfigError("plan: the run file needs a 'model' (the planner searches the built-in training workload)")
    m, t, cluster = base.model, base.training, base.cluster
    world = cluster.world_size
    hetero = is_heterogeneous(cluster)
    if hetero and estimator is None:
        from netmodel.topology import Topology

        estimator = Estimator(Topology(cluster))
    gpus_per_node = min(g.gpus_per_node for g in cluster.groups())
    tensors = [d for d in _divisors(gpus_per_node) if m.num_attention_heads % d == 0 and world % d == 0]
    # uneven partitions let any pipeline size up to the layers in, on a heterogeneous cluster
    pipelines = [d for d in _divisors(world) if (m.num_layers % d == 0 or hetero) and d <= m.num_layers]
    candidates: list[Candidate] = []
    tried = 0
    shard_group = base.parallel.zero_shard_group  # hybrid sharding kept where a candidate runs ZeRO-3
    for tp, cp, pp in itertools.product(tensors, CONTEXT_SIZES, pipelines):
        if world % (tp * cp * pp) or t.seq_length % (2 * cp):
            continue
        dp = world // (tp * cp * pp)
        expert_sizes = [e for e in EXPERT_SIZES if m.experts and m.experts % e == 0 and (tp * cp * dp) % (e * tp) == 0]
        chunks = [v for v in _divisors(m.num_layers) if v <= MAX_VIRTUAL_STAGES and (v == 1 or pp > 1)
                  and (m.num_layers % (pp * v) == 0 or (hetero and m.num_layers // v >= pp))]  # fmt: skip
        for v, mbs in itertools.product(chunks, MICRO_BATCH_SIZES):
            if t.global_batch_size % (mbs * dp):
                continue
            # each technique's own axis: the schedules a layout can run, sequence parallelism where
            # there is a tensor group, the ZeRO stages where there is a data-parallel one
            for schedule, sp, recompute, zero, ep in itertools.product(
                schedule_names(pp, v), sequence_parallel_options(tp), RECOMPUTE_MODES, zero_stages(dp),
                expert_sizes or [1],
            ):
                if tried >= limit:
                    return candidates, tried, True
                tried += 1  # the combination (its first partition)
                per_stage = m.num_layers // v
                # even when the layers divide; a near-even placeholder to validate the rest otherwise
                even = m.num_layers % (pp * v) == 0
                placeholder = None if even else proportional_layers(per_stage, [1] * pp)
                parallel = dataclasses.replace(base.parallel, tensor=tp, context=cp, expert=ep, expert_tensor=None,
                                               pipeline=pp, data=dp,
                                               virtual_stages=v, tp_comm_overlap=base.parallel.tp_comm_overlap and sp,
                                               schedule=schedule, sequence_parallel=sp, zero_stage=zero,
                                               pipeline_layers=placeholder,
                                               zero_shard_group=shard_group if zero == 3 else None)  # fmt: skip
                training = dataclasses.replace(t, micro_batch_size=mbs, recompute=recompute)
                config = dataclasses.replace(base, parallel=parallel, training=training)
                try:
                    ParallelConfig.validate(parallel, "parallel")
                    RunConfig.validate(config, "")
                    layer_shape(config)  # divisibility of heads, KV groups, FFN and sequence by tp
                except ConfigError:
                    continue
                partitions: list[tuple[int, ...] | None] = [None] if even else []
                if hetero and pp > 1:
                    passes = estimator.stage_pass_ns(config)
                    if len({layer_ns for layer_ns, _ in passes}) > 1:  # stages of different speeds
                        moved = (fit_in_memory(config, p) for p in uneven_partitions(per_stage, passes))
                        partitions += [p for p in dict.fromkeys(moved) if len(set(p)) > 1 or not even]
                for i, layers in enumerate(partitions):
                    if i:  # each further partition is a combination of its own
                        if tried >= limit:
                            return candidates, tried, True
                        tried += 1
                    chosen = dataclasses.replace(
                        config, parallel=dataclasses.replace(parallel, pipeline_layers=list(layers) if layers else None)
                    )
                    values = (tp, cp, ep, pp, dp, v, layers, schedule, sp, zero, mbs, recompute)
                    candidates.append(Candidate(dict(zip(KNOBS, values, strict=True)), chosen))
    return candidates, tried, False


def rank_candidates(candidates: list[Candidate], topo, estimator: Estimator | None = None) -> list[Candidate]:
    """Estimate every candidate; the fitting ones fastest first (``rank`` set), then the rest."""
    estimator = estimator or Estimator(topo)
    for c in candidates:
        c.estimate = estimator.estimate(c.config)
    fitting = sorted((c for c in candidates if c.estimate.fits), key=lambda c: c.estimate.iteration_time_s)
    for i, c in enumerate(fitting):
        c.rank = i + 1
    rest = sorted((c for c in candidates if not c.estimate.fits), key=lambda c: c.estimate.peak_memory_bytes)
    return fitting + rest


def estimate_error(candidate: Candidate) -> float | None:
    """(estimated - emulated) / emulated iteration time; None unless emulated successfully."""
    emulated = number(candidate.emulated.get("iteration_time_s"))
    if candidate.estimate is None or emulated is None or emulated <= 0:
        return None
    return (candidate.estimate.iteration_time_s - emulated) / emulated


CSV_COLUMNS = ("rank", *KNOBS, "fits", "est_iteration_time_s", "est_peak_memory_bytes", "est_mfu", "est_compute_s",
               "est_bubble_s", "est_exposed_comm_s", "emulated_status", "emulated_reason", "emulated_iteration_time_s",
               "emulated_mfu", "emulated_peak_memory_bytes", "estimate_error")  # fmt: skip


def write_plan_csv(path: Path, candidates: list[Candidate]) -> None:
    """One row per candidate: knobs, estimate, and the emulated figures where emulated."""
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS)
        writer.writeheader()
        for c in candidates:
            e = c.estimate
            error = estimate_error(c)
            writer.writerow({
                "rank": c.rank if c.rank is not None else "", **c.knobs,
                "parallel.pipeline_layers": _layers(c.knobs["parallel.pipeline_layers"], ""), "fits": e.fits,
                "est_iteration_time_s": f"{e.iteration_time_s:.6g}", "est_peak_memory_bytes": e.peak_memory_bytes,
                "est_mfu": f"{e.mfu:.4g}", "est_compute_s": f"{e.compute_s:.6g}", "est_bubble_s": f"{e.bubble_s:.6g}",
                "est_exposed_comm_s": f"{e.exposed_comm_s:.6g}",
                "emulated_status": c.emulated.get("status", ""), "emulated_reason": c.emulated.get("reason", ""),
                "emulated_iteration_time_s": c.emulated.get("iteration_time_s", ""),
                "emulated_mfu": c.emulated.get("mfu", ""),
                "emulated_peak_memory_bytes": c.emulated.get("peak_memory_bytes", ""),
                "estimate_error": f"{error:.4f}" if error is not None else "",
            })  # fmt: skip


def write_best_yaml(path: Path, config) -> None:
    """The resolved config of the best plan (name kept) as a run file."""
    import yaml

    from emulator.config.typed import to_dict

    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))


@dataclass
class PlanResult:
    out: Path
    candidates: list[Candidate]  # fitting ones by estimated time, then the others
    tried: int  # combinations enumerated (valid or not)
    truncated: bool  # the enumeration stopped at MAX_CANDIDATES
    estimate_ms_per_candidate: float
    best: Candidate | None

    @property
    def fitting(self) -> list[Candidate]:
        return [c for c in self.candidates if c.rank is not None]

    @property
    def emulated(self) -> list[Candidate]:
        return [c for c in self.candidates if c.emulated]


def plan(run_file: str | Path, top: int = 5, out: str | Path | None = None, workers: int | None = None,
         backend: str = "inline", address: str | None = None, quiet: bool = False,
         overrides: list[str] | None = None, limit: int = MAX_CANDIDATES,
         max_wall_s: float | None = DEFAULT_MAX_WALL_S) -> PlanResult:  # fmt: skip
    """Enumerate, estimate, emulate the ``top`` fastest fitting candidates; write plan.csv and best.yaml.

    The candidates are emulated in the estimate's order, ``workers`` at a time; no new batch starts
    when the batches so far, at their mean wall time, say it would end past ``max_wall_s`` (None:
    no limit). The first batch always runs: a plan emulates at least one candidate when ``top`` > 0.

    Raises ConfigError for a run without a model, a negative ``top`` or nothing that fits.
    """
    from emulator.config.loader import load_config
    from emulator.studies.sweep import make_sweep, run_sweep
    from netmodel.topology import Topology

    if top < 0:
        raise ConfigError(f"--top must be >= 0, got {top}")
    base = load_config(run_file, overrides)
    out_dir = Path(out) if out is not None else Path("runs") / f"plan-{base.name}"
    out_dir.mkdir(parents=True, exist_ok=True)
    topo = Topology(base.cluster)
    estimator = Estimator(topo)
    candidates, tried, truncated = enumerate_candidates(base, limit, estimator)
    start = time.perf_counter()
    candidates = rank_candidates(candidates, topo, estimator)
    ms_each = (time.perf_counter() - start) * 1e3 / max(1, len(candidates))
    fitting = [c for c in candidates if c.rank is not None]
    if not fitting:
        write_plan_csv(out_dir / "plan.csv", candidates)
        raise ConfigError(f"plan: none of the {len(candidates)} valid parallelisations of {run_file} fits in memory "
                          f"(see {out_dir / 'plan.csv'})")  # fmt: skip
    chosen = fitting[:top]
    best = fitting[0]
    if chosen:
        # the base file's own overrides (--set) must reach the sweep too: sweep points start from the
        # file, so they carry them along with the knobs
        base_overrides = dict(_pairs(overrides))
        points = [{**base_overrides, **c.overrides()} for c in chosen]
        batch = max(1, workers or os.cpu_count() or 1)
        started, done, rows = time.perf_counter(), 0, []
        while done < len(points):
            elapsed = time.perf_counter() - started
            if done and max_wall_s is not None and elapsed + elapsed / (done // batch) > max_wall_s:
                break  # the next batch would end past the budget
            done = min(len(points), done + batch)
            # the sweep of the points so far: those of earlier batches are in sweep.csv, skipped by hash
            sweep = make_sweep(run_file, points[:done], name=f"plan-{base.name}")
            _, rows = run_sweep(sweep, out=out_dir / "emulated", workers=workers, backend=backend, address=address,
                                quiet=quiet, force=False)  # fmt: skip
        if done < len(points):
            print(f"plan: emulated {done} of the top {len(points)}: another batch would end past --max-wall-s "
                  f"{max_wall_s:g} s", file=sys.stderr, flush=True)  # fmt: skip
        chosen = chosen[:done]
        by_point = {int(r["point"]): r for r in rows}
        for point, c in zip(sweep.points, chosen, strict=True):
            c.emulated = dict(by_point.get(point.index, {}))
            if point.config is not None:
                c.config = point.config  # the config the sweep resolved from the file
        ok = [c for c in chosen if c.emulated.get("status") == "ok" and number(c.emulated.get("iteration_time_s"))]
        if ok:
            best = min(ok, key=lambda c: number(c.emulated["iteration_time_s"]))
    write_plan_csv(out_dir / "plan.csv", candidates)
    write_best_yaml(out_dir / "best.yaml", best.config)
    return PlanResult(out_dir, candidates, tried, truncated, ms_each, best)


def _pairs(overrides: list[str] | None) -> list[tuple[str, Any]]:
    from emulator.config.loader import parse_override

    return [(".".join(keys), value) for keys, value in (parse_override(o) for o in overrides or [])]


def format_plan(result: PlanResult, rows: int = 10) -> str:
    """The table: rank, knobs, estimated and emulated iteration time, MFU, peak memory; then the
    estimate's error over the emulated candidates and what the search considered."""
    shown = result.emulated or result.fitting[:rows]
    header = ["rank", *(SHORT[k] for k in KNOBS), "est s", "emulated s", "error", "MFU", "peak GiB", "status"]
    lines = [header]
    for c in shown:
        emulated = number(c.emulated.get("iteration_time_s"))
        error = estimate_error(c)
        mfu = number(c.emulated.get("mfu"))
        peak = number(c.emulated.get("peak_memory_bytes"))
        lines.append([
            str(c.rank), *(_value(c.knobs[k]) for k in KNOBS),
            f"{c.estimate.iteration_time_s:.4f}", f"{emulated:.4f}" if emulated is not None else "-",
            f"{error:+.1%}" if error is not None else "-",
            f"{mfu if mfu is not None else c.estimate.mfu:.3f}",
            f"{(peak if peak is not None else c.estimate.peak_memory_bytes) / 2**30:.2f}",
            c.emulated.get("status", "estimated") if c.emulated else "estimated",
        ])  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)) for line in lines]
    errors = [abs(e) for e in (estimate_error(c) for c in result.emulated) if e is not None]
    fitting = len(result.fitting)
    text.append(f"{result.tried} combinations tried, {len(result.candidates)} valid, {fitting} fit in memory"
                + (f" (enumeration stopped at {MAX_CANDIDATES})" if result.truncated else "")
                + f"; estimate {result.estimate_ms_per_candidate:.2f} ms per candidate")  # fmt: skip
    if errors:
        text.append(f"estimate vs emulation over {len(errors)} emulated: mean |error| {sum(errors) / len(errors):.1%}, "
                    f"max {max(errors):.1%}")  # fmt: skip
    best = result.best
    if best is not None:
        how = "emulated" if best.emulated.get("status") == "ok" else "estimated"
        knobs = " ".join(f"{k}={_value(best.knobs[k])}" for k in KNOBS)
        text.append(f"best ({how}): {knobs} -> {result.out / 'best.yaml'}")
    return "\n".join(text)


def _value(value: Any) -> str:
    if isinstance(value, tuple):
        return "/".join(map(str, value))
    if value is None:  # only pipeline_layers is ever None: an even partition
        return "even"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _layers(layers: tuple[int, ...] | None, even: str) -> str:
    """A partition as plan.csv writes it: the YAML list ``--set parallel.pipeline_layers=`` takes."""
    return f"[{', '.join(map(str, layers))}]" if layers is not None else even


def add_plan_parser(sub) -> argparse.ArgumentParser:
    """The ``plan`` subcommand on an ``add_subparsers()`` object."""
    p = sub.add_parser("plan", help="search the parallelisations of a run: estimate all, emulate the best")
    p.add_argument("run_file", help="run file (YAML) with a model, cluster and training batch")
    p.add_argument("--top", type=int, default=5, help="emulate the K fastest estimated candidates (default 5; 0: none)")
    p.add_argument("--max-wall-s", type=float, default=DEFAULT_MAX_WALL_S, metavar="SECONDS",
                   help="start no batch of emulations that would end past this (default 600; the first always runs)")
    p.add_argument("--out", type=Path, help="plan directory (default runs/plan-<name>)")
    p.add_argument("--workers", type=int, help="emulations run at once on this machine (default: the cores)")
    p.add_argument("--backend", default="inline", help="inline (local worker processes, default) or ray")
    p.add_argument("--address", help="Ray cluster address: auto or HOST:PORT (default: start a local Ray)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a value of the run file before planning (repeatable)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="print only the final table")
    return p


def cmd_plan(args) -> int:
    """Run ``emulator plan`` from parsed arguments; prints the table. ConfigError for user errors."""
    result = plan(args.run_file, top=args.top, out=args.out, workers=args.workers, backend=args.backend,
                  address=args.address, quiet=args.quiet, overrides=args.overrides,
                  max_wall_s=args.max_wall_s)  # fmt: skip
    print(format_plan(result))
    print(f"{len(result.candidates)} candidates -> {result.out / 'plan.csv'}", file=sys.stderr, flush=True)
    return 0
