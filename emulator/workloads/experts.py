"""Mixture of experts and expert parallelism (Megatron-Core's MoE layer, ``alltoall`` dispatcher).

    emulator run configs/runs/mixtral-8x7b-ep8-64gpu.yaml     # Mixtral 8x7B, EP 8 on 64 H100s

The one description of the technique that the layer op lists (layer_costs.py), the memory model
(memory.py, tensor_parallel.activation_bytes_per_layer), the program and the estimate share.
In a MoE layer the MLP is ``E`` expert MLPs (``model.num_experts``, hidden size
``moe_ffn_hidden_size``) and ``moe_shared_experts`` shared ones. Per layer and microbatch a rank:

- routes its ``n`` tokens (``b*s/c``, over ``t`` under sequence parallelism): a router GEMM
  ``n x h x E`` and a top-k, each token to ``k`` experts (``moe_top_k``);
- dispatches them to the ranks holding those experts: an all-to-all over the expert-parallel group
  (``parallel.expert`` ranks) of ``n * k * h`` elements; with expert tensor parallelism
  (``parallel.expert_tensor`` > 1) the tokens are then all-gathered over the expert-tensor group,
  and the experts' outputs reduce-scattered back;
- runs its ``E / ep`` experts on the tokens they received, ``n * k * etp * load`` of them (the
  experts' GEMMs split over ``etp``), ``load`` being this rank's share (below);
- combines the outputs with a second all-to-all of the same size; backward runs the same
  collectives in reverse order with twice the expert GEMMs (input and weight gradients).

Routing imbalance (``training.moe_imbalance``): each expert-parallel rank's share of the tokens is
a seeded lognormal draw, normalised to a mean of 1; a rank with more tokens computes longer and
the others wait for it in the combine all-to-all. A capacity factor (``moe_capacity_factor``) caps
a rank's share at that multiple of the mean (tokens over it are dropped, as GShard does).

The weights: experts are split over ``ep`` x ``etp`` ranks, so their gradients are reduced (and
ZeRO 1-2 partition them) over the expert-data-parallel group: the stage's ``t * c * d`` ranks over
``ep * etp`` (layout.expert_data_group).

What this leaves out: the all-to-all carries every rank's mean share (the engine's collectives
have one size for all members; imbalance shows in the expert compute only), experts within a rank
are one grouped GEMM, the capacity factor applies to a rank's experts together, token dropping
and auxiliary losses change no other work, and DeepSeek-style node-limited routing is not modelled.
"""

from __future__ import annotations

import numpy as np


def expert_loads(expert: int, imbalance: float, seed: int) -> tuple[float, ...]:
    """Each expert-parallel rank's share of the routed tokens (mean 1): seeded lognormal(0,
    ``imbalance``) draws normalised to their mean; all 1 when ``imbalance`` is 0."""
    if imbalance <= 0 or expert == 1:
        return (1.0,) * expert
    draws = np.random.default_rng(seed).lognormal(0.0, imbalance, expert)
    return tuple(float(x) for x in draws * expert / draws.sum())


def processed_load(load: float, capacity_factor: float | None) -> float:
    """The share of tokens a rank's experts process: its load, capped by the capacity factor."""
    return load if capacity_factor is None else min(load, capacity_factor)


def config_loads(config) -> tuple[float, ...]:
    """The processed share of each expert-parallel index of a run (1.0 each for a dense model)."""
    m, p, t = config.model, config.parallel, config.training
    if not m.experts:
        return (1.0,)
    loads = expert_loads(p.expert, t.moe_imbalance, t.seed)
    return tuple(processed_load(x, m.moe_capacity_factor) for x in loads)


def dispatch_bytes(shape) -> int:
    """The dispatch (and combine) all-to-all of one MoE layer on one rank (layer_costs.LayerShape):
    its tokens, ``moe_top_k`` copies each, of ``h`` elements (nccl-tests' size: the send buffer)."""
    return tokens_in(shape) * shape.moe_top_k * shape.hidden_size * shape.bytes_per_element


def tokens_in(shape) -> int:
    """Tokens entering a rank's MoE layer: ``b*s/c``, over ``t`` with sequence parallelism."""
    n = shape.micro_batch_size * shape.seq_length // shape.context_parallel
    return n // shape.tensor_parallel if shape.sequence_parallel else n


def expert_tokens(shape) -> float:
    """Tokens a rank's experts process: the routed copies it receives, gathered over the
    expert-tensor group, times its share."""
    return tokens_in(shape) * shape.moe_top_k * shape.expert_tensor * shape.expert_load


def expert_fc1_width(shape) -> int:
    """The first expert GEMM's output width on one rank (gated MLPs: two halves)."""
    f = shape.moe_ffn_hidden_size // shape.expert_tensor
    return 2 * f if shape.gated_mlp else f


def expert_params_per_rank(shape) -> int:
    """Weights of the routed experts one rank holds in one layer: ``E / ep`` experts, split ``etp``."""
    if not shape.num_experts:
        return 0
    h, f = shape.hidden_size, shape.moe_ffn_hidden_size // shape.expert_tensor
    per_expert = h * expert_fc1_width(shape) + f * h
    return shape.num_experts // shape.expert_parallel * per_expert


def dense_mlp_activation_terms(model) -> float:
    """A dense MLP's intermediates per layer in ``s*b*h`` bytes (16-bit): fc1's output (both halves
    under SwiGLU) and fc2's input; 16 for GPT's 4h GeLU MLP (Korthikanti et al. 2022, Table 2).
    Part of tensor_parallel.activation_terms, and what a MoE layer keeps instead."""
    width = model.ffn_size / model.hidden_size
    return 2 * width * (2 if model.swiglu else 1) + 2 * width


def moe_activation_delta(config, sbh: float) -> float:
    """A MoE layer's activations (16-bit bytes per rank and microbatch) less the dense MLP's that
    the layer's Table 2 terms count (:func:`dense_mlp_activation_terms`: ``16*s*b*h/t`` for
    a 4h GeLU MLP, fc1's outputs and fc2's input): per routed token
    copy its permuted input (2h bytes) and its expert's intermediate activations (2 bytes of fc1's
    output and of fc2's input per element, over the expert tensor group), for the tokens of the
    busiest rank; plus the shared experts' intermediate activations over ``t``. ``sbh``: this
    rank's tokens (``s/c * b``) times ``h``."""
    m, p = config.model, config.parallel
    etp = p.expert_tensor or p.tensor
    n = sbh / m.hidden_size  # this rank's tokens
    tokens_in = n / p.tensor if p.sequence_parallel and p.tensor > 1 else n
    tokens = tokens_in * m.moe_top_k * etp * max(config_loads(config))
    f = m.moe_ffn_size // etp
    fc1 = 2 * f if m.swiglu else f
    routed = tokens * 2 * (m.hidden_size + fc1 + f)
    shared_f = m.moe_shared_experts * m.moe_ffn_size // p.tensor
    shared = n * 2 * ((2 * shared_f if m.swiglu else shared_f) + shared_f)
    return routed + shared - dense_mlp_activation_terms(m) * sbh / p.tensor
