"""Eager PyTorch's kernels (``training.kernels: eager``) where they differ from the fused ones:
torchtitan's RMSNorm, the rotary embedding, and the chain between the QKV projection and the
attention kernel. The layer's op lists (emulator/workloads/layer_costs.py) take them from here;
tests/emulator/workloads/test_eager_kernels.py holds each to the kernels torch dispatches.
"""

from __future__ import annotations

from emulator.workloads.layer_shape import LayerShape, Op, qkvo_elements
from emulator.workloads.layer_shape import mem_op as _mem

# Eager PyTorch (training.kernels: eager). Each aten op is its own kernel reading its inputs from HBM
# and writing its output there; the op lists follow the two reference model definitions:
# - models without biases (Llama): torchtitan's Llama (torchtitan/models/llama/model.py, norms.py,
#   Dec 2024): RMSNorm as ``(x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * w``,
#   separate wq/wk/wv projections, rotary embedding by complex multiplication in fp32,
#   ``repeat_kv`` (expand + reshape: a copy) for grouped-query attention, SwiGLU as
#   ``w2(silu(w1 x) * w3 x)``, residual adds;
# - models with biases (GPT): configs/torch/fsdp_gpt.py: nn.LayerNorm (one native kernel each way),
#   one fused QKV Linear split by view/permute/unbind (whose backward stacks the Q/K/V gradients
#   and copies them contiguous), GELU, the biases inside addmm (their gradients a sum over tokens).
# Both compute the loss as cross_entropy(logits.float()) (eager_loss_ops). Byte counts take each
# operand once; per-row scalars (n values) are counted as the small kernels they are.


def eager_rmsnorm_forward(name: str, rows: int, h: int, e: int) -> list[Op]:
    """torchtitan's RMSNorm forward over ``rows`` tokens of width ``h``: 8 kernels, (e + 4) + 8 + 4 +
    8 + (4 + e) + 2e = 4e + 28 bytes per element (36 in bf16) and three per-row kernels."""
    m = rows * h
    return [
        _mem(f"{name}.to_fp32", (e + 4) * m),
        _mem(f"{name}.pow", 8 * m),
        _mem(f"{name}.mean", 4 * m + 4 * rows),
        _mem(f"{name}.add_eps", 8 * rows),
        _mem(f"{name}.rsqrt", 8 * rows),
        _mem(f"{name}.mul_rsqrt", 8 * m + 4 * rows),
        _mem(f"{name}.to_input_dtype", (4 + e) * m),
        _mem(f"{name}.mul_weight", 2 * e * m),
    ]


def eager_rmsnorm_backward(name: str, rows: int, h: int, e: int) -> list[Op]:
    """Autograd of :func:`eager_rmsnorm_forward`: 8e + 76 bytes per element (92 in bf16).

    dy*w (2e), the weight's gradient dy*y then its sum over tokens (3e + e), the cast to fp32
    (e + 4), d(x*r) = dy*r (8) and the row sums of dy*x (12 + 4), mean's backward (an expand
    divided by h, 4), pow's backward (x^1, times 2, times the gradient: 8 + 8 + 12), the two
    gradients of x summed (12) and cast back (4 + e); rsqrt's backward is three per-row kernels.
    The kernels torch dispatches, one for one (tests/emulator/workloads/test_eager_kernels.py)."""
    m = rows * h
    return [
        _mem(f"{name}.backward.mul_weight", 2 * e * m),
        _mem(f"{name}.backward.weight_grad_mul", 3 * e * m),
        _mem(f"{name}.backward.weight_grad_sum", e * m),
        _mem(f"{name}.backward.to_fp32", (e + 4) * m),
        _mem(f"{name}.backward.mul_rsqrt", 8 * m + 4 * rows),
        _mem(f"{name}.backward.rsqrt_grad_mul", 12 * m),
        _mem(f"{name}.backward.rsqrt_grad_sum", 4 * m + 4 * rows),
        _mem(f"{name}.backward.rsqrt.pow", 8 * rows),  # d rsqrt(v) = -0.5 v^-1.5: three per-row kernels
        _mem(f"{name}.backward.rsqrt.scale", 8 * rows),
        _mem(f"{name}.backward.rsqrt.mul", 12 * rows),
        _mem(f"{name}.backward.mean", 4 * m + 4 * rows),
        _mem(f"{name}.backward.pow", 8 * m),
        _mem(f"{name}.backward.pow_scale", 8 * m),
        _mem(f"{name}.backward.pow_grad_mul", 12 * m),
        _mem(f"{name}.backward.grad_add", 12 * m),
        _mem(f"{name}.backward.to_input_dtype", (4 + e) * m),
    ]


def rope_ops(name: str, elements: int, e: int, conj_bytes: int = 0) -> list[Op]:
    """torchtitan's apply_rotary_emb on one tensor: cast to fp32 (e + 4), the complex product with
    the frequencies (reads 4, writes 4), cast back (4 + e); its backward is the same three kernels,
    after a copy of the conjugated frequencies (``conj_bytes``: read and written, per rank's tokens)."""
    conj = [_mem(f"{name}.conj_freqs", conj_bytes)] if conj_bytes else []
    return [*conj, _mem(f"{name}.to_fp32", (e + 4) * elements), _mem(f"{name}.complex_mul", 8 * elements),
            _mem(f"{name}.to_input_dtype", (4 + e) * elements)]  # fmt: skip


def eager_qk_forward(shape: LayerShape) -> list[Op]:
    """Between the QKV projection and the attention kernel, eager: RoPE on Q and K, and
    ``repeat_kv``'s copies of K and V when there are fewer K/V heads than query heads."""
    e = shape.bytes_per_element
    q, kv = qkvo_elements(shape)
    ops = [*rope_ops("attention.rope_q", q, e), *rope_ops("attention.rope_k", kv, e)] if shape.rope else []
    if shape.num_kv_heads < shape.num_attention_heads:
        ops += [_mem(f"attention.repeat_kv.{x}", e * (kv + q)) for x in ("k", "v")]
    return ops


def eager_qk_backward(shape: LayerShape) -> list[Op]:
    """The backward of :func:`eager_qk_forward` (repeat_kv's: a sum over the copies), and for the
    fused QKV of the GPT definition the stack and contiguous copy of the Q/K/V gradients."""
    e = shape.bytes_per_element
    q, kv = qkvo_elements(shape)
    ops = []
    if shape.num_kv_heads < shape.num_attention_heads:
        ops += [_mem(f"attention.repeat_kv.{x}.backward", e * (kv + q)) for x in ("k", "v")]
    if shape.rope:
        # the complex64 frequencies of the rank's tokens, s/c x d/2 of 8 bytes, read and written
        conj = 2 * 8 * (shape.seq_length // shape.context_parallel) * (shape.head_dim // 2)
        ops += [*rope_ops("attention.rope_q.backward", q, e, conj),
                *rope_ops("attention.rope_k.backward", kv, e, conj)]
    if shape.bias:
        n = shape.micro_batch_size * shape.seq_length // shape.context_parallel
        ops += [_mem("attention.qkv_split.backward.stack", 2 * e * n * shape.qkv_width),
                _mem("attention.qkv_split.backward.contiguous", 2 * e * n * shape.qkv_width),
                _mem("qkv.bias_grad", e * n * shape.qkv_width)]  # fmt: skip
    return ops
