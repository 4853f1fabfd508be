"""Several jobs on one cluster: where each job's GPUs are, and the run config each job sees.

    emulator run configs/runs/two-jobs-shared-nics.yaml

A run file with ``jobs:`` (schema: :class:`emulator.config.schema.JobConfig`) runs every job in
one emulation on the shared ``cluster``. A job names where it runs, ``node_ids`` (whole nodes) or
``slots`` (``{node, first_gpu, gpus}`` each: parts of nodes), or asks for whole ``nodes`` or a
number of ``gpus`` on the nodes no job named, placed by the run's ``placement``:

- ``packed``: the jobs, in order, each on the next free GPUs in rank order (a job of whole nodes
  lands on whole nodes when the jobs before it do);
- ``spread``: every job on the same nodes (as few as hold them all), each node split into one
  contiguous block of GPUs per job, in job order: a job of ``G`` GPUs takes ``G / F`` GPUs of each
  of the ``F`` nodes. Jobs then share each node's NICs (GPU ``i`` uses NIC ``i % count``) and the
  NICs' uplink shares: in this network model every link belongs to one node
  (netmodel/topology.py), so that is where jobs meet; jobs on separate nodes never share a link.

A job's program sees its own ranks ``0..n-1`` (cluster ranks in rank order) and a cluster of its
own GPUs (:func:`job_cluster`): the nodes it has a share of, with its share's GPU count.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from emulator.config.typed import require

PLACEMENTS = ("packed", "spread")


@dataclass(frozen=True)
class Slots:
    """A job's GPUs on one node: ``gpus`` GPUs from the node's GPU ``first_gpu``."""

    node: int
    gpus: int
    first_gpu: int = 0

    def validate(self, path: str) -> None:
        from emulator.config import limits as lim
        from emulator.config.typed import require_range

        require_range(self, path, "node", 0, lim.MAX_NODES)
        require_range(self, path, "gpus", 1, lim.MAX_GPUS_PER_NODE)
        require_range(self, path, "first_gpu", 0, lim.MAX_GPUS_PER_NODE)


def node_sizes(cluster) -> list[tuple[int, int]]:
    """``(GPUs, node group index)`` of every node, in node order (no topology needed)."""
    return [(g.gpus_per_node, gi) for gi, g in enumerate(cluster.groups()) for _ in range(g.nodes)]


def place(cluster, jobs: list, policy: str) -> list[list[Slots]]:
    """The GPUs of every job (see the module docstring); ConfigError on overlap or over capacity."""
    sizes = node_sizes(cluster)
    placed: list[list[Slots] | None] = [None] * len(jobs)
    taken: dict[int, list[tuple[int, int, int]]] = {}  # node -> (first GPU, end, job) of explicit jobs
    for i, job in enumerate(jobs):
        key = "node_ids" if job.node_ids is not None else "slots" if job.slots is not None else None
        if key is None:
            continue
        for n in job.node_ids or [s.node for s in job.slots]:
            require(n < len(sizes), f"jobs[{i}].{key}: node {n} is not in the cluster (nodes 0..{len(sizes) - 1})")
        placed[i] = [Slots(n, sizes[n][0]) for n in job.node_ids] if key == "node_ids" else job.slots
        for s in placed[i]:
            end, gpus = s.first_gpu + s.gpus, sizes[s.node][0]
            require(end <= gpus, f"jobs[{i}].slots: node {s.node} has GPUs 0..{gpus - 1}, not {s.first_gpu}..{end - 1}")
            for first, other_end, other in taken.get(s.node, ()):
                require(
                    s.first_gpu >= other_end or end <= first,
                    f"jobs[{i}].{key}: GPUs {s.first_gpu}..{end - 1} of node {s.node} are already taken by job "
                    f"{jobs[other].name}",
                )
            taken.setdefault(s.node, []).append((s.first_gpu, end, i))
    free = [n for n in range(len(sizes)) if n not in taken]
    rest = [i for i in range(len(jobs)) if placed[i] is None]
    if rest:
        placer = _spread if policy == "spread" else _packed
        for i, slots in zip(rest, placer(jobs, rest, free, sizes), strict=True):
            placed[i] = slots
    return placed  # type: ignore[return-value]


def _no_room(i: int, jobs: list, rest: list[int], free: list[int], sizes: list[tuple[int, int]]) -> str:
    have = sum(sizes[n][0] for n in free)
    asked = ", ".join(f"{jobs[k].name}: " + (f"{jobs[k].nodes} nodes" if jobs[k].nodes is not None
                      else f"{jobs[k].gpus} GPUs") for k in rest)  # fmt: skip
    return (f"jobs[{i}] ({jobs[i].name}): no room left on the cluster: {len(free)} nodes ({have} GPUs) are "
            f"free for the jobs placed by policy ({asked})")  # fmt: skip


def _packed(jobs: list, rest: list[int], free: list[int], sizes: list[tuple[int, int]]) -> list[list[Slots]]:
    """Each job on the next free GPUs; a job of ``nodes`` starts on a node of its own."""
    out = []
    cursor, used = 0, 0  # index into ``free``, GPUs of that node already given
    for i in rest:
        job = jobs[i]
        slots: list[Slots] = []
        if job.nodes is not None:
            if used:
                cursor, used = cursor + 1, 0
            require(cursor + job.nodes <= len(free), _no_room(i, jobs, rest, free, sizes))
            slots = [Slots(n, sizes[n][0]) for n in free[cursor : cursor + job.nodes]]
            cursor += job.nodes
        else:
            need = job.gpus
            while need:
                require(cursor < len(free), _no_room(i, jobs, rest, free, sizes))
                n = free[cursor]
                take = min(need, sizes[n][0] - used)
                slots.append(Slots(n, take, used))
                need -= take
                used += take
                if used == sizes[n][0]:
                    cursor, used = cursor + 1, 0
        out.append(slots)
    return out


def _spread(jobs: list, rest: list[int], free: list[int], sizes: list[tuple[int, int]]) -> list[list[Slots]]:
    """Every job on the same ``F`` nodes, one block of each node per job (see the module docstring)."""
    per_node = {sizes[n][0] for n in free}
    require(len(per_node) <= 1, f"jobs: placement spread needs free nodes of one size, got {sorted(per_node)} GPUs")
    gpn = per_node.pop() if per_node else 1
    want = [jobs[i].nodes * gpn if jobs[i].nodes is not None else jobs[i].gpus for i in rest]
    nodes = -(-sum(want) // gpn)
    require(nodes <= len(free), _no_room(rest[-1], jobs, rest, free, sizes))
    out, offset = [], 0
    for i, size in zip(rest, want, strict=True):
        require(
            size % nodes == 0,
            f"jobs[{i}]: placement spread puts every job on {nodes} nodes; {jobs[i].name}'s {size} GPUs "
            f"are not a multiple of {nodes}",
        )
        share = size // nodes
        out.append([Slots(n, share, offset) for n in free[:nodes]])
        offset += share
    return out


def job_ranks(cluster, slots: list[Slots]) -> tuple[int, ...]:
    """The cluster ranks of a job's GPUs, in job-rank order."""
    first, rank = [], 0
    for gpus, _ in node_sizes(cluster):
        first.append(rank)
        rank += gpus
    return tuple(first[s.node] + s.first_gpu + g for s in slots for g in range(s.gpus))


