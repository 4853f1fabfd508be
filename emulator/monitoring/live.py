"""Aggregating the shards' live figures into one snapshot of the run (pure Python, no Prometheus).

    PYTHONPATH=. python -m pytest -q tests/emulator/monitoring/test_live.py

The round protocol hands the observer one ``Shard.live_stats()`` dict per shard about every 0.5 s
of wall time; :class:`LiveState` sums them, remembers what it needs across observations (recent
speed, iteration ends) and derives the figures users watch: speed, iteration progress, ETA and
utilisation per tier.

How the ETA is estimated: once iteration ``k`` has completed, the mean *virtual* duration of an
iteration is ``end_k / (k + 1)``; the run is expected to end at ``expected_iterations`` times that
virtual duration, and the ETA is the remaining virtual time divided by the recent emulation speed
(virtual seconds per wall second over the last ``speed_window_s`` of wall time). The expected
iteration count is ``training.iterations`` for a model workload, else ``program_args.iterations``;
without it, or before the first iteration ends, the ETA is unknown (NaN).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

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
    hot_links: tuple[tuple[int, int, float, float], ...] = ()  # (link, bytes, busy_s, utilisation)


@dataclass
class LiveState:
    """Folds successive observations into :class:`Snapshot` objects."""

    tier_links: list[int]  # links per tier (the capacity behind utilisation)
    expected_iterations: int | None = None
    speed_window_s: float = 10.0
    hot_links: int = 10
    _history: deque = field(default_factory=deque)  # (wall_s, virtual_ns, rounds, tier_busy, tier_bytes)
    _ends_ns: dict[int, int] = field(default_factory=dict)  # iteration -> virtual end, when known
    _virtual_ns: float = 0.0

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
        self._history.append((wall_s, v_ns, rounds, tier_busy, tier_bytes))
        while len(self._history) > 2 and wall_s - self._history[1][0] >= self.speed_window_s:
            self._history.popleft()
        w0, v0, r0, busy0, bytes0 = self._history[0]
        dw, dv = wall_s - w0, v_ns - v0

        marks = {}
        for s in stats:
            for n, count in s.get("marks_hist", ()):
                marks[n] = marks.get(n, 0) + count
        ranks = sum(s["ranks"] for s in stats)
        done = min(marks, default=0)
        self._record_ends(stats, done)
        durations = self._durations(done)
        mean_iter_ns = self._ends_ns[done - 1] / done if done and (done - 1) in self._ends_ns else None
        if mean_iter_ns:
            progress = min(1.0, max(0.0, (v_ns - self._ends_ns[done - 1]) / mean_iter_ns))
        else:  # no iteration has ended yet: the share of ranks through the current one
            progress = sum(c for n, c in marks.items() if n > done) / ranks if ranks else 0.0
        speed = dv / 1e9 / dw if dw > 0 else (v_ns / 1e9 / wall_s if wall_s > 0 else NAN)
        expected = self.expected_iterations
        run_progress, eta = NAN, NAN
        if finished:
            run_progress, eta, progress = 1.0, 0.0, 0.0
        elif expected and mean_iter_ns:
            end_ns = expected * mean_iter_ns
            run_progress = min(1.0, v_ns / end_ns)
            if speed > 0:
                eta = max(0.0, (end_ns - v_ns) / 1e9 / speed)
        elif expected and ranks:
            run_progress = min(1.0, (done + progress) / expected)

        links = self.tier_links
        stage_ranks = _sum_lists([s.get("stage_ranks", []) for s in stats])
        hists = [s.get("tier_size_hist", [[]] * tiers) for s in stats]
        return Snapshot(
            wall_s=wall_s,
            virtual_time_s=v_ns / 1e9,
            rounds=rounds,
            cross_shard_messages=cross_shard_messages,
            finished=finished,
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
            iteration_durations_s=durations,
            stage_ranks=tuple(stage_ranks),
            stage_compute_s=_per_rank([s.get("stage_compute_ns", []) for s in stats], stage_ranks),
            stage_comm_s=_per_rank([s.get("stage_comm_ns", []) for s in stats], stage_ranks),
            stage_idle_s=_per_rank([s.get("stage_idle_ns", []) for s in stats], stage_ranks),
            stage_peak_memory_bytes=tuple(_max_lists([s.get("stage_peak_memory_bytes", []) for s in stats])),
            hot_links=self._hot_links(stats, v_ns),
        )

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
        links = sorted(
            ((int(link), int(nbytes), int(busy)) for s in stats for link, nbytes, busy in s.get("hot_links", ())),
            key=lambda x: (-x[2], x[0]),
        )[: self.hot_links]
        return tuple((link, nbytes, busy / 1e9, busy / v_ns if v_ns else 0.0) for link, nbytes, busy in links)


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
