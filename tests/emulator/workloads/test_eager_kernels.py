"""Eager PyTorch kernels (``training.kernels: eager``) and torchtitan's per-op selective activation
checkpointing (``training.recompute: op_selective``): closed forms by hand, the kernels torch itself
dispatches for torchtitan's RMSNorm, RoPE and SwiGLU, and the per-kernel bytes issue 23's capture of
configs/torch/fsdp_gpt.py records."""

from __future__ import annotations

import pytest

from emulator.config.loader import load_run
from emulator.errors import ConfigError
from emulator.workloads import eager_kernels
from emulator.workloads import layer_costs as lc
from emulator.workloads.memory import activation_bytes_per_layer, logits_bytes
from tests.conftest import CONFIGS
from tests.emulator.workloads.collectives import collective_calls

FSDP_GPT = CONFIGS / "torch" / "fsdp_gpt_builtin.yaml"
LLAMA_8B_RUN = CONFIGS / "runs" / "llama3-8b-64gpu.yaml"


def small_llama(**kw) -> lc.LayerShape:
    """h 64, 4 heads of 16, 2 K/V heads, SwiGLU of 128, 2 x 32 tokens, no biases, RoPE, flash."""
    args = dict(hidden_size=64, num_attention_heads=4, seq_length=32, micro_batch_size=2, ffn_hidden_size=128,
                num_kv_heads=2, gated_mlp=True, bias=False, dropout=False, flash_attention=True, rope=True,
                eager_kernels=True)  # fmt: skip
    args.update(kw)
    return lc.LayerShape(**args)


def small_gpt(**kw) -> lc.LayerShape:
    """configs/torch/fsdp_gpt.py's block: h 2048, 16 heads, 4h MLP with biases, 2 x 2048 tokens."""
    args = dict(hidden_size=2048, num_attention_heads=16, seq_length=2048, micro_batch_size=2, bias=True,
                dropout=False, flash_attention=True, eager_kernels=True)  # fmt: skip
    args.update(kw)
    return lc.LayerShape(**args)


def _bytes(ops, kind: str = "elementwise") -> float:
    return sum(op.bytes_moved for op in ops if op.kind == kind)


def test_eager_rmsnorm_bytes_by_hand():
    """Forward 4e + 28 bytes per element and three per-row kernels of 8, 8 and 4 + 4 bytes (plus the
    mean's 4 per row); backward 8e + 76 per element and (4 + 4 + 8 + 8 + 12 + 4) per row."""
    rows, h, e = 3, 8, 2
    m = rows * h
    forward = lc.eager_rmsnorm_forward("n", rows, h, e)
    backward = lc.eager_rmsnorm_backward("n", rows, h, e)
    assert len(forward) == 8 and len(backward) == 16
    assert _bytes(forward) == (4 * e + 28) * m + (4 + 8 + 8 + 4) * rows == 936
    assert _bytes(backward) == (8 * e + 76) * m + (4 + 4 + 8 + 8 + 12 + 4) * rows == 2328


def test_eager_llama_layer_forward_bytes_by_hand():
    """torchtitan's block, forward: two RMSNorms, RoPE on Q (n*64 elements) and K (n*32), repeat_kv's
    copies of K and V (read n*32, write n*64 each), two residual adds (3e), silu (2e) and the gate
    product (3e) over n*128."""
    shape = small_llama()
    n, h, e, f, q, kv = 64, 64, 2, 128, 64, 32
    norm = (4 * e + 28) * n * h + 24 * n
    rope = 20 * n * q + 20 * n * kv
    repeat = 2 * e * n * (kv + q)
    expected = 2 * norm + rope + repeat + 2 * 3 * e * n * h + 5 * e * n * f
    assert _bytes(lc.forward_ops(shape)) == expected
    # the fused kernels of the same layer: two layernorm passes (2e), two bias-dropout-adds (3e),
    # SwiGLU reading both halves and writing one (3e over f)
    fused = 2 * 2 * e * n * h + 2 * 3 * e * n * h + 3 * e * n * f
    assert _bytes(lc.forward_ops(small_llama(eager_kernels=False))) == fused


