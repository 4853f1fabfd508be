"""``emulator validate``: predictions next to published measurements, with the error in percent.

    emulator validate               # every case (about 5 minutes: the H100 rows emulate up to 6144 GPUs)
    emulator validate --only 22B    # the cases whose name contains "22B"
    emulator validate --only H100   # the Megatron-LM README's H100 weak scaling (about 4 minutes)

Cases: nccl-tests bus bandwidth, one 22B transformer layer (Korthikanti et al. 2022 Table 4),
model-state memory per GPU under ZeRO stages 0-3 (Rajbhandari et al. 2020, Figure 1), whole
training iterations of the 22B, 175B, 530B and 1T models (Table 5), with full recomputation and
with selective recomputation plus sequence parallelism, and the activation memory the first
pipeline stage holds at its peak in those same runs against Korthikanti's Table 2 (below); and
the 2024-era recipes (:func:`recipe_rows`): the Megatron-LM README's H100 weak-scaling table,
torchtitan's Llama 3.1 8B FSDP2 runs, GPT-NeoX-20B.
Nothing here is tuned per case: every run uses the shipped cluster preset and the same hardware
parameters.

Activation memory. Table 2 gives the bytes one layer keeps per microbatch. Section 4 (pipeline
parallelism) adds that the first pipeline stage holds ``p`` microbatches at its peak, so its L/p
layers hold L layers' worth (fewer when there are fewer microbatches than stages), and that the
interleaved schedule with ``v`` chunks multiplies this by ``1 + (p-1)/(p*v)``; Megatron-LM computes
the same in ``megatron/training/theoretical_memory_usage.py``. With full recomputation the layer
whose backward runs is rebuilt whole, so at that moment one more layer's activations are live
(Table 2's tensor-parallel row). The published side evaluates the reference's formula texts as
written. The emulated side is what the engine tracked: the first rank's peak memory less the model
states (checked against ZeRO above). It also counts the fp32 logits the loss keeps when the first
stage is the last one (the 22B cases), which Table 2 leaves out.
"""

from __future__ import annotations

import ast
import operator

from emulator.backends.inline import run_inline
from emulator.config.loader import CONFIG_ROOT, load_cluster, resolve_reference
from emulator.config.schema import RunConfig
from emulator.config.typed import from_dict
from emulator.engine.result import iteration_times_ns
from emulator.studies.validation_cases import (
    ACTIVATION_CASES,
    ACTIVATION_PER_LAYER,
    KORTHIKANTI,
    LLAMA3,
    LLAMA3_405B,
    LLAMA3_CHUNKS,
    LLAMA3_TOKENS_PER_BATCH,
    MEGATRON_H100,
    MEGATRON_README,
    MEGATRON_SEQ,
    MEGATRON_VOCAB,
    NCCL_BUSBW,
    NEOX,
    NEOX_20B,
    RAJBHANDARI,
    TABLE4_22B_MS,
    TABLE4_NAMES,
    TABLE5,
    TORCHTITAN,
    TORCHTITAN_8B,
    ZERO_FIGURE1,
)
from emulator.workloads.metrics import model_flops_per_iteration
from emulator.workloads.pipeline import microbatches
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


