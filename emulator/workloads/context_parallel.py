"""Context parallelism: every sequence split over ``c`` ranks, attention's K/V exchanged among them.

    emulator run configs/runs/llama3-70b-cp-64gpu.yaml     # TP 4 x CP 2 x PP 4 on 64 H100s

The one description of the technique that the layer op lists (layer_costs.py), the memory model
(tensor_parallel.activation_bytes_per_layer) and the estimate share. Megatron-Core's context
parallelism (Transformer Engine's ``attention`` with ``cp_group``) and Llama 3's (Llama Team 2024,
section 3.3.2):

- Each rank of a context group holds ``s / c`` tokens of every sequence: all GEMMs, norms and
  elementwise work, and the activations kept for backward, divide by ``c``. The sequence is cut
  into ``2c`` chunks and rank ``i`` holds chunks ``i`` and ``2c-1-i``, so that under the causal mask
  every rank has the same share of attention work (load balancing): its ``s/c`` queries against the
  whole sequence's keys, half of it masked.
- Attention needs every rank's K and V: ``2 * b * s * g_t * d`` elements over the group, where
  ``g_t`` is the K/V heads of this tensor rank and ``d`` the head size (GQA shrinks it).
  ``context_algo: ring`` (Megatron-Core): the K/V chunks travel around the ring in ``c - 1`` steps,
  each overlapped with the attention block of the chunk at hand; in bytes and steps that is a ring
  all-gather of the group's K/V, run beside the attention kernel. Backward sends K/V around again
  and the K/V gradients back (a reduce-scatter of the same buffer), beside the attention backward.
  ``context_algo: all_gather`` (Llama 3): the K/V are all-gathered before the attention, exposed
  (small under GQA, Llama 3's reason), and the backward all-gathers them again and reduce-scatters
  their gradients, each waited for.
- The weights are the same on every rank of the group: gradients are reduced over data x context
  (layout.gradient_group).

Sizes are nccl-tests buffer sizes (the whole gathered buffer) as for every collective here.
"""

from __future__ import annotations

CONTEXT_ALGOS = ("ring", "all_gather")


def kv_gather_bytes(shape) -> int:
    """The K/V all-gather of one layer on one rank of ``shape`` (layer_costs.LayerShape): the K and
    V of the whole sequence for this tensor rank's K/V heads; 0 without context parallelism."""
    if shape.context_parallel == 1:
        return 0
    kv_heads = max(1, shape.num_kv_heads // shape.tensor_parallel)
    return 2 * shape.micro_batch_size * shape.seq_length * kv_heads * shape.head_dim * shape.bytes_per_element


def kv_bytes_sent_per_rank(shape, forward: bool = True) -> int:
    """Bytes one rank sends for one layer: ``(c-1)/c`` of the gathered K/V (a ring's ``c - 1`` steps
    of one chunk); backward twice that (K/V again, and their gradients)."""
    c = shape.context_parallel
    sent = kv_gather_bytes(shape) * (c - 1) // c
    return sent if forward else 2 * sent
