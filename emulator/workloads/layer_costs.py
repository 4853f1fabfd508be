"""FLOPs and bytes of the operations of one transformer layer, per tensor-parallel rank.

    python -c "from emulator.workloads.layer_costs import *; \
[print(o) for o in forward_ops(LayerShape(6144, 64, 2048, 4, tensor_parallel=8))]"

Megatron-LM style (Narayanan et al. 2021; Korthikanti et al. 2022): attention heads and the MLP
hidden dimension are split over ``t`` ranks; without sequence parallelism each rank runs the
layernorms, dropouts and residual adds on the whole ``b*s*h`` activation, with it on ``b*s/t``
tokens. The op lists mark where the tensor-parallel collectives occur (``kind == 'comm'``).

Counting conventions (why the numbers are what they are):

- A GEMM of ``[m, k] x [k, n]`` costs ``2*m*n*k`` FLOPs and moves ``(m*k + k*n + m*n)`` elements
  (each operand read once, the output written once: what a tiled kernel does at best). Backward
  has two GEMMs per forward GEMM (input gradient "dgrad", weight gradient "wgrad").
- ``Op.flops`` counts tensor-core GEMM FLOPs only, so summing it gives the hardware FLOPs of the
  Korthikanti/Narayanan formulas; elementwise FLOPs are negligible and left out.
- Memory-bound ops count the reads and writes of the activations they touch, with the kernels
  Megatron-LM used in 2022: Apex fused layernorm (forward reads x, writes y; backward is two
  kernels reading dy and x twice and writing dx), fused scale-mask-softmax, unfused attention
  dropout (which also writes a 1-byte mask), fused bias-dropout-add and fused bias-GeLU. Biases,
  layernorm weights and statistics are too small to count.
- Comm ops carry the nccl-tests buffer size ``size_bytes``: the whole buffer for all_reduce, the
  total (gathered) size for all_gather and reduce_scatter. Their duration is the network's job.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from emulator.errors import ConfigError
from emulator.workloads import experts as ex
from emulator.workloads import tensor_parallel as tp
from emulator.workloads.context_parallel import kv_gather_bytes
from emulator.workloads.eager_kernels import (
    eager_qk_backward,
    eager_qk_forward,
    eager_rmsnorm_backward,
    eager_rmsnorm_forward,
)
from emulator.workloads.layer_shape import LayerShape, Op
from emulator.workloads.layer_shape import mem_op as _mem
from emulator.workloads.layer_shape import qkvo_elements as _qkvo_elements
from emulator.workloads.tensor_parallel import is_overlapped

RECOMPUTE_MODES = ("none", "selective", "full")  # the modes the planner searches
# torchtitan's per-op selective activation checkpointing (op_selective_saved_bytes): a mode of its own,
# for eager PyTorch recipes; not searched by the planner
OP_SELECTIVE = "op_selective"
ALL_RECOMPUTE_MODES = (*RECOMPUTE_MODES, OP_SELECTIVE)
MASK_BYTES = 1  # torch dropout keeps a bool (1 byte) mask per element


def _mask(shape: LayerShape) -> int:
    """Bytes per element of a dropout mask: none without dropout (the add and residual remain)."""
    return MASK_BYTES if shape.dropout else 0


def _gemm(name: str, m: int, n: int, k: int, e: int, batch: int = 1, kind: str = "matmul") -> Op:
    return Op(name, kind, flops=2.0 * batch * m * n * k, bytes_moved=float(batch * (m * k + k * n + m * n) * e))


def _comm(name: str, collective: str, size_bytes: int, group: str = "tp", overlap: bool = False) -> Op:
    return Op(name, "comm", collective=collective, size_bytes=int(size_bytes), group=group, overlap=overlap)


def _dims(shape: LayerShape) -> tuple[int, int, int, int, int, int]:
    """(tokens b*s/c, tokens per rank for replicated ops, h, f per rank, attention elements per rank, e).

    With context parallelism a rank holds ``s/c`` tokens and its queries meet the keys of the whole
    sequence: ``b * a/t * (s/c) * s`` attention scores."""
    b, s, h, t = shape.micro_batch_size, shape.seq_length, shape.hidden_size, shape.tensor_parallel
    c = shape.context_parallel
    n = b * s // c
    n_rep = n // t if shape.sequence_parallel else n
    n_att = b * (shape.num_attention_heads // t) * (s // c) * s
    return n, n_rep, h, shape.ffn_hidden_size // t, n_att, shape.bytes_per_element


def _tp_comm(shape: LayerShape, name: str, sp_collective: str) -> list[Op]:
    """The collective at a TP boundary (tensor_parallel.boundary_collective); none when t == 1."""
    found = tp.boundary_collective(shape, sp_collective)
    return [_comm(name, *found)] if found is not None else []


# FlashAttention-2's backward runs five GEMMs of the forward's size (the scores recomputed, then dV,
# dP, dQ, dK) against the forward's two (Dao 2023, section 3.1.2): 2.5 times the forward's FLOPs.
FLASH_BACKWARD_FLOP_RATIO = 2.5
# the causal mask: a fused kernel skips the blocks above the diagonal, half of the square
CAUSAL_FRACTION = 0.5


def _attention_flops(shape: LayerShape) -> float:
    """The two attention GEMMs (scores and context) on one rank: ``2 * 2 * b * a/t * (s/c) * s * d``."""
    _, _, _, _, n_att, _ = _dims(shape)
    return 4.0 * n_att * shape.head_dim


def _cp_exchange(shape: LayerShape, forward: bool) -> list[Op]:
    """Context parallelism's K/V collectives before the attention (context_parallel.py): an
    all-gather of K/V (and in backward the reduce-scatter of their gradients), overlapped with the
    attention kernel for the ring, waited for at once for ``all_gather``."""
    size = kv_gather_bytes(shape)
    if not size:
        return []
    ring = shape.context_algo == "ring"
    ops = [_comm("attention.cp_kv.all_gather" + ("" if forward else ".backward"), "all_gather", size, "cp", ring)]
    if not forward:
        ops.append(_comm("attention.cp_dkv.reduce_scatter", "reduce_scatter", size, "cp", ring))
    return ops


def _core_attention_forward(shape: LayerShape, prefix: str = "") -> list[Op]:
    """Scores, softmax, dropout, context: the part selective recomputation reruns."""
    n, _, h, _, n_att, e = _dims(shape)
    if shape.flash_attention:
        q, kv = _qkvo_elements(shape)
        # one fused kernel: reads Q, K, V, writes O and the fp32 row statistics (logsumexp)
        flops = CAUSAL_FRACTION * _attention_flops(shape)
        moved = e * (2 * q + 2 * kv) + 4 * n
        return [Op(f"{prefix}attention.flash", "attention", flops=flops, bytes_moved=float(moved))]
    s, d = shape.seq_length, shape.head_dim
    sq = s // shape.context_parallel
    batch = shape.micro_batch_size * shape.num_attention_heads // shape.tensor_parallel
    return [
        _gemm(f"{prefix}attention.scores", sq, s, d, e, batch, kind="attention"),
        _mem(f"{prefix}attention.softmax", 2 * e * n_att),
        *([_mem(f"{prefix}attention.dropout", (2 * e + MASK_BYTES) * n_att)] if shape.dropout else []),
        _gemm(f"{prefix}attention.context", sq, d, s, e, batch, kind="attention"),
        # [b*np, s, d] -> [s, b, h/t] permute + contiguous copy before the output projection.
        _mem(f"{prefix}attention.context_permute", 2 * e * n * h // shape.tensor_parallel),
    ]


def forward_ops(shape: LayerShape) -> list[Op]:
    """The forward pass of one layer on one TP rank, in execution order."""
    n, n_rep, h, f, _, e = _dims(shape)
    t = shape.tensor_parallel
    ops = _norm_forward(shape, "ln1", n_rep)
    ops += _tp_comm(shape, "ln1.all_gather", "all_gather") if shape.sequence_parallel else []
    ops.append(_gemm("qkv", n, shape.qkv_width, h, e))
    ops += eager_qk_forward(shape) if shape.eager_kernels else []
    ops += _cp_exchange(shape, forward=True)
    ops += _core_attention_forward(shape)
    ops.append(_gemm("attention.out_proj", n, h, h // t, e))
    ops += _tp_comm(shape, "attention.out_proj.tp_reduce", "reduce_scatter")
    ops += _residual_forward(shape, "attention", n_rep)
    ops += _norm_forward(shape, "ln2", n_rep)
    if shape.num_experts:
        ops += _moe_forward(shape)
    else:
        ops += _dense_mlp_forward(shape, "mlp", f)
    ops += _residual_forward(shape, "mlp", n_rep)
    return _overlap_tp(ops) if shape.tp_comm_overlap else ops


def _residual_forward(shape: LayerShape, name: str, n_rep: int) -> list[Op]:
    """The residual add after a branch: Megatron's fused bias-dropout-add, or eager PyTorch's add
    (the bias is inside the GEMM, addmm) after a separate dropout kernel when there is dropout."""
    e, h = shape.bytes_per_element, shape.hidden_size
    if not shape.eager_kernels:
        return [_mem(f"{name}.bias_dropout_add", (3 * e + _mask(shape)) * n_rep * h)]
    dropout = [_mem(f"{name}.dropout", (2 * e + MASK_BYTES) * n_rep * h)] if shape.dropout else []
    return [*dropout, _mem(f"{name}.residual_add", 3 * e * n_rep * h)]


def _residual_backward(shape: LayerShape, name: str, n_rep: int) -> list[Op]:
    """Fused: the bias-dropout-add backward; eager: the add passes its gradient on (no kernel), the
    dropout's backward if any, and the row-parallel linear's bias gradient (a sum over tokens)."""
    e, h = shape.bytes_per_element, shape.hidden_size
    if not shape.eager_kernels:
        return [_mem(f"{name}.bias_dropout_add.backward", (3 * e + _mask(shape)) * n_rep * h)]
    ops = [_mem(f"{name}.dropout.backward", (2 * e + MASK_BYTES) * n_rep * h)] if shape.dropout else []
    return ops + ([_mem(f"{name}.bias_grad", e * n_rep * h)] if shape.bias else [])


def _dense_mlp_forward(shape: LayerShape, name: str, f: int) -> list[Op]:
    """A tensor-parallel MLP of hidden size ``f`` per rank: [all-gather of its input], fc1, the
    activation, fc2, and the reduction of its output."""
    n, _, h, _, _, e = _dims(shape)
    act_in = 2 * f if shape.gated_mlp else f  # fc1 output width on this rank
    ops = _tp_comm(shape, "ln2.all_gather", "all_gather") if shape.sequence_parallel else []
    ops.append(_gemm(f"{name}.fc1", n, act_in, h, e))
    if shape.eager_kernels and shape.gated_mlp:
        # silu(w1 x) * (w3 x): silu reads and writes f, the product reads two and writes one
        ops += [_mem(f"{name}.silu", 2 * e * n * f), _mem(f"{name}.gate_mul", 3 * e * n * f)]
    else:
        # Bias-GeLU reads and writes f (eager: GELU alone, the bias inside addmm); SwiGLU reads the
        # gate and up halves and writes one.
        ops.append(_mem(f"{name}.activation", e * n * (act_in + f)))
    ops.append(_gemm(f"{name}.fc2", n, h, f, e))
    ops += _tp_comm(shape, f"{name}.fc2.tp_reduce", "reduce_scatter")
    return ops


def _dense_mlp_backward(shape: LayerShape, name: str, f: int) -> list[Op]:
    n, _, h, _, _, e = _dims(shape)
    sp = shape.sequence_parallel
    act_in = 2 * f if shape.gated_mlp else f
    # Backward of the forward reduce-scatter (SP) is an all-gather; of the all-reduce, identity.
    ops = _tp_comm(shape, f"{name}.fc2.tp_gather.backward", "all_gather") if sp else []
    ops += _linear_backward(f"{name}.fc2", n, h, f, e, [], [])
    if shape.eager_kernels and shape.gated_mlp:
        # the product's backward (two products, each reads two and writes one), silu_backward
        # (reads dy and x, writes dx)
        ops += [_mem(f"{name}.gate_mul.backward", 6 * e * n * f), _mem(f"{name}.silu.backward", 3 * e * n * f)]
    else:
        # Activation backward reads dy and the saved input, writes dx; plus the fc1 bias gradient.
        ops.append(_mem(f"{name}.activation.backward", e * n * (f + 2 * act_in + (act_in if shape.bias else 0))))
    fc1_comm = _tp_comm(shape, f"{name}.fc1.tp_reduce.backward", "reduce_scatter")
    fc1_regather = _tp_comm(shape, "ln2.all_gather.recompute", "all_gather") if sp else []
    ops += _linear_backward(f"{name}.fc1", n, act_in, h, e, fc1_comm, fc1_regather)
    return ops


def _expert_gemm(name: str, tokens: float, n_out: int, n_in: int, shape: LayerShape, passes: int = 1) -> Op:
    """A grouped GEMM over a rank's experts: ``tokens`` rows in all, each expert's weights read once."""
    e = shape.bytes_per_element
    local = shape.num_experts // shape.expert_parallel
    flops = 2.0 * tokens * n_out * n_in * passes
    moved = e * passes * (tokens * n_in + local * n_in * n_out + tokens * n_out)
    return Op(name, "matmul", flops=flops, bytes_moved=float(moved))


def _moe_comm(shape: LayerShape, name: str, dispatch: bool, backward: bool) -> list[Op]:
    """The all-to-all over the expert group, and the expert-tensor gather / scatter around the
    experts, in the order of the pass (experts.py)."""
    size = ex.dispatch_bytes(shape)
    a2a = [_comm(f"moe.{name}.all_to_all" + (".backward" if backward else ""), "all_to_all", size, "ep")]
    a2a = a2a if shape.expert_parallel > 1 else []
    gathers = dispatch != backward  # forward dispatch and backward combine gather over etp
    collective = "all_gather" if gathers else "reduce_scatter"
    etp = [_comm(f"moe.{name}.etp_{collective}" + (".backward" if backward else ""), collective,
                 size * shape.expert_tensor, "etp")] if shape.expert_tensor > 1 else []  # fmt: skip
    return a2a + etp if gathers else etp + a2a


def _moe_forward(shape: LayerShape) -> list[Op]:
    """Router, dispatch, the rank's experts, combine; then the shared experts (experts.py)."""
    _, _, h, _, _, e = _dims(shape)
    n_in, k, experts = ex.tokens_in(shape), shape.moe_top_k, shape.num_experts
    tokens, fc1 = ex.expert_tokens(shape), ex.expert_fc1_width(shape)
    f = shape.moe_ffn_hidden_size // shape.expert_tensor
    ops = [_gemm("moe.router", n_in, experts, h, e),
           _mem("moe.router.topk", 4 * 2 * n_in * experts),  # fp32 scores: softmax and top-k read and write
           _mem("moe.permute", 2 * e * n_in * k * h)]  # fmt: skip
    ops += _moe_comm(shape, "dispatch", dispatch=True, backward=False)
    ops.append(_expert_gemm("moe.experts.fc1", tokens, fc1, h, shape))
    ops.append(_mem("moe.experts.activation", e * tokens * (fc1 + f)))
    ops.append(_expert_gemm("moe.experts.fc2", tokens, h, f, shape))
    ops += _moe_comm(shape, "combine", dispatch=False, backward=False)
    ops.append(_mem("moe.unpermute", 3 * e * n_in * k * h))  # read the copies, weight and sum them
    if shape.moe_shared_experts:
        ops += _dense_mlp_forward(shape, "moe.shared", _shared_f(shape))
    return ops


