"""Which nodes each shard hosts: whole nodes, contiguous, cut along pipeline stages where it can.

A shard boundary is where messages cross shards, and every cross-shard message costs rounds. For
the built-in workload, cutting between pipeline stages leaves only the stage-boundary sends to
cross (tensor groups live in one node; data-parallel groups in one stage), so the shards are
balanced over *units*: runs of nodes that no stage boundary separates. Several jobs on a cluster
(``jobs``) are cut between jobs and between each job's stages. With fewer units than shards (or no
model), the split falls back to whole nodes.
"""

from __future__ import annotations


def balanced_split(weights: list[int], parts: int) -> list[list[int]]:
    """Contiguous groups of item indices, ``parts`` of them (fewer when there are fewer items),
    each ending where the running total comes closest to its share of the whole."""
    parts = max(1, min(parts, len(weights)))
    total = sum(weights)
    groups, start, running = [], 0, 0
    for k in range(1, parts):
        target = total * k / parts
        end = start + 1  # at least one item per group, and leave one for each group still to come
        running += weights[start]
        while end < len(weights) - (parts - k) and abs(running + weights[end] - target) <= abs(running - target):
            running += weights[end]
            end += 1
        groups.append(list(range(start, end)))
        start = end
    groups.append(list(range(start, len(weights))))
    return groups


def stage_units(topo, settings) -> list[list[int]]:
    """Runs of consecutive nodes that no pipeline-stage boundary (nor, with jobs, job boundary)
    separates; one run per node without the built-in workload (or ``settings`` None). A node
    holding ranks of two stages joins them into one unit; a node shared by two jobs is a unit of
    its own."""
    nodes = list(range(topo.num_nodes))
    key = _stage_key(settings)
    if key is None:
        return [[n] for n in nodes]
    units: list[list[int]] = []
    for n in nodes:
        first = topo.node_first_rank[n]
        if units and key(first) == key(first - 1) and key(first) is not None:
            units[-1].append(n)  # the previous node ends inside this node's first stage
        else:
            units.append([n])
    return units


def _stage_key(settings):
    """rank -> what the shards should keep together: its pipeline stage (Megatron order: stages
    are blocks of ranks); with jobs, (its job, its stage in the job), None for a GPU no job
    occupies. None when every node may stand alone."""
    if settings is None:
        return None
    if settings.jobs:
        owner: dict[int, tuple] = {}
        for index, (ranks, per_stage) in enumerate(settings.jobs):
            owner.update({rank: (index, local // per_stage) for local, rank in enumerate(ranks)})
        return owner.get
    if not settings.builtin_workload or settings.pipeline < 2:
        return None
    per_stage = settings.tensor * settings.data
    return lambda rank: rank // per_stage


def shard_layout(topo, shards: int, settings=None) -> tuple[list[list[int]], list[int]]:
    """Ranks of each shard (whole nodes) and the shard of each rank; ``settings``: the run's
    EngineSettings (emulator/engine/settings.py), None to cut along nodes only."""
    units = stage_units(topo, settings)
    if len(units) < min(shards, topo.num_nodes):
        units = [[n] for n in range(topo.num_nodes)]  # more shards than stages: cut inside stages
    weights = [sum(topo.node_gpus[n] for n in unit) for unit in units]
    rank_shard = [0] * topo.world_size
    layout = []
    for index, group in enumerate(balanced_split(weights, shards)):
        ranks = [r for u in group for n in units[u] for r in range(topo.node_first_rank[n],
                                                                  topo.node_first_rank[n] + topo.node_gpus[n])]
        layout.append(ranks)
        for r in ranks:
            rank_shard[r] = index
    return layout, rank_shard
