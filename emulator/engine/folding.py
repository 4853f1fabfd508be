"""Symmetry folding: one virtual GPU stands for the whole tensor-parallel group of its node.

In the built-in training workload the ranks of a tensor-parallel group run the same program with
the same sizes at the same virtual times: they differ only in which NIC rail and which peers (the
same tensor index in other groups) they use. When every node is exactly one tensor group and has
one NIC per GPU, the rails of a node are independent (uplinks are per-NIC shares, see
netmodel/topology.py), so every rank of the group sees an identical, isolated copy of the same
traffic. The engine then runs only the group's first rank (the *representative*), completes the
group's intra-node collectives when the representative arrives, counts each representative
message as ``fold`` messages, and at the end replicates the representative's results to the other
ranks and its rail's link figures to the other rails. The results - every rank's times and
operation counts, every link's bytes and busy time, hence the fingerprint - are the same as
without folding (tested); the engine processes ``fold`` times fewer events.

``engine.fold_tensor_groups: false`` turns it off; so do faults that make the ranks of a group
differ (a slow GPU, jitter, a slow link other than a whole tier: emulator/engine/faults.py).

Node folding (a data-parallel program whose every GPU of a node runs the same stream: a replayed
PyTorch script, emulator/workloads/replay.py) also runs one GPU per node, rank ``n*G`` of each
node of ``G`` GPUs, for a different symmetry. The ring (netmodel/collectives/ring.py) over a group
of whole nodes has ``G`` channels, channel ``c`` entering each node at its GPU ``c``; rotating the
GPUs of every node by one (local ``l`` -> ``l+1 mod G``, call it s) maps the order of channel ``c``
onto that of channel ``c+1``, every GPU's links onto the next GPU's (each link has one owner: its
scale-up ports, its NIC rail ``l`` and that rail's uplink shares; routes keep their tier, latency
and bandwidths) and, when the GPUs of a node run the same program, the whole run onto itself. So
GPU ``l`` does on channel ``c`` what the representative does on channel ``c-l``, at the same
times. A message the representative sends to GPU ``l`` of a node is handed over as its image under
s^-l: to that node's representative, from GPU ``local - l`` of the sender's node, on channel
``chan - l`` (NetCore._delivered). Its event key ``(time, kind, rank, origin, seq)`` is the key of
the message the representative receives in the unfolded run: the sender's message counter is the
same for every GPU of its node. Why the order of events stays the reference order: the folded run
processes the unfolded run's events of the representatives, by the same keys; an event of a rank
touches only state that rank owns (its channels, mailbox, counters, and links only it uses: a
send reserves its sender's up-links, a hand-over its receiver's down-links), so the events of
the other ranks, wherever they fall among ties, cannot change what a representative's events do.
Ties between two events of one representative are ordered by fields that s preserves (a node's
senders keep their order; per-rank counters). The results of GPU ``l`` are the representative's,
its links' figures the representative's links' figures (replicate_links). Tested against the
unfolded run on fuzzed worlds (tests/emulator/engine/test_node_fold.py).

Node folding needs: the compiled collective engine (the Python reference path runs unfolded, as
the specification); one node type with as many NICs as GPUs (at most the ring's 16 channels) and
at least two nodes; the ring for all-reduce, reduce-scatter and all-gather on every switch tier;
no fault that breaks symmetry; and a program that says its node's GPUs run alike with only those
collectives, over groups of whole nodes in local order (``program.node_symmetric``).
"""

from __future__ import annotations

import re

from emulator.engine.faults import breaks_symmetry
from netmodel.collectives import DEFAULTS
from netmodel.collectives.analytic import ANALYTIC
from netmodel.collectives.ring import MAX_CHANNELS

RING_OPS = ("all_reduce", "reduce_scatter", "all_gather")  # the collectives node folding takes


