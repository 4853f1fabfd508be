"""What goes wrong during a run: slow GPUs (stragglers), kernel jitter, degraded links.

    emulator run configs/runs/bloom-560m-straggler.yaml     # rank 5 at half speed

The ``faults:`` section of a run file (emulator/config/schema.py, ``FaultsConfig``) is applied in
two places, each the single place the quantity is decided:

- compute: :class:`ComputeFaults` gives every kernel its duration when the shard launches it
  (``Shard.launch``): nominal x jitter / (product of the slow-GPU factors of the whole run). A
  slow GPU with a time window needs the kernel's start, known only when it starts: the shard then
  lengthens that kernel (:meth:`ComputeFaults.window_factor`). The lookahead
  (emulator/engine/lookahead.py) bounds starts with the launch-time duration, which is never
  longer than the charged one, so its bounds stay lower bounds.
- links: the link model (netmodel/links.py) is the one place degraded links (for the whole run
  or a time window) and failed links act, on every engine path.
- failures (``fail``): :class:`Failures`, one map of failed ranks and links with their times, the
  same on every shard. From its failure time on, a failed GPU processes no event, and a message
  whose route holds a link that is down when it is sent (or goes down before it is delivered) is
  lost (netmodel/links.py): the sender's operation never ends and the receiver never gets it
  (the intra-node closed form loses the whole call when a port of the group is down before its
  end). Ranks that need what was lost block; when the run has nothing left to do,
  emulator/engine/diagnose.py reports the hang as a :class:`~emulator.errors.FailureError` at the
  time the collective timeout fires. Losing messages and events only removes sends, so the
  lookahead's lower bounds stay lower bounds. A failure runs collectives on the Python reference
  path (the compiled core keeps no failure state; the results are the same bit for bit, the run
  slower) and turns symmetry folding off (a failed rail tells tensor peers apart).

Jitter is deterministic whatever the shards or backend: each rank draws from its own generator,
seeded by ``(seed, rank)``, in fixed blocks, one factor per compute kernel in the rank's launch
order (a rank's launch order does not depend on how the ranks are sharded). In the built-in
training workload a "kernel" is a fused compute segment (emulator/workloads/segments.py).

Symmetry folding (emulator/engine/folding.py) assumes the ranks of a tensor group behave alike, so
any fault that tells them apart turns it off (:func:`breaks_symmetry`).
"""

from __future__ import annotations

import numpy as np

JITTER_BLOCK = 1024  # factors drawn at a time: fixed, so that a rank's k-th kernel always gets the same


def node_ranks(topo, node: int) -> range:
    first = topo.node_first_rank[node]
    return range(first, first + topo.node_gpus[node])


def target_ranks(fault, topo) -> list[int]:
    """The ranks a slow-GPU or jitter entry applies to (every rank when it names none)."""
    if fault.ranks is not None:
        return sorted(fault.ranks)
    if fault.nodes is not None:
        return [r for node in sorted(fault.nodes) for r in node_ranks(topo, node)]
    return list(range(topo.world_size))


def breaks_symmetry(faults, scale_up: frozenset[str]) -> bool:
    """Whether the faults make ranks of a tensor group differ: slow GPUs, jitter, or slow links
    other than whole tiers (a tier slows every rail alike); or a time window on a scale-up tier
    (``scale_up``: their names), which sends one-node groups down the message-level path
    (Shard._even_ports), where a folded tensor group cannot go."""
    if faults is None or not faults.active:
        return False
    jitter = faults.jitter is not None and faults.jitter.sigma > 0
    windowed = any(f.tier in scale_up and (f.start_s is not None or f.end_s is not None) for f in faults.slow_link)
    return bool(faults.slow_gpu or faults.fail) or jitter or windowed or any(f.tier is None for f in faults.slow_link)


