"""Aggregating the shards' live figures into one snapshot of the run (pure Python, no Prometheus).

    PYTHONPATH=. python -m pytest -q tests/emulator/monitoring/test_live_state.py

The round protocol hands the observer one ``Shard.live_stats()`` dict per shard about every 0.5 s
of wall time; :class:`LiveState` sums them, remembers what it needs across observations (recent
speed, iteration ends) and derives the figures users watch: speed, progress, ETA, MFU, tokens/s,
utilisation and queueing per tier, and what faults cost so far (stragglers, degraded links).

Progress. For a model run, the work plan (emulator/monitoring/plan.py) says how much compute every
rank is charged per iteration; the run's progress is the compute charged so far over that total
times ``training.iterations``, so it moves within an iteration (every shipped run does one). For a
user program, progress counts iterations: ranks past ``mark_iteration()`` over
``program_args.iterations`` (unknown, NaN, without it).

ETA. Once iteration ``k`` has completed, the mean *virtual* duration of an iteration is
``end_k / (k + 1)`` and the run should end at ``expected_iterations`` times that; before, a model
run should end at ``virtual time / progress``. The ETA is the remaining virtual time divided by the
recent emulation speed (virtual seconds per wall second over the last ``speed_window_s``). While a
shard compiles the collective kernels, the speed window restarts when the compile is over, so that
the compile's wall time does not read as a slow emulation.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from emulator.monitoring.plan import WorkPlan

RUN_STATUSES = ("running", "completed", "failed", "interrupted")
NAN = float("nan")


@dataclass(frozen=True)
class Snapshot:
    """Everything the exporter and the progress bar show, at one instant; times in seconds."""

    wall_s: float = 0.0
    virtual_time_s: float = 0.0
    rounds: int = 0
    cross_shard_messages: int = 0
    finished: bool = False
    iterations_done: int = 0
    iterations_expected: float = NAN  # NaN when unknown
    iteration_progress: float = 0.0  # of the current iteration, 0..1
    run_progress: float = NAN  # of the whole run, 0..1, NaN when unknown
    speed_ratio: float = NAN  # virtual seconds per wall second, recent
    mean_speed_ratio: float = NAN  # since the start
    eta_s: float = NAN
    round_duration_s: float = NAN  # wall seconds per round, recent
    ranks: int = 0
    ranks_finished: int = 0
    shard_events: tuple[int, ...] = ()
    shard_virtual_time_s: tuple[float, ...] = ()
    tier_bytes: tuple[int, ...] = ()
    tier_messages: tuple[int, ...] = ()
    tier_busy_s: tuple[float, ...] = ()
    tier_utilisation: tuple[float, ...] = ()  # recent
    tier_mean_utilisation: tuple[float, ...] = ()  # since the start (the summary's definition)
    tier_bandwidth_bytes_per_s: tuple[float, ...] = ()  # bytes per virtual second, recent
    tier_size_hist: tuple[dict[int, int], ...] = ()  # bucket b: sizes in (2^(b-1), 2^b]
    iteration_durations_s: tuple[float, ...] = ()
    stage_ranks: tuple[int, ...] = ()
    stage_compute_s: tuple[float, ...] = ()  # mean per rank of the stage
    stage_comm_s: tuple[float, ...] = ()
    stage_idle_s: tuple[float, ...] = ()
    stage_peak_memory_bytes: tuple[int, ...] = ()
    # the busiest links of each tier: (link, bytes, busy_s, utilisation, queueing_s)
    hot_links: tuple[tuple[int, int, float, float, float], ...] = ()
    status: str = "running"  # one of RUN_STATUSES
    error: str = ""  # the one-line reason of a failed or interrupted run
    compiling: bool = False  # a shard is still loading or compiling the collective kernels
    mfu: float = NAN  # model FLOPs so far / (virtual time x peak); NaN for a user program
    tokens_per_s: float = NAN  # tokens per virtual second so far; NaN for a user program
    operations_done: int = 0
    operations_queued: int = 0  # launched, not completed
    tier_queueing_s: tuple[float, ...] = ()  # virtual time messages waited for a busy link
    tier_queued_messages: tuple[int, ...] = ()
    stage_memory_bytes: tuple[int, ...] = ()  # in use now, fullest rank of the stage
    stage_memory_ratio: tuple[float, ...] = ()  # in use now over capacity, fullest rank of the stage
    behind: tuple[tuple[int, float], ...] = ()  # (rank, virtual s of its latest op): furthest behind
    busiest: tuple[tuple[int, float], ...] = ()  # (rank, compute s): the most compute charged
    collectives: tuple[tuple[str, float, int], ...] = ()  # (kind, virtual s summed over members, calls)
    # faults (emulator/engine/faults.py): compute the GPU faults added so far, all ranks (jitter may subtract)
    compute_lost_s: float = 0.0
    # (rank, nominal over charged compute so far, compute s lost): the ranks slowed the most (5)
    stragglers: tuple[tuple[int, float, float], ...] = ()
    # per faults.slow_link entry: link busy time beyond what its bytes needed at nominal bandwidth
    slow_link_lost_s: tuple[float, ...] = ()


@dataclass
class LiveState:
    """Folds successive observations into :class:`Snapshot` objects."""

    tier_links: list[int]  # links per tier (the capacity behind utilisation)
    expected_iterations: int | None = None
    plan: WorkPlan | None = None  # a model run's work per iteration (emulator/monitoring/plan.py)
    speed_window_s: float = 10.0
    hot_links: int = 5  # per tier
    link_tier: list[int] = field(default_factory=list)  # tier of each link (to keep hot_links per tier)
    # (wall_s, virtual_ns, rounds, tier_busy, tier_bytes)
    _history: deque = field(default_factory=deque)
    _ends_ns: dict[int, int] = field(default_factory=dict)  # iteration -> virtual end, when known
    _virtual_ns: float = 0.0
    _compiling: bool = False

    def observe(self, wall_s: float, rounds: int, virtual_time_ns: float, shard_stats: list[dict],
                cross_shard_messages: int = 0, finished: bool = False) -> Snapshot:  # fmt: skip
        """Aggregate one observation; ``virtual_time_ns`` may be infinite at the end of a run."""
        stats = sorted(shard_stats, key=lambda s: s["shard"])
        now_ns = max((s["now_ns"] for s in stats), default=0)
        v_ns = virtual_time_ns if math.isfinite(virtual_time_ns) else now_ns
        self._virtual_ns = v_ns = max(self._virtual_ns, v_ns)  # never moves back on screen
        tiers = len(self.tier_links)
        tier_bytes = _sum_lists([s["tier_bytes"] for s in stats], tiers)
        tier_busy = _sum_lists([s.get("tier_busy_ns", [0] * tiers) for s in stats], tiers)
        compiling = any(s.get("compiling", False) for s in stats)
        if self._compiling and not compiling:  # the compile's wall time is not emulation speed
            self._history.clear()
        self._compiling = compiling
        self._history.append((wall_s, v_ns, rounds, tier_busy, tier_bytes))
        while len(self._history) > 2 and wall_s - self._history[1][0] >= self.speed_window_s:
            self._history.popleft()
        w0, v0, r0, busy0, bytes0 = self._history[0]
        dw, dv = wall_s - w0, v_ns - v0
        speed = dv / 1e9 / dw if dw > 0 else (v_ns / 1e9 / wall_s if wall_s > 0 else NAN)

        marks = {}
        for s in stats:
            for n, count in s.get("marks_hist", ()):
                marks[n] = marks.get(n, 0) + count
        ranks = sum(s["ranks"] for s in stats)
        done = min(marks, default=0)
        self._record_ends(stats, done)
        stage_ranks = _sum_lists([s.get("stage_ranks", []) for s in stats])
        stage_compute = _sum_lists([s.get("stage_compute_ns", []) for s in stats], len(stage_ranks))
        progress, run_progress, eta, mfu, tokens = self._progress(marks, ranks, done, v_ns, speed, stage_compute)
        if finished:
            run_progress, eta, progress = 1.0, 0.0, 0.0
        elif compiling:
            # the speed behind the ETA was measured while the engine waited for the kernels' first
            # compile (hours on the progress line of a first run): unknown until they are loaded
            eta = NAN

        links = self.tier_links
        hists = [s.get("tier_size_hist", [[]] * tiers) for s in stats]
        expected = self.expected_iterations
        return Snapshot(
            wall_s=wall_s,
            virtual_time_s=v_ns / 1e9,
            rounds=rounds,
            cross_shard_messages=cross_shard_messages,
            finished=finished,
            status="completed" if finished else "running",
            iterations_done=done,
            iterations_expected=float(expected) if expected else NAN,
            iteration_progress=progress,
            run_progress=run_progress,
            speed_ratio=speed,
            mean_speed_ratio=v_ns / 1e9 / wall_s if wall_s > 0 else NAN,
            eta_s=eta,
            round_duration_s=dw / (rounds - r0) if rounds > r0 else NAN,
            ranks=ranks,
            ranks_finished=sum(s["ranks_finished"] for s in stats),
            shard_events=tuple(s["events"] for s in stats),
            shard_virtual_time_s=tuple(s["now_ns"] / 1e9 for s in stats),
            tier_bytes=tuple(tier_bytes),
            tier_messages=tuple(_sum_lists([s["tier_messages"] for s in stats], tiers)),
            tier_busy_s=tuple(b / 1e9 for b in tier_busy),
            tier_utilisation=tuple(_ratio(b - b0, n * dv) for b, b0, n in zip(tier_busy, busy0, links, strict=True)),
            tier_mean_utilisation=tuple(_ratio(b, n * v_ns) for b, n in zip(tier_busy, links, strict=True)),
            tier_bandwidth_bytes_per_s=tuple(
                _ratio(b - b0, dv / 1e9) for b, b0 in zip(tier_bytes, bytes0, strict=True)
            ),
            tier_size_hist=tuple(_merge_hists([h[t] for h in hists]) for t in range(tiers)),
            tier_queueing_s=tuple(q / 1e9 for q in _sum_lists([s.get("tier_queued_ns", []) for s in stats], tiers)),
            tier_queued_messages=tuple(_sum_lists([s.get("tier_queued_messages", []) for s in stats], tiers)),
            iteration_durations_s=self._durations(done),
            stage_ranks=tuple(stage_ranks),
            stage_compute_s=_per_rank([stage_compute], stage_ranks),
            stage_comm_s=_per_rank([s.get("stage_comm_ns", []) for s in stats], stage_ranks),
            stage_idle_s=_per_rank([s.get("stage_idle_ns", []) for s in stats], stage_ranks),
            stage_peak_memory_bytes=tuple(_max_lists([s.get("stage_peak_memory_bytes", []) for s in stats])),
            stage_memory_bytes=tuple(_max_lists([s.get("stage_memory_bytes", []) for s in stats])),
            stage_memory_ratio=tuple(_max_lists([s.get("stage_memory_ratio", []) for s in stats])),
            hot_links=self._hot_links(stats, v_ns),
            compiling=compiling,
            mfu=mfu,
            tokens_per_s=tokens,
            operations_done=sum(s.get("ops_done", 0) for s in stats),
            operations_queued=sum(s.get("ops_outstanding", 0) for s in stats),
            behind=_ranks(stats, "behind", most=False),
            busiest=_ranks(stats, "busiest", most=True),
            collectives=_collectives(stats),
            compute_lost_s=sum(s.get("compute_lost_ns", 0) for s in stats) / 1e9,
            stragglers=_stragglers(stats),
            slow_link_lost_s=_slow_link_lost(stats),
        )

    def _progress(self, marks: dict, ranks: int, done: int, v_ns: float, speed: float,
                  stage_compute: list[int]) -> tuple[float, float, float, float, float]:  # fmt: skip
        """``(iteration progress, run progress, ETA, MFU, tokens/s)`` (see the module docstring)."""
        expected, plan = self.expected_iterations, self.plan
        mean_iter_ns = self._ends_ns[done - 1] / done if done and (done - 1) in self._ends_ns else None
        run_progress = eta = mfu = tokens = NAN
        if plan is not None and plan.compute_ns:
            iterations = sum(stage_compute) / plan.compute_ns  # iterations' worth of compute charged
            progress = min(1.0, max(0.0, iterations - done))
            if expected:
                run_progress = min(1.0, iterations / expected)
            if v_ns > 0:
                mfu = iterations * plan.model_flops / (v_ns / 1e9) / plan.peak_flops_per_s
                tokens = iterations * plan.tokens / (v_ns / 1e9)
        elif mean_iter_ns:
            progress = min(1.0, max(0.0, (v_ns - self._ends_ns[done - 1]) / mean_iter_ns))
        else:  # no iteration has ended yet: the share of ranks through the current one
            progress = sum(c for n, c in marks.items() if n > done) / ranks if ranks else 0.0
        if expected and math.isnan(run_progress) and ranks:
            run_progress = min(1.0, (done + progress) / expected)
        end_ns = NAN
        if expected and mean_iter_ns:
            end_ns = expected * mean_iter_ns
            run_progress = min(1.0, v_ns / end_ns) if plan is None else run_progress
        elif plan is not None and run_progress > 0:
            end_ns = v_ns / run_progress
        if math.isfinite(end_ns) and speed > 0:
            eta = max(0.0, (end_ns - v_ns) / 1e9 / speed)
        return progress, run_progress, eta, mfu, tokens

    def _record_ends(self, stats: list[dict], done: int) -> None:
        """Iteration k ended when the last rank of any shard marked it; final once every rank has."""
        per_k: dict[int, list[int]] = {}
        for s in stats:
            for k, end in s.get("iteration_ends_ns", ()):
                per_k.setdefault(k, []).append(end)
        for k, ends in per_k.items():
            if k < done and len(ends) == len(stats):
                self._ends_ns[k] = max(ends)

    def _durations(self, done: int) -> tuple[float, ...]:
        """Virtual seconds of every completed iteration whose start and end were both seen."""
        ends = self._ends_ns
        return tuple(
            (ends[k] - (ends[k - 1] if k else 0)) / 1e9 for k in range(done) if k in ends and (k == 0 or k - 1 in ends)
        )

    def _hot_links(self, stats: list[dict], v_ns: float) -> tuple:
        """The ``hot_links`` busiest links of each tier: every shard reports its own busiest per tier
        and a link belongs to one shard, so these contain the run's busiest per tier."""
        links = sorted(
            (tuple(int(v) for v in entry) for s in stats for entry in s.get("hot_links", ())),
            key=lambda x: (-x[2], x[0]),
        )
        if self.link_tier:  # several shards: each sent its own busiest per tier
            kept: dict[int, int] = {}
            busiest = []
            for entry in links:
                tier = self.link_tier[entry[0]]
                if kept.get(tier, 0) < self.hot_links:
                    kept[tier] = kept.get(tier, 0) + 1
                    busiest.append(entry)
            links = busiest
        return tuple((link, nbytes, busy / 1e9, busy / v_ns if v_ns else 0.0, queued / 1e9)
                     for link, nbytes, busy, queued in links)  # fmt: skip


