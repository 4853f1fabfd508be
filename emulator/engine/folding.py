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
"""

from __future__ import annotations

import re

from emulator.engine.faults import breaks_symmetry
from netmodel.collectives import DEFAULTS
from netmodel.collectives.analytic import ANALYTIC


def fold_factor(settings, topo) -> int:
    """How many ranks one virtual GPU stands for in a run of ``settings`` (EngineSettings; 1: no
    folding). ``topo`` needs only its node ``groups``."""
    if not settings.fold_tensor_groups or not settings.fast_collectives:
        return 1
    if not settings.builtin_workload:
        return 1  # only the built-in workload is symmetric by construction
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


def replicate_links(topo, links: dict, nodes, fold: int) -> dict:
    """Copy the figures of rail 0 (the representative's) to rails 1..fold-1 of the same nodes."""
    out = dict(links)
    for node in nodes:
        base = rail_links(topo, node, 0)
        for rail in range(1, fold):
            for src, dst in zip(base, rail_links(topo, node, rail), strict=True):
                if src in links:
                    out[dst] = links[src]
    return out
