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


def stage_units(topo, config) -> list[list[int]]:
    """Runs of consecutive nodes that no pipeline-stage boundary (nor, with ``jobs``, job boundary)
    separates; one run per node without a model. A node holding ranks of two stages joins them
    into one unit; a node shared by two jobs is a unit of its own."""
    nodes = list(range(topo.num_nodes))
    key = _stage_key(topo, config)
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


def _pipeline_stage(config):
    """rank -> pipeline stage of the built-in workload (Megatron order: stages are blocks of
    ranks), or None where the run's ranks have no stages to keep together."""
    model = getattr(config, "model", None) if config is not None else None
    if model is None or getattr(config, "program", None) is not None or config.parallel.pipeline < 2:
        return None
    per_stage = config.parallel.tensor * config.parallel.data
    return lambda rank: rank // per_stage


def _stage_key(topo, config):
    """rank -> what the shards should keep together: its stage; with ``jobs``, (its job, its stage
    in the job), None for a GPU no job occupies. None when every node may stand alone."""
    jobs = getattr(config, "jobs", None) if config is not None else None
    if not jobs:
        stage = _pipeline_stage(config)
        return stage
    owner: dict[int, tuple] = {}
    for index, job in enumerate(jobs):
        stage = _pipeline_stage(job.run) or (lambda rank: 0)
        owner.update({rank: (index, stage(local)) for local, rank in enumerate(job.ranks)})
    return owner.get


def shard_layout(topo, shards: int, config=None) -> tuple[list[list[int]], list[int]]:
    """Ranks of each shard (whole nodes) and the shard of each rank."""
    units = stage_units(topo, config)
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
