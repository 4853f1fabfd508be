"""Closed-form collective times on one tier: the fast path for groups inside a node.

When every member of a group sits in one node, the shard that hosts the node can complete the
collective in one step: it waits for the last member, then finishes every member after the
closed-form time of the algorithm, reserving the members' scale-up ports for that long and
accounting the same bytes and message sizes as the message-level expansion. For a simultaneous
start without competing traffic this equals the message-level result within rounding (tested);
it differs only in how skewed starts and competing flows interleave. ``engine.fast_collectives:
none`` turns it off.
"""

from __future__ import annotations

from netmodel.collectives.base import CollectiveCall, ceil_div
from netmodel.collectives.ring import MAX_PIPELINE_CHUNKS, PIPELINE_CHUNK_BYTES

ANALYTIC = {
    ("ring", "all_reduce"), ("ring", "reduce_scatter"), ("ring", "all_gather"), ("ring", "broadcast"),
    ("ring", "reduce"), ("pairwise", "all_to_all"), ("dissemination", "barrier"),
}  # fmt: skip


def closed_form(algo: str, call: CollectiveCall, bw_bytes_per_ns: float, latency_ns: int) -> tuple[int, int, int]:
    """(duration_ns, messages sent by the whole group, bytes per message) of a call on one uniform tier."""
    n, size = call.n, call.size_bytes
    if n == 1:
        return 0, 0, 0
    op = call.op
    if op == "barrier":
        steps = (n - 1).bit_length()
        return steps * latency_ns, steps * n, 0
    if op in ("broadcast", "reduce"):
        chunks = max(1, min(MAX_PIPELINE_CHUNKS, ceil_div(size, PIPELINE_CHUNK_BYTES)))
        chunk = ceil_div(size, chunks)
        serialise = int(-(-chunk // bw_bytes_per_ns))
        # a pipelined chain: the first chunk crosses n-1 hops, the others follow one serialisation apart
        return (n - 1) * (latency_ns + serialise) + (chunks - 1) * serialise, chunks * (n - 1), chunk
    chunk = ceil_div(size, n)
    steps = 2 * (n - 1) if op == "all_reduce" else n - 1
    per_step = latency_ns + int(-(-chunk // bw_bytes_per_ns))
    return steps * per_step, steps * n, chunk