class _Jitter:
    """One rank's stream of lognormal factors."""

    __slots__ = ("rng", "sigma", "block", "at")

    def __init__(self, seed: int, rank: int, sigma: float):
        self.rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, rank])))
        self.sigma = sigma
        self.block: list[float] = []
        self.at = 0

    def next(self) -> float:
        if self.at == len(self.block):
            self.block = self.rng.lognormal(0.0, self.sigma, JITTER_BLOCK).tolist()
            self.at = 0
        self.at += 1
        return self.block[self.at - 1]


class ComputeFaults:
    """The compute faults of the ranks one shard hosts; :meth:`for_faults` gives None when none."""

    def __init__(self, static: dict[int, float], windows: dict[int, list], jitter: dict[int, _Jitter]):
        self.static = static  # rank -> factor for the whole run (product of its entries)
        self.windows = windows  # rank -> [(start_ns, end_ns, factor)]
        self.jitter = jitter  # rank -> its generator
        self.ranks = set(static) | set(windows) | set(jitter)

    @classmethod
    def for_faults(cls, faults, topo, ranks) -> ComputeFaults | None:
        """``faults``: the run's faults section (``EngineSettings.faults``), or None."""
        if faults is None or not faults.active:
            return None
        hosted = set(ranks)
        static: dict[int, float] = {}
        windows: dict[int, list] = {}
        for fault in faults.slow_gpu:
            for rank in target_ranks(fault, topo):
                if rank not in hosted:
                    continue
                if fault.windowed:
                    start = round((fault.start_s or 0.0) * 1e9)
                    end = round(fault.end_s * 1e9) if fault.end_s is not None else None
                    windows.setdefault(rank, []).append((start, end, fault.factor))
                else:
                    static[rank] = static.get(rank, 1.0) * fault.factor
        jitter: dict[int, _Jitter] = {}
        if faults.jitter is not None and faults.jitter.sigma > 0:
            for rank in target_ranks(faults.jitter, topo):
                if rank in hosted:
                    jitter[rank] = _Jitter(faults.seed, rank, faults.jitter.sigma)
        if not (static or windows or jitter):
            return None
        return cls(static, windows, jitter)

    def launch_ns(self, rank: int, nominal_ns: int) -> int:
        """A kernel's duration as launched: nominal x jitter / the whole-run slowdown."""
        duration = nominal_ns
        jitter = self.jitter.get(rank)
        if jitter is not None:
            duration = round(duration * jitter.next())
        factor = self.static.get(rank)
        if factor is not None:
            duration = round(duration / factor)
        return duration

    def window_factor(self, rank: int, start_ns: int) -> float:
        """The product of the windowed slowdowns of ``rank`` whose window holds ``start_ns``."""
        factor = 1.0
        for start, end, f in self.windows.get(rank, ()):
            if start <= start_ns and (end is None or start_ns < end):
                factor *= f
        return factor


def node_links(topo, node: int) -> list[int]:
    """Every link a node owns: its GPUs' scale-up ports, its NICs and their uplink shares."""
    links = [link for rank in node_ranks(topo, node) for link in (topo.su_tx[rank], topo.su_rx[rank])]
    for nic in range(len(topo.nic_tx[node])):
        links += [topo.nic_tx[node][nic], topo.nic_rx[node][nic], *topo.up[node][nic], *topo.down[node][nic]]
    return links