def _moe_backward(shape: LayerShape) -> list[Op]:
    _, _, h, _, _, e = _dims(shape)
    n_in, k, experts = ex.tokens_in(shape), shape.moe_top_k, shape.num_experts
    tokens, fc1 = ex.expert_tokens(shape), ex.expert_fc1_width(shape)
    f = shape.moe_ffn_hidden_size // shape.expert_tensor
    ops = _dense_mlp_backward(shape, "moe.shared", _shared_f(shape)) if shape.moe_shared_experts else []
    ops.append(_mem("moe.unpermute.backward", 3 * e * n_in * k * h))
    ops += _moe_comm(shape, "combine", dispatch=False, backward=True)
    ops.append(_expert_gemm("moe.experts.fc2.backward", tokens, h, f, shape, passes=2))  # dgrad and wgrad
    ops.append(_mem("moe.experts.activation.backward", e * tokens * (f + 2 * fc1)))
    ops.append(_expert_gemm("moe.experts.fc1.backward", tokens, fc1, h, shape, passes=2))
    ops += _moe_comm(shape, "dispatch", dispatch=True, backward=True)
    ops.append(_mem("moe.permute.backward", 2 * e * n_in * k * h))
    ops.append(_gemm("moe.router.dgrad", n_in, h, experts, e))
    ops.append(_gemm("moe.router.wgrad", experts, h, n_in, e))
    return ops


