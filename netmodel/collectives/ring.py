"""Ring algorithms (NCCL's default for bandwidth): all-reduce, reduce-scatter, all-gather, and
pipelined chains for broadcast and reduce.

An all-reduce of S bytes over n members takes 2(n-1) steps of S/n bytes: an uncontended ring on
one tier costs ``2(n-1) * (latency + S/(n*B))``. When the group spans several nodes with several
members each, the data is split over C rings (channels) that enter each node at a different GPU, so
the node-crossing edges use C different NICs: this is how NCCL reaches the node's aggregate NIC
bandwidth (published.yaml: 192 GB/s busbw on DGX A100 with 8x HDR).
"""

from __future__ import annotations

from netmodel.collectives.base import CollectiveCall, Segment, SegmentAlgorithm, ceil_div, per_group

MAX_CHANNELS = 16
PIPELINE_CHUNK_BYTES = 4 << 20  # chain pipelining granularity for broadcast/reduce
MAX_PIPELINE_CHUNKS = 16


def channel_orders(call: CollectiveCall, topo) -> list[tuple[int, ...]]:
    """Ring orders, one per channel: the group order, rotated inside each node per channel."""
    return [order for order, _ in per_group("ring", call.ranks, topo, _orders)]


def _orders(ranks: tuple[int, ...], topo) -> list[tuple[tuple[int, ...], dict[int, int]]]:
    """Each channel's order with every member's position in it."""
    return [(order, {r: i for i, r in enumerate(order)}) for order in _channel_orders(ranks, topo)]


def _channel_orders(ranks: tuple[int, ...], topo) -> list[tuple[int, ...]]:
    runs: list[list[int]] = []
    for rank in ranks:
        node = topo.rank_node[rank]
        if runs and topo.rank_node[runs[-1][0]] == node:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    nodes = [topo.rank_node[r[0]] for r in runs]
    per_node = min(len(r) for r in runs)
    if len(runs) == 1 or len(set(nodes)) != len(nodes) or per_node == 1:
        return [ranks]
    nics = min(len(topo.nic_tx[node]) for node in nodes)
    count = max(1, min(nics, per_node, MAX_CHANNELS))
    return [tuple(r for run in runs for r in run[c:] + run[:c]) for c in range(count)]


def ring_segments(order: tuple[int, ...], pos: int, chunk: int, steps: int, chan: int) -> list[Segment]:
    """``steps`` steps of sending ``chunk`` to the next member and receiving from the previous
    (``pos``: this member's position in ``order``)."""
    n = len(order)
    if n == 1 or steps == 0:
        return []
    return [(((order[(pos + 1) % n], chunk, chan),), ((order[(pos - 1) % n], chunk, chan),), steps)]


def pipeline_segments(fwd: tuple, back: tuple, chunks: int) -> list[Segment]:
    """Chunk j: received in step j, passed on (``fwd``) in step j+1; no ``back`` = the origin."""
    if not back:
        return [(fwd, (), chunks)] if fwd else []
    segments: list[Segment] = [((), back, 1)]
    if chunks > 1:
        segments.append((fwd, back, chunks - 1))
    if fwd:
        segments.append((fwd, (), 1))
    return segments


def _chain(order: tuple[int, ...], me: int, size: int, chan: int) -> list[Segment]:
    """Pipelined chain from order[0] to order[-1]: receive chunk j, forward it next step."""
    chunks = max(1, min(MAX_PIPELINE_CHUNKS, ceil_div(size, PIPELINE_CHUNK_BYTES)))
    chunk = ceil_div(size, chunks)
    pos = order.index(me)
    nxt = ((order[pos + 1], chunk, chan),) if pos + 1 < len(order) else ()
    prv = ((order[pos - 1], chunk, chan),) if pos > 0 else ()
    return pipeline_segments(nxt, prv, chunks)


class Ring(SegmentAlgorithm):
    name = "ring"
    ops = frozenset({"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"})

    def segments(self, call: CollectiveCall, topo) -> list[list[Segment]]:
        n = call.n
        if n == 1:
            return []
        me = call.ranks[call.index]
        orders = per_group("ring", call.ranks, topo, _orders)
        per_channel = ceil_div(call.size_bytes, len(orders))
        result = []
        for chan, (order, position) in enumerate(orders):
            if call.op in ("broadcast", "reduce"):
                root = call.ranks[call.root_index]
                at = order.index(root)
                chain = order[at:] + order[:at]
                if call.op == "reduce":
                    chain = chain[1:][::-1] + chain[:1]
                result.append(_chain(chain, me, per_channel, chan))
            else:
                steps = 2 * (n - 1) if call.op == "all_reduce" else n - 1
                result.append(ring_segments(order, position[me], ceil_div(per_channel, n), steps, chan))
        return result


RING = Ring()