class Failures:
    """The failed ranks and links of a run (``faults.fail``) and when each goes down; every shard
    holds the whole map (a route's links belong to two nodes, possibly on two shards)."""

    def __init__(self, entries: list[tuple[str, int, list[int], list[int]]], timeout_ns: int):
        self.entries = entries  # (what failed, at_ns, its ranks, its links), in config order
        self.timeout_ns = timeout_ns
        self.rank_ns: dict[int, int] = {}  # rank -> when it went down (the earliest entry)
        self.link_ns: dict[int, int] = {}
        for _, at_ns, ranks, links in entries:
            for rank in ranks:
                self.rank_ns[rank] = min(at_ns, self.rank_ns.get(rank, at_ns))
            for link in links:
                self.link_ns[link] = min(at_ns, self.link_ns.get(link, at_ns))
        self.first_ns = min(at_ns for _, at_ns, _, _ in entries)

    @classmethod
    def for_faults(cls, faults, topo) -> Failures | None:
        """The failures of a run's ``faults`` section, or None when it has none."""
        if faults is None or not faults.fail:
            return None
        entries = []
        for fault in faults.fail:
            at_ns = round(fault.at_s * 1e9)
            if fault.node is not None:
                ranks = list(node_ranks(topo, fault.node))
                entries.append((f"node {fault.node}", at_ns, ranks, node_links(topo, fault.node)))
            elif fault.nic is not None:
                node, nic = fault.nic.node, fault.nic.index
                links = [topo.nic_tx[node][nic], topo.nic_rx[node][nic], *topo.up[node][nic], *topo.down[node][nic]]
                entries.append((f"NIC {nic} of node {node}", at_ns, [], links))
            else:
                link = topo.link_name.index(fault.link)  # checked against the cluster when loaded
                entries.append((f"link {fault.link}", at_ns, [], [link]))
        return cls(entries, round(faults.collective_timeout_s * 1e9))

    def report(self) -> dict:
        """Plain data for the hang report (emulator/engine/diagnose.py), the same on every shard."""
        return {
            "what": [[what, at_ns] for what, at_ns, _, _ in self.entries],
            "timeout_ns": self.timeout_ns,
            "first_ns": self.first_ns,
        }


def applied_faults(faults, topo) -> dict | None:
    """``summary.json``'s ``faults``: every entry resolved to ranks and links; None without faults."""
    if faults is None or not faults.active:
        return None
    out: dict = {"seed": faults.seed}
    if faults.slow_gpu:
        out["slow_gpu"] = [
            {"ranks": target_ranks(f, topo), "factor": f.factor, "start_s": f.start_s, "end_s": f.end_s}
            for f in faults.slow_gpu
        ]
    if faults.jitter is not None and faults.jitter.sigma > 0:
        j = faults.jitter
        ranks = target_ranks(j, topo)
        out["jitter"] = {"sigma": j.sigma, "ranks": "all" if len(ranks) == topo.world_size else ranks}
    if faults.slow_link:
        out["slow_link"] = [
            {
                "links": [topo.link_name[i] for i in a["links"]],
                "factor": a["factor"],
                "start_s": a["start_s"],
                "end_s": a["end_s"],
            }
            for a in topo.slow_links
        ]
    failures = Failures.for_faults(faults, topo)
    if failures is not None:
        out["fail"] = [
            {"what": what, "at_s": at_ns / 1e9, "ranks": ranks, "links_down": len(links)}
            for what, at_ns, ranks, links in failures.entries
        ]
        out["collective_timeout_s"] = faults.collective_timeout_s
    return out


MAX_STRAGGLERS_SHOWN = 20  # summary.json lists the worst; ranks.csv has every rank's compute_slowdown


def stragglers(result, limit: int = MAX_STRAGGLERS_SHOWN) -> list[dict]:
    """Ranks whose compute was slowed: ``rank, node, compute_ns`` charged, ``nominal_compute_ns``,
    ``lost_ns`` (the difference) and ``slowdown`` (charged / nominal), most time lost first, at
    most ``limit`` of them."""
    rows = []
    for r in result.ranks:
        nominal = r.nominal_compute_ns
        if nominal is None or r.compute_ns <= nominal:
            continue
        rows.append({
            "rank": r.rank, "node": r.node, "compute_ns": r.compute_ns, "nominal_compute_ns": nominal,
            "lost_ns": r.compute_ns - nominal, "slowdown": r.compute_ns / nominal if nominal else None,
        })  # fmt: skip
    return sorted(rows, key=lambda row: (-row["lost_ns"], row["rank"]))[:limit]
