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
from operator import itemgetter

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


def _name_template(name: str, fold: int, groups: dict | None = None) -> tuple[str, list[int]] | None:
    """``name`` as a format string and the numbers that shift (``template.format(*[v + offset for v in
    values])`` is :func:`shift_name` for every ``offset > 0``), or None when it does not change. The
    same two patterns: a peer's digits and a group of representatives become slots; a group with
    other ranks is written back as :func:`shift_name` writes it (its ints by ``str``). The parts do
    not overlap (a peer's digits follow ``=``, a group's follow ``group[`` or a comma), so finding
    the groups before or after the peers are shifted finds the same ones. ``groups``: a cache of
    each group's text (its ranks, or its text written back) for the names of one trace and fold."""
    groups = {} if groups is None else groups
    spans = []  # (start, end, numbers that shift, or the text that replaces the span)
    if "=" in name:
        spans += [(m.start(2), m.end(2), [int(m.group(2))]) for m in _PEER.finditer(name)]
    if "group[" in name:
        for m in _GROUP.finditer(name):
            what = groups.get(m.group(1))
            if what is None:
                ranks = [int(r) for r in m.group(1).split(",")]
                what = groups[m.group(1)] = ranks if all(is_representative(r, fold) for r in ranks) \
                    else ",".join(map(str, ranks))  # fmt: skip
            spans.append((m.start(1), m.end(1), what))
    if not spans:
        return None
    spans.sort(key=lambda span: span[0])
    parts: list[str | int] = []  # the literal text between the spans and the spans' texts or slots, in order
    values: list[int] = []
    at = 0
    for start, end, what in spans:
        parts.append(name[at:start])
        if isinstance(what, str):
            parts.append(what)
        else:
            parts.append(len(what))  # a slot per number, filled by format
            values += what
        at = end
    parts.append(name[at:])
    if not values:  # nothing shifts: the name as shift_name rewrites it, the same for every offset
        text = "".join(parts)
        return None if text == name else (text, [])
    template = "".join(p.replace("{", "{{").replace("}", "}}") if isinstance(p, str) else ",".join(["{}"] * p)
                       for p in parts)  # fmt: skip
    return template, values


def replicate_trace(trace: list, offset: int, fold: int) -> list:
    """The representative's trace as rank ``rep + offset`` has it (:func:`replicate_traces`)."""
    return replicate_traces(trace, [offset], fold)[0]


def replicate_traces(trace: list, offsets: list[int], fold: int) -> list[list]:
    """The representative's trace as each rank ``rep + offset`` has it (offset 0: ``trace`` itself).

    Each distinct name is parsed once for every offset (:func:`_name_template`), and only the
    entries whose name shifts are new tuples: most names, a layer's kernels or a collective on the
    tensor group, do not shift at all, and those entries are the representative's tuples (the
    reference run's 7 folded peers of a traced representative took 0.25 s through
    :func:`shift_name` per name and offset and a tuple per entry)."""
    groups: dict = {}
    templates = {}
    for name in dict.fromkeys(map(itemgetter(1), trace)):
        template = _name_template(name, fold, groups)
        if template is not None:
            templates[name] = template
    # the entries whose name shifts; the others are the representative's own (immutable) tuples
    moved = [i for i, name in enumerate(map(itemgetter(1), trace)) if name in templates]
    out = []
    for offset in offsets:
        if offset == 0:
            out.append(trace)
            continue
        mapping = {name: template.format(*[v + offset for v in values]) if values else template
                   for name, (template, values) in templates.items()}  # fmt: skip
        replica = list(trace)
        for i in moved:
            stream, name, *rest = trace[i]
            replica[i] = (stream, mapping[name], *rest)
        out.append(replica)
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
