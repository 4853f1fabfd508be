"""``emulator validate``: predictions next to published measurements, with the error in percent.

    emulator validate               # every case (a few minutes: the 1T run emulates 512 GPUs)
    emulator validate --only 22B    # the cases whose name contains "22B"

Cases: nccl-tests bus bandwidth, one 22B transformer layer (Korthikanti et al. 2022 Table 4),
model-state memory per GPU under ZeRO stages 0-3 (Rajbhandari et al. 2020, Figure 1) and whole
training iterations of the 22B, 175B, 530B and 1T models (Table 5), with full recomputation and
with selective recomputation plus sequence parallelism. Nothing here is tuned per case: every
run uses the shipped cluster preset and the same hardware parameters.
"""

from __future__ import annotations

from emulator.backends.inline import run_inline
from emulator.config.loader import CONFIG_ROOT, load_cluster, resolve_reference
from emulator.config.schema import RunConfig
from emulator.config.typed import from_dict
from emulator.summary import iteration_times_ns
from emulator.validation_cases import (
    KORTHIKANTI,
    NCCL_BUSBW,
    RAJBHANDARI,
    TABLE4_22B_MS,
    TABLE4_NAMES,
    TABLE5,
    ZERO_FIGURE1,
)
from netmodel.topology import Topology


def table5_config(row, recompute: str, sequence_parallel: bool) -> RunConfig:
    name, model, tp, pp, gpus, gbs, mbs, chunks = row[:8]
    cluster, _ = resolve_reference("cluster", "dgx-a100-hdr", CONFIG_ROOT)
    cluster = dict(cluster, nodes=gpus // 8)
    model_data, _ = resolve_reference("model", model, CONFIG_ROOT)
    data = {
        "name": f"{name}-{recompute}",
        "cluster": cluster,
        "model": model_data,
        "parallel": {"tensor": tp, "pipeline": pp, "virtual_stages": chunks, "sequence_parallel": sequence_parallel},
        "training": {"micro_batch_size": mbs, "global_batch_size": gbs, "seq_length": 2048, "recompute": recompute},
    }
    return from_dict(RunConfig, data, "")


def iteration_s(config) -> float:
    result = run_inline(config, Topology(config.cluster))
    times = iteration_times_ns(result)
    return sum(times) / len(times) / 1e9


def layer_times_ms(recompute: str, sequence_parallel: bool) -> tuple[float, float]:
    """Forward and backward of one 22B layer on 8 A100s, measured by the engine itself."""
    from emulator.workloads.segments import model_segments
    from emulator.workloads.tensor_parallel import launch_segments

    config = table5_config(TABLE5[0], recompute, sequence_parallel)
    marks: dict[int, tuple[int, int, int]] = {}

    def program(gpu) -> None:
        segs = model_segments(config, gpu.spec)
        group = gpu.new_group(range(8))
        t0 = gpu.synchronize()
        launch_segments(gpu, segs.layer_forward, group)
        t1 = gpu.synchronize()
        launch_segments(gpu, segs.layer_backward, group)
        marks[gpu.rank] = (t0, t1, gpu.synchronize())

    run_inline(config, Topology(config.cluster), program=program, args={})
    t0, t1, t2 = marks[0]
    return (t1 - t0) / 1e6, (t2 - t1) / 1e6


def zero_model_states_gb(zero_stage: int) -> float:
    """Model-state memory per GPU (weights, gradients, optimizer) that the emulator allocates for
    ZeRO Figure 1's case: 64 data-parallel GPUs, 16-bit mixed precision with Adam, per parameter of
    a real model (llama3-8b, whole: tensor and pipeline 1) scaled to the figure's 7.5e9 parameters."""
    from emulator.workloads.memory import params_on_rank, static_bytes

    dp = ZERO_FIGURE1["data_parallel"]
    model, _ = resolve_reference("model", "llama3-8b", CONFIG_ROOT)
    cluster, _ = resolve_reference("cluster", "dgx-a100-hdr", CONFIG_ROOT)
    config = from_dict(RunConfig, {
        "name": f"zero{zero_stage}", "cluster": dict(cluster, nodes=dp // 8), "model": model,
        "parallel": {"data": dp, "zero_stage": zero_stage},
        "training": {"micro_batch_size": 1, "precision": "fp16"},  # ZeRO's accounting: 2-byte gradients
    }, "")  # fmt: skip
    per_parameter = sum(static_bytes(config, 0)) / params_on_rank(config, 0)
    return per_parameter * ZERO_FIGURE1["parameters"] / 1e9


def _row(case: str, predicted: float, published: float, unit: str, source: str) -> dict:
    return {
        "case": case,
        "predicted": predicted,
        "published": published,
        "unit": unit,
        "error_pct": 100 * (predicted - published) / published,
        "source": source,
    }


def run_validation(only: str | None = None) -> list[dict]:
    from emulator.collbench import collbench

    rows = []
    for name, preset, gpus, busbw, source in NCCL_BUSBW:
        case = f"nccl all_reduce busbw, {name}"
        if only and only not in case:
            continue
        cluster = load_cluster(preset, [f"nodes={max(1, gpus // 8)}"])
        (row,) = collbench(cluster, "all_reduce", gpus, None, [1 << 30])
        rows.append(_row(case, row["busbw_GBps"], busbw, "GB/s", source))
    for key, (fwd, bwd) in TABLE4_22B_MS.items():
        case = f"22B layer, {TABLE4_NAMES[key]}"
        if only and only not in case:
            continue
        p_fwd, p_bwd = layer_times_ms(*key)
        rows.append(_row(f"{case}, forward", p_fwd, fwd, "ms", f"{KORTHIKANTI}, Table 4"))
        rows.append(_row(f"{case}, backward", p_bwd, bwd, "ms", f"{KORTHIKANTI}, Table 4"))
    for stage, published in ZERO_FIGURE1["gb_by_stage"].items():
        case = f"ZeRO-{stage} model states per GPU, 7.5B on 64 GPUs"
        if only and only not in case:
            continue
        rows.append(_row(case, zero_model_states_gb(stage), published, "GB", f"{RAJBHANDARI}, Figure 1"))
    for row in TABLE5:
        for recompute, sp, published, label in (("full", False, row[8], "full recompute"),
                                                ("selective", True, row[9], "selective + SP")):  # fmt: skip
            case = f"{row[0]} iteration, {label}"
            if only and only not in case:
                continue
            rows.append(_row(case, iteration_s(table5_config(row, recompute, sp)), published, "s",
                             f"{KORTHIKANTI}, Table 5"))  # fmt: skip
    return rows


def format_report(rows: list[dict]) -> str:
    lines = [f"{'case':<52} {'predicted':>10} {'published':>10} {'unit':>5} {'error':>8}"]
    for r in rows:
        lines.append(
            f"{r['case']:<52} {r['predicted']:>10.3f} {r['published']:>10.3f} {r['unit']:>5} {r['error_pct']:>+7.1f}%"
        )
    worst = max((abs(r["error_pct"]) for r in rows), default=0.0)
    lines.append(f"{len(rows)} cases, largest error {worst:.1f}%")
    return "\n".join(lines)