def test_eager_gpt_layer_kernels_match_the_fsdp_gpt_capture():
    """The per-kernel bytes issue 23's capture of fsdp_gpt.py records per block (its aten ops'
    tensors, so the layer norms' weights and statistics count too), against the eager list."""
    shape = small_gpt()
    forward = {op.name: op.bytes_moved for op in lc.forward_ops(shape)}
    backward = {op.name: op.bytes_moved for op in lc.backward_ops(shape)}
    captured = {  # name here: bytes the capture records for the aten op
        ("forward", "ln1"): 33_587_200,  # native_layer_norm
        ("forward", "mlp.activation"): 134_217_728,  # gelu
        ("forward", "attention.residual_add"): 50_331_648,  # add
        ("backward", "mlp.activation.backward"): 201_326_592 + 67_108_864,  # gelu_backward, fc1's bias sum
        ("backward", "ln2.backward"): 50_356_224,  # native_layer_norm_backward
        ("backward", "ln2.residual_grad_add"): 50_331_648,  # add
        ("backward", "mlp.bias_grad"): 16_777_216,  # sum (fc2's bias)
        ("backward", "attention.qkv_split.backward.stack"): 100_663_296,  # stack of dq, dk, dv
        ("backward", "attention.qkv_split.backward.contiguous"): 100_663_296,  # clone
        ("backward", "qkv.bias_grad"): 50_331_648,  # sum (the QKV bias)
    }
    for (direction, name), recorded in captured.items():
        ours = (forward if direction == "forward" else backward)[name]
        assert ours == pytest.approx(recorded, rel=1e-3), name
    # the loss over 2 x 2048 tokens and 32768 logits: _to_copy, _log_softmax, their backward, _to_copy
    tokens, logits = 4096, 4096 * 32768
    loss_fwd, loss_bwd = lc.eager_loss_ops(tokens, logits, 2)
    assert [op.bytes_moved for op in loss_fwd[:2]] == [805_306_368, 1_073_741_824]
    assert [op.bytes_moved for op in loss_bwd[1:]] == [1_610_612_736, 805_306_368]


def test_eager_loss_holds_the_logits_and_three_fp32_tensors():
    config = load_run(FSDP_GPT)
    assert logits_bytes(config) == (2 + 4 + 4 + 4) * 2 * 2048 * 32768  # 1.88 GB: the capture's 1.9 GB
    assert logits_bytes(load_run(FSDP_GPT, ["training.kernels=fused"])) == 4 * 2 * 2048 * 32768


def test_op_selective_saves_every_other_gemm_and_the_attention():
    """torchtitan's policy on a Llama block: its input, the outputs of wq, wv, w1, w2 (the 1st, 3rd,
    5th and 7th mm), the flash kernel's output and fp32 log-sum-exp."""
    shape = small_llama()
    n, h, e, f, kv, heads = 64, 64, 2, 128, 32, 4
    assert [name for (name, *_), kept in zip(lc.op_selective_gemms(shape), lc.op_selective_saved(shape),
                                              strict=True) if kept] == ["wq", "wv", "w1", "w2"]  # fmt: skip
    assert lc.op_selective_saved_bytes(shape) == e * n * (h + h + kv + f + h) + e * n * h + 4 * n * heads
    # a model with biases runs addmm, not in the save list: only the input and the attention remain
    assert lc.op_selective_saved_bytes(small_llama(bias=True)) == e * n * h + e * n * h + 4 * n * heads
    # Llama 3 8B at torchtitan's batch: 2 x 8192 tokens keep 2n(4h + kv + f) + 4na bytes a layer
    config = load_run(LLAMA_8B_RUN, ["parallel.tensor=1", "parallel.pipeline=1", "parallel.data=64",
                                     "training.recompute=op_selective", "training.micro_batch_size=2",
                                     "training.seq_length=8192", "training.global_batch_size=128",
                                     "training.attention=flash"])  # fmt: skip
    n = 2 * 8192
    assert activation_bytes_per_layer(config) == 2 * n * (4 * 4096 + 1024 + 14336) + 4 * n * 32