def _ranks(stats: list[dict], key: str, most: bool, count: int = 5) -> tuple[tuple[int, float], ...]:
    """The ``count`` ranks with the least (or most) ns among every shard's own ``[rank, ns]`` list."""
    pairs = sorted(((-ns if most else ns), r) for s in stats for r, ns in s.get(key, ()))[:count]
    return tuple((r, (-ns if most else ns) / 1e9) for ns, r in pairs)


def _collectives(stats: list[dict]) -> tuple[tuple[str, float, int], ...]:
    """(kind, virtual seconds summed over members, calls) per collective kind, all shards."""
    out: dict[str, list[int]] = {}
    for s in stats:
        for kind, (ns, calls) in s.get("collective_ns", {}).items():
            acc = out.setdefault(kind, [0, 0])
            acc[0] += ns
            acc[1] += calls
    return tuple((kind, ns / 1e9, calls) for kind, (ns, calls) in sorted(out.items()))


def _stragglers(stats: list[dict], count: int = 5) -> tuple[tuple[int, float, float], ...]:
    """The ``count`` ranks that lost the most compute to faults, from every shard's own list of
    ``[rank, compute ns, lost ns]``: ``(rank, nominal / charged compute, lost s)``."""
    rows = sorted((-lost, rank, compute) for s in stats for rank, compute, lost in s.get("stragglers", ()))[:count]
    return tuple((rank, _ratio(compute + neg_lost, compute), -neg_lost / 1e9) for neg_lost, rank, compute in rows)