def fold_factor(settings, topo, program=None, args=None) -> int:
    """How many ranks one virtual GPU stands for in a run of ``settings`` (EngineSettings; 1: no
    folding). ``topo`` needs only its node ``groups`` (and ``cluster`` for node folding);
    ``program`` and ``args``: the program every rank runs (node folding asks it)."""
    if not settings.fold_tensor_groups:
        return 1
    if not settings.builtin_workload:
        return node_fold_factor(settings, topo, program, args)
    if not settings.fast_collectives:
        return 1
    if breaks_symmetry(settings.faults, settings.scale_up_tiers):
        return 1  # the results must stay exact: a folded group would copy its representative's
    if settings.experts_break_symmetry:
        return 1
    tensor = settings.tensor
    if tensor < 2:
        return 1
    for group in topo.groups:
        if group.gpus_per_node != tensor or group.nic.count != tensor:
            return 1
        # a folded group must complete its tensor collectives in closed form (the representative
        # arrives alone): a message-level scale-up algorithm (tree, halving_doubling) would need its
        # peers, which folding does not host (it tripped an assertion in collective_run)
        for op in ("all_reduce", "reduce_scatter", "all_gather"):
            if ((group.scale_up.algorithms.get(op) or DEFAULTS[op]), op) not in ANALYTIC:
                return 1
    return tensor


def node_fold_factor(settings, topo, program, args) -> int:
    """``G`` (the GPUs of a node) where node folding is exact for this run, else 1 (see above)."""
    symmetric = getattr(program, "node_symmetric", None)
    if symmetric is None or settings.collective_engine != "compiled":
        return 1
    if breaks_symmetry(settings.faults, settings.scale_up_tiers):
        return 1
    groups = topo.groups
    if len(groups) != 1 or groups[0].nodes < 2:
        return 1
    gpus = groups[0].gpus_per_node
    if not 2 <= gpus <= MAX_CHANNELS or groups[0].nic.count != gpus:
        return 1
    for tier in topo.cluster.tiers:
        if any((tier.algorithms.get(op) or DEFAULTS[op]) != "ring" for op in RING_OPS):
            return 1
    return gpus if symmetric(args, gpus, RING_OPS) else 1


def folds_nodes(settings, fold: int) -> bool:
    """Whether a run folded by ``fold`` folds nodes (else tensor groups of the built-in workload)."""
    return fold > 1 and not settings.builtin_workload


def is_representative(rank: int, fold: int) -> bool:
    return rank % fold == 0


def rail_links(topo, node: int, rail: int) -> list[int]:
    """The links of one NIC rail of a node: NIC tx/rx and its uplink shares."""
    return [topo.nic_tx[node][rail], topo.nic_rx[node][rail], *topo.up[node][rail], *topo.down[node][rail]]


_PEER = re.compile(r"\b(dst|src)=(\d+)")
_GROUP = re.compile(r"group\[([\d,]+)(,\.\.\.)?\]")


def shift_name(name: str, offset: int, fold: int) -> str:
    """An op name of the representative as rank ``rep + offset`` would have it: peers and groups of
    representatives shift by ``offset``; the tensor group (shared by all) stays."""
    if offset == 0:
        return name
    if "=" in name:  # a peer can only be named "dst=" or "src=": most names (kernels) have neither
        name = _PEER.sub(lambda m: f"{m.group(1)}={int(m.group(2)) + offset}", name)
    if "group[" not in name:
        return name

    def group(m: re.Match) -> str:
        ranks = [int(r) for r in m.group(1).split(",")]
        if all(is_representative(r, fold) for r in ranks):
            ranks = [r + offset for r in ranks]
        return f"group[{','.join(map(str, ranks))}{m.group(2) or ''}]"

    return _GROUP.sub(group, name)


def replicate_trace(trace: list, offset: int, fold: int) -> list:
    """The representative's trace as rank ``rep + offset`` has it. A traced rank repeats few names
    (each layer's kernels carry the same name in a microbatch): each is shifted once."""
    shifted: dict[str, str] = {}
    out = []
    for stream, name, *rest in trace:
        new = shifted.get(name)
        if new is None:
            new = shifted[name] = shift_name(name, offset, fold)
        out.append((stream, new, *rest))
    return out


def replicate_links(topo, links: dict, nodes, fold: int, node_fold: bool = False) -> dict:
    """Copy the figures of rail 0 (the representative's) to rails 1..fold-1 of the same nodes, and
    under node folding its scale-up ports to the other GPUs' (tensor folding has them all: its
    node's collectives complete in closed form, charging every member's ports)."""
    out = dict(links)
    for node in nodes:
        if node_fold:
            rep = topo.node_first_rank[node]
            for src_links in (topo.su_tx, topo.su_rx):
                if src_links[rep] in links:
                    for local in range(1, fold):
                        out[src_links[rep + local]] = links[src_links[rep]]
        base = rail_links(topo, node, 0)
        for rail in range(1, fold):
            for src, dst in zip(base, rail_links(topo, node, rail), strict=True):
                if src in links:
                    out[dst] = links[src]
    return out