def test_op_selective_recomputes_every_second_mm_and_the_elementwise_ops():
    shape = small_llama()
    n, h, f, q, kv = 64, 64, 128, 64, 32
    backward = lc.backward_ops(shape, "op_selective")
    recomputed = [op for op in backward if op.name.startswith("recompute.")]
    assert {op.name for op in recomputed if op.kind == "matmul"} == {"recompute.wk", "recompute.wo", "recompute.w3"}
    assert sum(op.flops for op in recomputed) == 2 * n * (h * kv + q * h + h * f)
    assert not [op for op in recomputed if op.kind == "attention"]  # the flash kernel's output is saved
    forward_elementwise = [op.name for op in lc.forward_ops(shape) if op.kind == "elementwise"]
    assert [op.name for op in recomputed if op.kind == "elementwise"] == [f"recompute.{n}" for n in forward_elementwise]
    # with biases every linear is recomputed: the forward's GEMM FLOPs once more
    biased = small_llama(bias=True)
    recomputed = [op for op in lc.backward_ops(biased, "op_selective") if op.name.startswith("recompute.")]
    assert sum(op.flops for op in recomputed) == sum(op.flops for op in lc.forward_ops(biased) if op.kind == "matmul")


def test_eager_and_op_selective_are_refused_with_tensor_parallelism():
    for knob in ("training.kernels=eager", "training.recompute=op_selective"):
        with pytest.raises(ConfigError, match=r"is modelled without tensor or context parallelism; got "
                                              r"parallel.tensor = 2$"):  # fmt: skip
            load_run(LLAMA_8B_RUN, [knob])
    with pytest.raises(ConfigError, match=r"^training.kernels: 'compiled' is not one of 'fused', 'eager'$"):
        load_run(FSDP_GPT, ["training.kernels=compiled"])


def test_fsdp_gpt_builtin_issues_the_captures_collectives():
    """Per iteration, as the capture of fsdp_gpt.py: 16 all-gathers of a block's bf16 weights, 8
    reduce-scatters of its fp32 gradients, and the root unit's one all-gather and one reduce-scatter."""
    calls = collective_calls(load_run(FSDP_GPT))
    iterations = 2
    assert calls == {("all_gather", 100_716_544): 16 * iterations, ("all_gather", 276_832_256): iterations,
                     ("reduce_scatter", 201_433_088): 8 * iterations,
                     ("reduce_scatter", 553_664_512): iterations}  # fmt: skip


VIEWS = {"view", "_unsafe_view", "t", "detach", "expand", "unsqueeze", "transpose", "view_as_complex",
         "view_as_real", "reshape", "alias", "flatten", "_conj"}  # fmt: skip


def _dispatched(run):
    """The kernels torch dispatches while ``run()`` runs: (name, bytes), an input counted by its
    storage (a broadcast operand is read once), the output whole; views left out."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.kernels = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = func.__name__.split(".")[0]
            if name not in VIEWS:
                ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
                outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
                moved = sum(min(t.untyped_storage().nbytes(), t.numel() * t.element_size()) for t in ins)
                self.kernels.append((name, moved + sum(t.numel() * t.element_size() for t in outs)))
            return out

    with Record() as record:
        run()
    return record.kernels


def _same_kernels(ours, dispatched, slack_bytes: int) -> None:
    """One kernel each, bytes equal up to what a small operand (a weight, the frequencies) adds."""
    assert len(ours) == len(dispatched), (ours, dispatched)
    for a, b in zip(sorted(op.bytes_moved for op in ours), sorted(b for _, b in dispatched), strict=True):
        assert abs(a - b) <= slack_bytes, (sorted(op.bytes_moved for op in ours), sorted(b for _, b in dispatched))


def test_eager_rmsnorm_is_the_kernels_torch_dispatches():
    """torchtitan's RMSNorm (norms.py): the forward's 8 kernels and its autograd's 16, byte for byte
    but for the weight's 2h bytes."""
    torch = pytest.importorskip("torch")
    rows, h = 6, 16
    weight = torch.nn.Parameter(torch.ones(h, dtype=torch.bfloat16))
    x = torch.randn(rows, h, dtype=torch.bfloat16, requires_grad=True)
    out = {}

    def forward():
        x32 = x.float()
        out["y"] = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(x) * weight

    _same_kernels(lc.eager_rmsnorm_forward("n", rows, h, 2), _dispatched(forward), 2 * h)
    grad = torch.randn(rows, h, dtype=torch.bfloat16)
    _same_kernels(lc.eager_rmsnorm_backward("n", rows, h, 2), _dispatched(lambda: out["y"].backward(grad)), 2 * h)