def _slow_link_lost(stats: list[dict]) -> tuple[float, ...]:
    """Per slow-link entry: busy minus nominal serialisation time, summed over the shards (each
    link is reserved by one shard only), in seconds; never below 0 (the nominal time is rounded)."""
    per_shard = [s["slow_links"] for s in stats if s.get("slow_links")]
    if not per_shard:
        return ()
    busy = _sum_lists([[b for b, _ in entries] for entries in per_shard])
    nominal = _sum_lists([[n for _, n in entries] for entries in per_shard])
    return tuple(max(0, b - n) / 1e9 for b, n in zip(busy, nominal, strict=True))


def _ratio(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


def _sum_lists(lists: list, length: int = 0) -> list:
    out = [0] * max([length, *(len(x) for x in lists)])
    for values in lists:
        for i, v in enumerate(values):
            out[i] += v
    return out


def _max_lists(lists: list) -> list:
    out = [0] * max([0, *(len(x) for x in lists)])
    for values in lists:
        for i, v in enumerate(values):
            out[i] = max(out[i], v)
    return out


def _per_rank(lists: list, ranks: list[int]) -> tuple[float, ...]:
    """Summed ns per stage -> mean seconds per rank of the stage."""
    return tuple(_ratio(total / 1e9, n) for total, n in zip(_sum_lists(lists, len(ranks)), ranks, strict=True))


def _merge_hists(hists: list) -> dict[int, int]:
    out: dict[int, int] = {}
    for pairs in hists:
        for bucket, count in pairs:
            out[int(bucket)] = out.get(int(bucket), 0) + count
    return dict(sorted(out.items()))
