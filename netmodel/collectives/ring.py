"""Ring algorithms (NCCL's default for bandwidth): all-reduce, reduce-scatter, all-gather, and
pipelined chains for broadcast and reduce.

An all-reduce of S bytes over n members takes 2(n-1) steps of S/n bytes: an uncontended ring on
one tier costs ``2(n-1) * (latency + S/(n*B))``. When the group spans several nodes with several
members each, the data is split over C rings (channels) that enter each node at a different GPU, so
the node-crossing edges use C different NICs: this is how NCCL reaches the node's aggregate NIC
bandwidth (published.yaml: 192 GB/s busbw on DGX A100 with 8x HDR).
"""

from __future__ import annotations

from netmodel.collectives.base import Channel, CollectiveCall, ceil_div

MAX_CHANNELS = 16
PIPELINE_CHUNK_BYTES = 4 << 20  # chain pipelining granularity for broadcast/reduce
MAX_PIPELINE_CHUNKS = 16


def channel_orders(call: CollectiveCall, topo) -> list[tuple[int, ...]]:
    """Ring orders, one per channel: the group order, rotated inside each node per channel."""
    runs: list[list[int]] = []
    for rank in call.ranks:
        node = topo.rank_node[rank]
        if runs and topo.rank_node[runs[-1][0]] == node:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    nodes = [topo.rank_node[r[0]] for r in runs]
    per_node = min(len(r) for r in runs)
    if len(runs) == 1 or len(set(nodes)) != len(nodes) or per_node == 1:
        return [call.ranks]
    nics = min(len(topo.nic_tx[node]) for node in nodes)
    count = max(1, min(nics, per_node, MAX_CHANNELS))
    return [tuple(r for run in runs for r in run[c:] + run[:c]) for c in range(count)]


def _ring_steps(order: tuple[int, ...], me: int, chunk: int, steps: int, chan: int) -> Channel:
    n = len(order)
    pos = order.index(me)
    send = ((order[(pos + 1) % n], chunk, chan),)
    recv = ((order[(pos - 1) % n], chunk, chan),)
    for _ in range(steps):
        yield send, recv


def _chain_steps(order: tuple[int, ...], me: int, size: int, chan: int) -> Channel:
    """Pipelined chain from order[0] to order[-1]: receive chunk j, forward it next step."""
    chunks = max(1, min(MAX_PIPELINE_CHUNKS, ceil_div(size, PIPELINE_CHUNK_BYTES)))
    chunk = ceil_div(size, chunks)
    pos = order.index(me)
    nxt = ((order[pos + 1], chunk, chan),) if pos + 1 < len(order) else ()
    prv = ((order[pos - 1], chunk, chan),) if pos > 0 else ()
    if not prv:
        for _ in range(chunks):
            yield nxt, ()
        return
    yield (), prv
    for _ in range(chunks - 1):
        yield nxt, prv
    if nxt:
        yield nxt, ()


class Ring:
    name = "ring"
    ops = frozenset({"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"})

    def channels(self, call: CollectiveCall, topo) -> list[Channel]:
        n = call.n
        if n == 1:
            return []
        me = call.ranks[call.index]
        orders = channel_orders(call, topo)
        per_channel = ceil_div(call.size_bytes, len(orders))
        result = []
        for chan, order in enumerate(orders):
            if call.op in ("broadcast", "reduce"):
                root = call.ranks[call.root_index]
                at = order.index(root)
                chain = order[at:] + order[:at]
                if call.op == "reduce":
                    chain = chain[1:][::-1] + chain[:1]
                result.append(_chain_steps(chain, me, per_channel, chan))
            else:
                steps = 2 * (n - 1) if call.op == "all_reduce" else n - 1
                result.append(_ring_steps(order, me, ceil_div(per_channel, n), steps, chan))
        return result


RING = Ring()