def megatron_h100_config(row) -> RunConfig:
    """A row of the Megatron-LM README's H100 weak-scaling table as a run (validation_cases.py):
    without a pipeline, one micro-batch a replica; with one, micro batch 1 and a layer a chunk."""
    size, layers, hidden, heads, tp, pp, gpus, gbs = row[:8]
    cluster, _ = resolve_reference("cluster", "dgx-h100-ndr", CONFIG_ROOT)
    data = gpus // (tp * pp)
    micro_batch, chunks = (gbs // data, 1) if pp == 1 else (1, layers // pp)
    data = {
        "name": f"megatron-{size}-h100",
        "cluster": dict(cluster, nodes=gpus // 8),
        "model": {"name": f"megatron-{size}", "num_layers": layers, "hidden_size": hidden,
                  "num_attention_heads": heads, "vocab_size": MEGATRON_VOCAB, "position_embedding": "rope",
                  "tie_embeddings": False},
        "parallel": {"tensor": tp, "pipeline": pp, "virtual_stages": chunks, "sequence_parallel": tp > 1,
                     "tp_comm_overlap": tp > 1, "zero_stage": 1},
        "training": {"micro_batch_size": micro_batch, "global_batch_size": gbs, "seq_length": MEGATRON_SEQ,
                     "recompute": "none", "attention": "flash"},
    }  # fmt: skip
    return from_dict(RunConfig, data, "")


def llama3_405b_config(row) -> RunConfig:
    """A row of Llama 3's Table 4 as a run (validation_cases.py LLAMA3_405B)."""
    gpus, tp, cp, pp, dp, seq = row[:6]
    cluster, _ = resolve_reference("cluster", "meta-h100-roce", CONFIG_ROOT)
    model, _ = resolve_reference("model", "llama3-405b", CONFIG_ROOT)
    data = {
        "name": f"llama3-405b-{gpus}gpu-cp{cp}",
        "cluster": dict(cluster, nodes=gpus // 8),
        "model": model,
        "parallel": {"tensor": tp, "context": cp, "context_algo": "all_gather", "pipeline": pp, "data": dp,
                     "virtual_stages": LLAMA3_CHUNKS, "embedding_in_split": True, "loss_in_split": True,
                     "sequence_parallel": True, "tp_comm_overlap": True, "zero_stage": 2},
        "training": {"micro_batch_size": 1, "global_batch_size": LLAMA3_TOKENS_PER_BATCH // seq,
                     "seq_length": seq, "recompute": "none", "attention": "flash"},
    }  # fmt: skip
    return from_dict(RunConfig, data, "")


def torchtitan_config(gpus: int, global_batch: int) -> RunConfig:
    """torchtitan's Llama 3.1 8B FSDP2 run on ``gpus`` 96 GB H100s (validation_cases.py)."""
    cluster, _ = resolve_reference("cluster", "dgx-h100-ndr", CONFIG_ROOT)
    model, _ = resolve_reference("model", "llama3-8b", CONFIG_ROOT)
    data = {
        "name": f"torchtitan-8b-{gpus}gpu",
        "cluster": dict(cluster, nodes=gpus // 8, gpu="h100-sxm-96gb"),
        "model": model,
        "parallel": {"data": gpus, "zero_stage": 3},
        "training": {"micro_batch_size": 2, "global_batch_size": global_batch, "seq_length": 8192,
                     "recompute": "op_selective", "kernels": "eager", "attention": "flash"},
    }  # fmt: skip
    return from_dict(RunConfig, data, "")


def neox_config() -> RunConfig:
    """GPT-NeoX-20B's training run (validation_cases.py): rotary, untied, 2022 kernels (unfused attention)."""
    cluster, _ = resolve_reference("cluster", "dgx-a100-hdr", CONFIG_ROOT)
    data = {
        "name": "gpt-neox-20b",
        "cluster": dict(cluster, nodes=12, gpu="a100-sxm-40gb", nic=dict(cluster["nic"], count=4)),
        "model": {"name": "gpt-neox-20b", "num_layers": 44, "hidden_size": 6144, "num_attention_heads": 64,
                  "ffn_hidden_size": 24576, "vocab_size": 50257, "position_embedding": "rope",
                  "tie_embeddings": False},
        "parallel": {"tensor": 2, "pipeline": 4, "data": 12, "zero_stage": 1},
        "training": {"micro_batch_size": 4, "global_batch_size": 1536, "seq_length": 2048, "recompute": "full",
                     "precision": "fp16"},
    }  # fmt: skip
    return from_dict(RunConfig, data, "")


def model_tflops_per_gpu(config, result, causal: bool = False) -> float:
    """Model TFLOP/s per GPU of a run (workloads/metrics.py's count: Megatron-LM's convention, or
    with ``causal`` the attention's unmasked half only)."""
    flops = model_flops_per_iteration(config, causal)
    return flops / iteration_s(config, result) / config.cluster.world_size / 1e12


def run_case(config):
    return run_inline(config, Topology(config.cluster))


def iteration_s(config, result=None) -> float:
    times = iteration_times_ns(result or run_case(config))
    return sum(times) / len(times) / 1e9


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def formula_value(text: str, **symbols: float) -> float:
    """The value of a published formula text such as ``s*b*h*(10 + 24/t)``: numbers, the given
    symbols, + - * / and brackets; anything else is an error (the texts are data, never code)."""

    def value(node) -> float:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id in symbols:
            return float(symbols[node.id])
        raise ValueError(f"formula {text!r}: cannot evaluate {ast.dump(node)}")

    return value(ast.parse(text, mode="eval").body)


def published_activation_bytes(config, table2_row: str) -> float:
    """Korthikanti et al. 2022: activation bytes on the first pipeline stage at its peak (module
    docstring): Table 2's row per layer, times the layers it holds, plus for full recomputation the
    one layer rebuilt whole."""
    m, p, t = config.model, config.parallel, config.training
    symbols = {"s": t.seq_length, "b": t.micro_batch_size, "h": m.hidden_size, "a": m.num_attention_heads,
               "t": p.tensor}  # fmt: skip
    per_layer = formula_value(ACTIVATION_PER_LAYER[table2_row], **symbols)
    micro = microbatches(config)
    if p.virtual_stages > 1:
        layers_held = m.num_layers * (1 + (p.pipeline - 1) / (p.pipeline * p.virtual_stages))
    else:
        layers_held = m.num_layers * min(1.0, micro / p.pipeline)
    rebuilt = formula_value(ACTIVATION_PER_LAYER["tensor_parallel"], **symbols) if t.recompute == "full" else 0.0
    return per_layer * layers_held + rebuilt


def emulated_activation_bytes(config, result) -> int:
    """The first rank's peak memory in the emulated run, less its model states."""
    from emulator.workloads.memory import static_bytes

    (first,) = [r for r in result.ranks if r.rank == 0]
    return first.peak_memory_bytes - sum(static_bytes(config, 0))


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
    from emulator.studies.collbench import collbench

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
        cases = [("full", False, row[8]), ("selective", True, row[9])]
        if row[0] == "22B":
            cases.append(("selective", False, None))  # no published time: memory only
        for recompute, sp, published_s in cases:
            table2_row, label = ACTIVATION_CASES[(recompute, sp)]
            time_case = f"{row[0]} iteration, {label}" if published_s is not None else None
            memory_case = f"{row[0]} activations, first stage, {label}"
            want_time = time_case is not None and not (only and only not in time_case)
            want_memory = not (only and only not in memory_case)
            if not (want_time or want_memory):
                continue
            config = table5_config(row, recompute, sp)
            result = run_case(config)
            if want_time:
                rows.append(_row(time_case, iteration_s(config, result), published_s, "s", f"{KORTHIKANTI}, Table 5"))
            if want_memory:
                rows.append(_row(memory_case, emulated_activation_bytes(config, result) / 1e9,
                                 published_activation_bytes(config, table2_row) / 1e9, "GB",
                                 f"{KORTHIKANTI}, Table 2 and section 4 (pipeline parallelism)"))  # fmt: skip
    rows += recipe_rows(only)
    return rows


def recipe_rows(only: str | None = None) -> list[dict]:
    """The 2024-era recipes: the Megatron-LM README's H100 weak scaling, Llama 3 405B's Table 4,
    torchtitan's FSDP2 runs, GPT-NeoX-20B. Each row's case names what the source leaves open and the value taken."""
    rows = []
    for row in MEGATRON_H100:
        config = megatron_h100_config(row)
        v, mbs = config.parallel.virtual_stages, config.training.micro_batch_size
        case = f"Megatron {row[0]} H100, TFLOP/s per GPU (assumed: mbs {mbs}, v {v}, no recompute, flash)"
        if only and only not in case:
            continue
        result = run_case(config)
        rows.append(_row(case, model_tflops_per_gpu(config, result), row[8], "TF/s", MEGATRON_README))
    for row in LLAMA3_405B:
        gpus, _, cp, _, _, seq = row[:6]
        case = (f"Llama 3 405B {gpus} GPUs CP {cp} seq {seq // 1024}K, TFLOP/s per GPU "
                f"(assumed: mbs 1, flash, fp32 reduce, causal FLOP count)")  # fmt: skip
        if only and only not in case:
            continue
        config = llama3_405b_config(row)
        predicted = model_tflops_per_gpu(config, run_case(config), causal=True)
        rows.append(_row(case, predicted, row[6], "TF/s", LLAMA3))
    for gpus, global_batch, tokens_per_s, _memory_gib in TORCHTITAN_8B:
        case = (f"torchtitan Llama 3.1 8B FSDP {gpus} GPUs, tokens/s per GPU (assumed: fp32 reduce; "
                f"per-op checkpointing, eager kernels; 500 W cap not modelled)")  # fmt: skip
        if only and only not in case:
            continue
        config = torchtitan_config(gpus, global_batch)
        seconds = iteration_s(config)
        tokens = config.training.global_batch_size * config.training.seq_length
        rows.append(_row(case, tokens / seconds / gpus, tokens_per_s, "tok/s", TORCHTITAN))
    case = "GPT-NeoX-20B step on 96 A100-40GB (assumed: 117 TFLOP/s counts recompute)"
    if not (only and only not in case):
        config = neox_config()
        rows.append(_row(case, iteration_s(config), NEOX_20B["step_s_recompute_counted"], "s", NEOX))
    return rows


def format_report(rows: list[dict]) -> str:
    width = max([52, *(len(r["case"]) for r in rows)])
    lines = [f"{'case':<{width}} {'predicted':>10} {'published':>10} {'unit':>5} {'error':>8}"]
    for r in rows:
        lines.append(
            f"{r['case']:<{width}} {r['predicted']:>10.3f} {r['published']:>10.3f} {r['unit']:>5} "
            f"{r['error_pct']:>+7.1f}%"
        )
    worst = max((abs(r["error_pct"]) for r in rows), default=0.0)
    lines.append(f"{len(rows)} cases, largest error {worst:.1f}%")
    return "\n".join(lines)