def job_cluster(cluster, slots: list[Slots], name: str):
    """The cluster a job's program sees: a node per node it has GPUs on, with its share of GPUs
    (node groups of the shared cluster's kinds) and the shared tiers."""
    groups = cluster.groups()
    sizes = node_sizes(cluster)
    runs: list[list[int]] = []  # [group index, GPUs per node, nodes]
    for s in slots:
        key = [sizes[s.node][1], s.gpus]
        if runs and runs[-1][:2] == key:
            runs[-1][2] += 1
        else:
            runs.append([*key, 1])
    node_groups = [
        dataclasses.replace(groups[gi], name=f"{name}.{k}", nodes=nodes, gpus_per_node=gpus)
        for k, (gi, gpus, nodes) in enumerate(runs)
    ]
    return type(cluster)(name=f"{cluster.name}.{name}", node_groups=node_groups, tiers=cluster.tiers)


def check_agrees(job, index: int, cluster, ranks: tuple[int, ...]) -> None:
    """A job's own cluster (from its run file) must have the GPU types of the GPUs it gets: rank by
    rank when it has several node groups (then also as many GPUs), else every GPU of its type."""
    own = job.cluster
    if own is None:
        return
    where = f"jobs[{index}].cluster"
    types_of = [g.gpu for g in cluster.groups() for _ in range(g.nodes * g.gpus_per_node)]
    own_groups = own.groups()
    if len(own_groups) == 1:
        wanted = own_groups[0].gpu
        wrong = next((r for r in ranks if types_of[r] != wanted), None)
        require(wrong is None, f"{where}: the job's own cluster has {wanted} GPUs but it gets rank {wrong}, a "
                f"{types_of[wrong] if wrong is not None else ''}")  # fmt: skip
        return
    own_types = [g.gpu for g in own_groups for _ in range(g.nodes * g.gpus_per_node)]
    require(
        len(own_types) == len(ranks),
        f"{where}: the job's own cluster has {len(own_types)} GPUs but it gets {len(ranks)}",
    )
    for local, rank in enumerate(ranks):
        require(
            own_types[local] == types_of[rank],
            f"{where}: its rank {local} is a {own_types[local]} but it gets cluster rank {rank}, a {types_of[rank]}",
        )


def resolve_jobs(run) -> None:
    """Validate a run with ``jobs``: nothing to run at the top level, unique names, the placement,
    and every job's own run config (errors prefixed ``jobs[i] (name):``). Sets on each job
    ``placed`` (its Slots), ``ranks`` (its cluster ranks) and ``run`` (the RunConfig its program sees)."""
    from emulator.errors import ConfigError

    jobs = run.jobs
    require(jobs, "jobs: the list is empty")
    stray = [key for key in ("model", "program") if getattr(run, key) is not None]
    stray += [key for key in ("parallel", "training") if getattr(run, key) != type(getattr(run, key))()]
    stray += ["program_args"] if run.program_args else []
    require(
        not stray,
        f"{stray[0] if stray else ''}: a run with jobs gives model, parallel, training and program in each "
        f"job, not at the top level",
    )
    names = [job.name for job in jobs]
    twice = next((n for n in names if names.count(n) > 1), None)
    require(twice is None, f"jobs: two jobs are named {twice!r}; names must be unique")
    for i, slots in enumerate(place(run.cluster, jobs, run.placement)):
        job = jobs[i]
        ranks = job_ranks(run.cluster, slots)
        check_agrees(job, i, run.cluster, ranks)
        config = type(run)(name=f"{run.name}.{job.name}", cluster=job_cluster(run.cluster, slots, job.name),
                           model=job.model, parallel=job.parallel, training=job.training, program=job.program,
                           program_args=job.program_args, engine=run.engine)  # fmt: skip
        try:
            config.validate("")
        except ConfigError as exc:
            raise ConfigError(f"jobs[{i}] ({job.name}): {exc}") from None
        job.placed, job.ranks, job.run = slots, ranks, config