def test_eager_rope_and_swiglu_are_the_kernels_torch_dispatches():
    """torchtitan's apply_rotary_emb on one tensor (3 kernels each way, the frequencies aside) and
    SwiGLU's silu and product (2 kernels forward, 3 backward)."""
    torch = pytest.importorskip("torch")
    b, s, heads, d, f = 1, 8, 2, 8, 32
    freqs = torch.polar(torch.ones(s, d // 2), torch.randn(s, d // 2)).view(1, s, 1, d // 2)
    x = torch.randn(b, s, heads, d, dtype=torch.bfloat16, requires_grad=True)
    out = {}

    def rope():
        rotated = torch.view_as_complex(x.float().reshape(b, s, heads, -1, 2)) * freqs
        out["rope"] = torch.view_as_real(rotated).flatten(3).type_as(x)

    elements = b * s * heads * d
    freq_bytes = freqs.numel() * freqs.element_size()
    _same_kernels(eager_kernels.rope_ops("q", elements, 2), _dispatched(rope), freq_bytes)
    grad = torch.randn(b, s, heads, d, dtype=torch.bfloat16)
    # backward: the product with the conjugate frequencies, which are first copied out (clone)
    backward = eager_kernels.rope_ops("q", elements, 2, conj_bytes=2 * freq_bytes)
    _same_kernels(backward, _dispatched(lambda: out["rope"].backward(grad)), freq_bytes)

    gate = torch.randn(s, f, dtype=torch.bfloat16, requires_grad=True)
    up = torch.randn(s, f, dtype=torch.bfloat16, requires_grad=True)

    def swiglu():
        out["swiglu"] = torch.nn.functional.silu(gate) * up

    shape = small_llama(micro_batch_size=1, seq_length=s, ffn_hidden_size=f)
    mlp_forward = [op for op in lc.forward_ops(shape) if op.name in ("mlp.silu", "mlp.gate_mul")]
    _same_kernels(mlp_forward, _dispatched(swiglu), 0)
    grad = torch.randn(s, f, dtype=torch.bfloat16)
    dispatched = _dispatched(lambda: out["swiglu"].backward(grad))
    ours = [op for op in lc.backward_ops(shape) if op.name in ("mlp.gate_mul.backward", "mlp.silu.backward")]
    # our product's backward is one entry for its two kernels (dy*up and dy*silu)
    assert len(dispatched) == 3
    assert sum(op.bytes_moved for op in ours) == sum(b for _, b in dispatched)


@pytest.mark.parametrize("shards", [2, 4])
def test_eager_op_selective_zero3_identical_on_any_shard_count(shards):
    """A torchtitan-like run (Llama layers, per-op checkpointing, eager kernels, ZeRO-3 with its root
    unit, two microbatches): the same fingerprint on 1, 2 and 4 shards."""
    from emulator.backends.inline import run_inline
    from emulator.engine.result import fingerprint
    from netmodel.topology import Topology

    config = load_run(LLAMA_8B_RUN, ["cluster.nodes=2", "parallel.tensor=1", "parallel.pipeline=1",
                                     "parallel.data=16", "parallel.zero_stage=3", "model.num_layers=2",
                                     "training.seq_length=1024", "training.global_batch_size=32",
                                     "training.recompute=op_selective", "training.kernels=eager",
                                     "training.attention=flash"])  # fmt: skip
    topo = Topology(config.cluster)
    assert fingerprint(run_inline(config, topo, shards)) == fingerprint(run_inline(config, topo, 1))