def _shared_f(shape: LayerShape) -> int:
    """The shared experts as one tensor-parallel MLP: their hidden sizes together, over ``t``."""
    return shape.moe_shared_experts * shape.moe_ffn_hidden_size // shape.tensor_parallel


def _overlap_tp(ops: list[Op]) -> list[Op]:
    """Transformer Engine's userbuffers overlap (``--tp-comm-overlap``): each tensor-parallel
    all-gather runs pipelined with the GEMM it feeds, each reduce-scatter with the GEMM whose output
    it reduces; as the op order says it, the collective starts with the GEMM and is waited for
    after it. Collectives already overlapped (with a weight-gradient GEMM) stay as they are."""
    out: list[Op] = []
    for op in ops:
        if op.kind == "comm" and op.group == "tp" and not op.overlap and not is_overlapped(op.name):
            if op.collective == "reduce_scatter" and out and out[-1].kind == "matmul":
                out.insert(len(out) - 1, replace(op, overlap=True))  # beside the GEMM that produced it
                continue
            if op.collective == "all_gather":
                op = replace(op, overlap=True)  # beside the GEMM it feeds, next in the list
        out.append(op)
    return out


def _core_attention_backward(shape: LayerShape) -> list[Op]:
    n, _, h, _, n_att, e = _dims(shape)
    if shape.flash_attention:
        q, kv = _qkvo_elements(shape)
        flops = CAUSAL_FRACTION * FLASH_BACKWARD_FLOP_RATIO * _attention_flops(shape)
        # reads Q, K, V, O, dO and the statistics; writes dQ, dK, dV
        moved = e * (4 * q + 4 * kv) + 4 * n
        kernel = Op("attention.flash.backward", "attention", flops=flops, bytes_moved=float(moved))
        return _around_cp_exchange(shape, [kernel])
    s, d = shape.seq_length, shape.head_dim
    sq = s // shape.context_parallel
    batch = shape.micro_batch_size * shape.num_attention_heads // shape.tensor_parallel
    kernels = [
        _gemm("attention.context.dgrad_probs", sq, s, d, e, batch, kind="attention"),
        _gemm("attention.context.dgrad_value", s, d, sq, e, batch, kind="attention"),
        # read dy and the mask, write dx
        *([_mem("attention.dropout.backward", (2 * e + MASK_BYTES) * n_att)] if shape.dropout else []),
        _mem("attention.softmax.backward", 3 * e * n_att),  # read dy and y, write dx
        _gemm("attention.scores.dgrad_query", sq, d, s, e, batch, kind="attention"),
        _gemm("attention.scores.dgrad_key", s, d, sq, e, batch, kind="attention"),
    ]
    permute = _mem("attention.context_permute.backward", 2 * e * n * h // shape.tensor_parallel)
    return [permute, *_around_cp_exchange(shape, kernels)]


def _around_cp_exchange(shape: LayerShape, kernels: list[Op]) -> list[Op]:
    """The attention backward's kernels with context parallelism's K/V collectives: for the ring,
    both launched before the kernels and run beside them; for ``all_gather``, the K/V gathered
    before and their gradients reduce-scattered after, each waited for."""
    exchange = _cp_exchange(shape, forward=False)
    if not exchange or shape.context_algo == "ring":
        return [*exchange, *kernels]
    return [exchange[0], *kernels, *exchange[1:]]


def _linear_backward(name: str, n: int, n_out: int, n_in: int, e: int, comm: list[Op], regather: list[Op]) -> list[Op]:
    """[re-gather of the input], dgrad, the TP collective on the input gradient (if any), wgrad."""
    # Megatron issues the input-gradient collective right after dgrad and may overlap it with the
    # wgrad GEMM (async_tensor_model_parallel_allreduce); the op order records that opportunity.
    # With sequence parallelism only the sharded input of a column-parallel linear is kept, so
    # backward all-gathers it again for wgrad (overlapped with dgrad in Megatron).
    dgrad = _gemm(f"{name}.dgrad", n, n_in, n_out, e)
    return [*regather, dgrad, *comm, _gemm(f"{name}.wgrad", n_out, n_in, n, e)]


def _norm_backward(name: str, n_rep: int, h: int, e: int, shape: LayerShape | None = None) -> list[Op]:
    # Apex layernorm backward: gamma/beta kernel reads dy and x, input-grad kernel reads dy and x
    # and writes dx. The residual branch's gradient is then added to the layer-input gradient.
    # Eager: nn.LayerNorm's one native backward kernel (reads dy and x, writes dx), or the autograd
    # of torchtitan's RMSNorm (eager_rmsnorm_backward).
    if shape is not None and shape.eager_kernels:
        layernorm = [_mem(f"{name}.backward", 3 * e * n_rep * h)]
        norm = layernorm if shape.bias else eager_rmsnorm_backward(name, n_rep, h, e)
    else:
        norm = [_mem(f"{name}.backward", 5 * e * n_rep * h)]
    return [*norm, _mem(f"{name}.residual_grad_add", 3 * e * n_rep * h)]


def _norm_forward(shape: LayerShape, name: str, n_rep: int) -> list[Op]:
    """A normalisation: Apex's fused layernorm, nn.LayerNorm's one native kernel (eager, models with
    biases), or torchtitan's RMSNorm as eager PyTorch runs it (models without)."""
    e, h = shape.bytes_per_element, shape.hidden_size
    if shape.eager_kernels and not shape.bias:
        return eager_rmsnorm_forward(name, n_rep, h, e)
    return [_mem(name, 2 * e * n_rep * h)]


def op_selective_gemms(shape: LayerShape) -> list[tuple[str, int, int]]:
    """The GEMMs of torchtitan's block in forward order, as ``(name, output width, input width)``:
    wq, wk, wv, wo, then w1, w3, w2 (SwiGLU) or fc1, fc2."""
    h, t = shape.hidden_size, shape.tensor_parallel
    q = shape.num_attention_heads // t * shape.head_dim
    kv = max(1, shape.num_kv_heads // t) * shape.head_dim
    f = shape.ffn_hidden_size // t
    gemms = [("wq", q, h), ("wk", kv, h), ("wv", kv, h), ("wo", h, q)]
    mlp = [("w1", f, h), ("w3", f, h), ("w2", h, f)] if shape.gated_mlp else [("fc1", f, h), ("fc2", h, f)]
    return gemms + mlp


def op_selective_saved(shape: LayerShape) -> list[bool]:
    """Which of :func:`op_selective_gemms` torchtitan's policy saves. Its ``_save_list`` holds
    aten.mm (the outputs of every second one are recomputed: ``mm_count % 2 == 0``), the SDPA
    flash/efficient kernels and reduce_scatter (torchtitan parallelize_llama.py, 2024-12; today's
    adds max and other attention kernels); a linear with a bias is aten.addmm, not in the list, so
    a model with biases saves none of its GEMMs."""
    return [not shape.bias and i % 2 == 0 for i in range(len(op_selective_gemms(shape)))]


def op_selective_saved_bytes(shape: LayerShape) -> int:
    """Activation bytes one layer keeps under torchtitan's per-op checkpointing: the layer's input
    (the checkpoint wrapper's), the outputs of the saved GEMMs and, with a fused attention kernel,
    its output and fp32 log-sum-exp (the unfused scores are batched GEMMs, not saved). For a Llama
    layer ``e*n*(4h + kv + f) + 4*n*a`` (n tokens, kv the K/V width, f the MLP width)."""
    e = shape.bytes_per_element
    n = shape.micro_batch_size * shape.seq_length // shape.context_parallel
    saved = e * n * shape.hidden_size
    for (_, width, _), kept in zip(op_selective_gemms(shape), op_selective_saved(shape), strict=True):
        saved += e * n * width if kept else 0
    if shape.flash_attention:
        q, _ = _qkvo_elements(shape)
        saved += e * q + 4 * n * (shape.num_attention_heads // shape.tensor_parallel)
    return saved


def _op_selective_recompute(shape: LayerShape) -> list[Op]:
    """What per-op checkpointing reruns when a layer's backward starts: every elementwise op of the
    forward, the unfused attention's GEMMs and kernels, and the GEMMs the policy does not save."""
    n, _, _, _, _, e = _dims(shape)
    ops = [replace(op, name=f"recompute.{op.name}") for op in forward_ops(shape)
           if op.kind == "elementwise" or (op.kind == "attention" and not shape.flash_attention)]  # fmt: skip
    for (name, width, k), kept in zip(op_selective_gemms(shape), op_selective_saved(shape), strict=True):
        if not kept:
            ops.append(_gemm(f"recompute.{name}", n, width, k, e))
    return ops


def backward_ops(shape: LayerShape, recompute: str = "none") -> list[Op]:
    """The backward pass of one layer on one TP rank, in execution order.

    ``recompute``: 'none'; 'selective' reruns the core attention (scores, softmax, dropout,
    context; Korthikanti et al. 2022) just before its backward; 'full' reruns the whole forward,
    TP collectives included, before the backward; 'op_selective' reruns what torchtitan's per-op
    policy does not save (:func:`op_selective_saved`) when the layer's backward starts.
    ConfigError for another value.
    """
    if recompute not in ALL_RECOMPUTE_MODES:
        raise ConfigError(f"unknown recompute mode '{recompute}'; known: {', '.join(ALL_RECOMPUTE_MODES)}")
    n, n_rep, h, f, _, e = _dims(shape)
    t = shape.tensor_parallel
    sp = shape.sequence_parallel
    ops = [replace(op, name=f"recompute.{op.name}") for op in forward_ops(shape)] if recompute == "full" else []
    ops += _op_selective_recompute(shape) if recompute == OP_SELECTIVE else []
    # Bias-dropout-add backward: read dy and mask, write dx, then the bias-gradient reduction reads dx.
    ops += _residual_backward(shape, "mlp", n_rep)
    ops += _moe_backward(shape) if shape.num_experts else _dense_mlp_backward(shape, "mlp", f)
    ops += _norm_backward("ln2", n_rep, h, e, shape)
    ops += _residual_backward(shape, "attention", n_rep)
    ops += _tp_comm(shape, "attention.out_proj.tp_gather.backward", "all_gather") if sp else []
    ops += _linear_backward("attention.out_proj", n, h, h // t, e, [], [])
    if recompute == "selective":
        ops += _core_attention_forward(shape, prefix="recompute.")
    ops += _core_attention_backward(shape)
    ops += eager_qk_backward(shape) if shape.eager_kernels else []
    qkv_comm = _tp_comm(shape, "qkv.tp_reduce.backward", "reduce_scatter")
    qkv_regather = _tp_comm(shape, "ln1.all_gather.recompute", "all_gather") if sp else []
    ops += _linear_backward("qkv", n, shape.qkv_width, h, e, qkv_comm, qkv_regather)
    ops += _norm_backward("ln1", n_rep, h, e, shape)
    return _overlap_tp(ops) if shape.tp_comm_overlap else ops


@dataclass(frozen=True)
class EmbeddingAndLogitsOps:
    """Ops of the input embedding (first pipeline stage) and the output logits + loss (last)."""

    embedding_forward: tuple[Op, ...]
    embedding_backward: tuple[Op, ...]
    logits_forward: tuple[Op, ...]
    logits_backward: tuple[Op, ...]


def embedding_and_logits_ops(shape: LayerShape, vocab_size: int) -> EmbeddingAndLogitsOps:
    """Vocab-parallel embedding lookup and logits GEMM + cross-entropy on one TP rank (Megatron).

    The vocabulary is split over ``t`` ranks (padded up to a multiple of ``t``). Cross-entropy runs
    on fp32 logits as Megatron's vocab_parallel_cross_entropy does, with three small all-reduces
    (max, sum of exp, target logit) of ``b*s`` fp32 values.
    """
    if vocab_size < 1:
        raise ConfigError(f"vocab_size must be >= 1, got {vocab_size}")
    n, n_rep, h, _, _, e = _dims(shape)
    t = shape.tensor_parallel
    v = tp.vocab_rows(vocab_size, t)  # vocabulary rows on this rank
    sp = shape.sequence_parallel
    # Lookup: read the gathered rows, write the (masked, partial) b*s*h output; then the sum over
    # ranks, position-embedding add and embedding dropout on this rank's tokens.
    emb_fwd = [_mem("embedding.lookup", 2 * e * n * h)]
    emb_fwd += _tp_comm(shape, "embedding.tp_reduce", "reduce_scatter")
    emb_fwd.append(_mem("embedding.position_add_dropout", (3 * e + _mask(shape)) * n_rep * h))
    emb_bwd = [_mem("embedding.position_add_dropout.backward", (2 * e + _mask(shape)) * n_rep * h)]
    emb_bwd += _tp_comm(shape, "embedding.tp_gather.backward", "all_gather") if sp else []
    # Scatter-add of b*s gradient rows into the vocabulary shard's fp32 gradient.
    emb_bwd.append(_mem("embedding.grad_scatter_add", (e + 8) * n * h))

    logits = n * v
    final_norm = _norm_forward(shape, "ln_f", n_rep)
    logits_fwd = [replace(op, name=op.name.replace("ln_f", "final_layernorm")) for op in final_norm]
    logits_fwd += _tp_comm(shape, "final_layernorm.all_gather", "all_gather") if sp else []
    logits_fwd.append(_gemm("logits", n, v, h, e))
    if shape.eager_kernels:
        loss_fwd, loss_bwd = eager_loss_ops(n, logits, e)
        logits_fwd += loss_fwd
        logits_bwd = list(loss_bwd)
    else:
        # Cast to fp32 (read e, write 4) and row max (read 4); subtract (8), exp (8) and sum (4);
        # normalise (8). Each reduction over the vocabulary is completed by a small all-reduce.
        logits_fwd.append(_mem("cross_entropy.max", (e + 4 + 4) * logits))
        logits_fwd += _loss_all_reduces(shape, ("max",))
        logits_fwd.append(_mem("cross_entropy.exp_sum", (8 + 8 + 4) * logits))
        logits_fwd += _loss_all_reduces(shape, ("target_logit", "sum_exp"))
        logits_fwd.append(_mem("cross_entropy.normalise", 8 * logits))
        # Softmax minus one-hot (read 4, write 4) and cast back (read 4, write e).
        logits_bwd = [_mem("cross_entropy.backward", (4 + 4 + 4 + e) * logits)]
    logits_comm = _tp_comm(shape, "logits.tp_reduce.backward", "reduce_scatter")
    logits_regather = _tp_comm(shape, "final_layernorm.all_gather.recompute", "all_gather") if sp else []
    logits_bwd += _linear_backward("logits", n, v, h, e, logits_comm, logits_regather)
    final_norm_bwd = _norm_backward("ln_f", n_rep, h, e, shape)[:-1]  # no residual branch after it
    logits_bwd += [replace(op, name=op.name.replace("ln_f", "final_layernorm")) for op in final_norm_bwd]
    return EmbeddingAndLogitsOps(tuple(emb_fwd), tuple(emb_bwd), tuple(logits_fwd), tuple(logits_bwd))


# the fp32 bytes per logit eager's loss holds at its peak, beside the 16-bit logits: the log-softmax
# output (kept for its backward), nll_loss's gradient and the log-softmax's gradient
EAGER_LOSS_FP32_BYTES = 4 + 4 + 4


def eager_loss_ops(tokens: int, logits: int, e: int) -> tuple[list[Op], list[Op]]:
    """``cross_entropy(logits.float(), labels)`` in eager PyTorch, forward and backward: the cast to
    fp32 (e + 4 per logit), log_softmax (reads 4, writes 4), nll_loss (reads one logit per token);
    nll_loss's backward (a zeroed fp32 gradient with one value per token: writes 4),
    log_softmax's backward (reads the gradient and the output, writes 4: 12) and the cast back
    (4 + e)."""
    forward = [_mem("cross_entropy.to_fp32", (e + 4) * logits), _mem("cross_entropy.log_softmax", 8 * logits),
               _mem("cross_entropy.nll_loss", 12 * tokens)]  # fmt: skip
    backward = [_mem("cross_entropy.nll_loss.backward", 4 * logits + 12 * tokens),
                _mem("cross_entropy.log_softmax.backward", 12 * logits),
                _mem("cross_entropy.to_input_dtype", (4 + e) * logits)]  # fmt: skip
    return forward, backward


def _loss_all_reduces(shape: LayerShape, what: tuple[str, ...]) -> list[Op]:
    size = tp.loss_reduce_bytes(shape)
    if size is None:
        return []
    return [_comm(f"cross_entropy.{w}.all_reduce", "all_reduce", size) for w in what]


def optimizer_step_ops(params_on_rank: int, precision: str = "bf16") -> list[Op]:
    """Adam step over the parameters held by one rank: memory-bound, one fused kernel pass.

    Mixed precision (bf16/fp16/fp8): gradient-norm pass reads the fp32 gradients (4 B/param); the
    fused Adam reads the fp32 master weight, gradient, m and v (16 B) and writes master, m, v
    (12 B) and the 16-bit model copy (2 B). fp32 training has no copy to write.
    ConfigError for a negative count or an unknown precision.
    """
    if params_on_rank < 0:
        raise ConfigError(f"params_on_rank must be >= 0, got {params_on_rank}")
    if precision == "fp32":
        adam_bytes = 28
    elif precision in ("bf16", "fp16", "fp8"):
        adam_bytes = 30
    else:
        raise ConfigError(f"unknown precision '{precision}'; known: bf16, fp16, fp32, fp8")
    return [_mem("optimizer.grad_norm", 4 * params_on_rank), _mem("optimizer.adam", adam_bytes * params_on_rank)]


def _mlp_params(h: int, f: int, gated: bool, bias: bool) -> tuple[int, int]:
    """(weights, biases) of an MLP of hidden size ``f``."""
    fc1 = 2 * f if gated else f
    return h * fc1 + f * h, (fc1 + h) if bias else 0


def layer_params(shape: LayerShape) -> int:
    """Parameters of one whole layer (all TP ranks together): 12h^2 + 13h for GPT; a MoE layer's
    MLP is its router, all its experts and its shared experts."""
    h = shape.hidden_size
    # Unsplit QKV width: (a query + 2 kv) heads; per-rank replicas of K/V heads are not counted.
    qkv = (shape.num_attention_heads + 2 * shape.num_kv_heads) * shape.head_dim
    weights, biases = h * qkv + h * h, (qkv + h) if shape.bias else 0
    if shape.num_experts:
        experts = _mlp_params(h, shape.moe_ffn_hidden_size, shape.gated_mlp, False)[0] * shape.num_experts
        shared = _mlp_params(h, shape.moe_ffn_hidden_size * shape.moe_shared_experts, shape.gated_mlp, False)[0]
        weights += h * shape.num_experts + experts + shared
    else:
        mlp_w, mlp_b = _mlp_params(h, shape.ffn_hidden_size, shape.gated_mlp, shape.bias)
        weights, biases = weights + mlp_w, biases + mlp_b
    norms = 2 * (2 * h if shape.bias else h)
    return weights + biases + norms


def layer_params_per_rank(shape: LayerShape) -> int:
    """Parameters of one layer held by one TP rank: split matrices and biases, replicated norms; for
    a MoE layer the router (replicated), the shared experts (split over ``t``) and this rank's
    experts (experts.py; their own data-parallel group: :func:`dense_params_per_rank` is the rest)."""
    return dense_params_per_rank(shape) + ex.expert_params_per_rank(shape)


def dense_params_per_rank(shape: LayerShape) -> int:
    """A layer's parameters on one rank that every data-parallel replica holds (all but the experts)."""
    h, t = shape.hidden_size, shape.tensor_parallel
    qkv = shape.qkv_width
    weights = h * qkv + (h // t) * h
    # Row-parallel biases (out-proj, fc2) are replicated; column-parallel ones are split.
    biases = (qkv + h) if shape.bias else 0
    if shape.num_experts:
        shared = shape.moe_ffn_hidden_size * shape.moe_shared_experts // t
        weights += h * shape.num_experts + _mlp_params(h, shared, shape.gated_mlp, False)[0]
    else:
        mlp_w, mlp_b = _mlp_params(h, shape.ffn_hidden_size // t, shape.gated_mlp, shape.bias)
        weights, biases = weights + mlp_w, biases + mlp_b
    norms = 2 * (2 * h if shape.bias else h)
    return weights + biases + norms


def embedding_params(hidden_size: int, vocab_size: int, seq_length: int = 0) -> int:
    """Word embedding (V*h) plus learned position embedding (s*h; pass 0 for rotary models)."""
    return (vocab_size + seq_length) * hidden_size


def model_params(shape: LayerShape, num_layers: int, vocab_size: int, learned_positions: bool = True) -> int:
    """Whole-model parameters, tied input/output embedding, final norm omitted as in Narayanan eq. 2.

    For GPT this is P = 12*l*h^2 * (1 + 13/(12h) + (V+s)/(12*l*h)).
    """
    positions = shape.seq_length if learned_positions else 0
    return num_layers * layer_params(shape) + embedding_params(shape.hidden_size, vocab_size, positions)
