"""The shape of one transformer layer on one tensor-parallel rank, and the op every op list is made
of: what emulator/workloads/layer_costs.py (the Megatron-LM kernels) and
emulator/workloads/eager_kernels.py (eager PyTorch's) build their lists from.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.errors import ConfigError


@dataclass(frozen=True)
class LayerShape:
    """Shape of one transformer layer and how it is split over tensor-parallel ranks.

    ``ffn_hidden_size`` defaults to ``4*hidden_size`` and ``num_kv_heads`` to
    ``num_attention_heads`` (GPT); ``gated_mlp`` is SwiGLU (three GEMMs of width ``f``);
    ``bias=False`` is the LLaMA style (no linear biases, RMSNorm with a weight only).
    """

    hidden_size: int
    num_attention_heads: int
    seq_length: int
    micro_batch_size: int
    ffn_hidden_size: int | None = None
    num_kv_heads: int | None = None
    gated_mlp: bool = False
    tensor_parallel: int = 1
    sequence_parallel: bool = False
    bytes_per_element: int = 2
    bias: bool = True
    context_parallel: int = 1  # ranks a sequence is split over (context_parallel.py)
    context_algo: str = "ring"
    flash_attention: bool = False  # a fused causal attention kernel (training.attention: flash)
    tp_comm_overlap: bool = False  # TP all-gathers / reduce-scatters pipelined with their GEMMs
    dropout: bool = True  # Megatron's hidden and attention dropout (1-byte masks); Llama-style models have none
    # eager PyTorch kernels (training.kernels: eager): every elementwise op of the model definition
    # its own memory-bound kernel (eager_kernels.py, eager_loss_ops); False: the fused kernels of Megatron
    eager_kernels: bool = False
    rope: bool = False  # rotary position embedding applied to Q and K (an eager kernel chain; fused: free)
    # mixture of experts (experts.py): 0 experts is a dense MLP
    num_experts: int = 0
    moe_top_k: int = 2
    moe_ffn_hidden_size: int = 0
    moe_shared_experts: int = 0
    expert_parallel: int = 1
    expert_tensor: int = 1
    expert_load: float = 1.0  # this rank's share of the routed tokens (mean 1)

    def __post_init__(self) -> None:
        if self.ffn_hidden_size is None:
            object.__setattr__(self, "ffn_hidden_size", 4 * self.hidden_size)
        if self.num_kv_heads is None:
            object.__setattr__(self, "num_kv_heads", self.num_attention_heads)
        h, a, kv, t = self.hidden_size, self.num_attention_heads, self.num_kv_heads, self.tensor_parallel
        for key in ("hidden_size", "num_attention_heads", "seq_length", "micro_batch_size", "tensor_parallel",
                    "context_parallel"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1, got {getattr(self, key)}")
        if h % a:
            raise ConfigError(f"hidden_size ({h}) must be divisible by num_attention_heads ({a})")
        if a % t:
            raise ConfigError(f"num_attention_heads ({a}) must be divisible by tensor_parallel ({t})")
        if kv < 1 or a % kv:
            raise ConfigError(f"num_attention_heads ({a}) must be divisible by num_kv_heads ({kv})")
        if kv % t and t % kv:
            raise ConfigError(f"num_kv_heads ({kv}) and tensor_parallel ({t}) must divide one another")
        if self.ffn_hidden_size % t:
            raise ConfigError(f"ffn_hidden_size ({self.ffn_hidden_size}) must be divisible by tensor_parallel ({t})")
        if self.sequence_parallel and self.seq_length % (t * self.context_parallel):
            raise ConfigError(f"seq_length ({self.seq_length}) must be divisible by tensor_parallel ({t}) x "
                              f"context_parallel ({self.context_parallel})")
        if self.seq_length % self.context_parallel:
            raise ConfigError(f"seq_length ({self.seq_length}) must be divisible by context_parallel "
                              f"({self.context_parallel})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def qkv_width(self) -> int:
        """Output width of the fused QKV projection on one rank (K/V heads replicated if kv < t)."""
        kv_per_rank = max(1, self.num_kv_heads // self.tensor_parallel)
        return (self.num_attention_heads // self.tensor_parallel + 2 * kv_per_rank) * self.head_dim


@dataclass(frozen=True)
class Op:
    """One operation of a rank's sequence: compute (matmul/attention/elementwise) or a TP collective."""

    name: str
    kind: str
    flops: float = 0.0
    bytes_moved: float = 0.0
    collective: str | None = None
    size_bytes: int = 0
    group: str = "tp"  # the process group of a comm op: "tp" (tensor) or "cp" (context)
    overlap: bool = False  # a comm op run beside the next compute op, waited for after it


def mem_op(name: str, bytes_moved: float) -> Op:
    return Op(name, "elementwise", bytes_moved=float(bytes_moved))


def qkvo_elements(shape: LayerShape) -> tuple[int, int]:
    """(Q or O elements of this rank's tokens, K or V elements a rank's queries read: the whole
    sequence's under context parallelism) for this tensor rank's heads."""
    n = shape.micro_batch_size * shape.seq_length // shape.context_parallel
    kv_heads = max(1, shape.num_kv_heads // shape.tensor_parallel)
    q = n * (shape.num_attention_heads // shape.tensor_parallel) * shape.head_dim
    kv = shape.micro_batch_size * shape.seq_length * kv_heads * shape.head_dim
    return q, kv
