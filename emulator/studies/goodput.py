"""``emulator goodput RUN``: goodput of a long run under node failures, and the best checkpoint interval.

    emulator goodput configs/runs/megatron-175b-64gpu.yaml --days 30 --mtbf-hours 6334 \\
        --checkpoint-every 300 --checkpoint-s 60 --restart-s 600

The iteration time comes from one emulation of the run file (or ``--iteration-s``, or the
``summary.json`` of a run directory given instead of the run file); the node count from its cluster.
The model, the one of Daly (2006):

- every node fails independently as a Poisson process of mean ``--mtbf-hours``, so the job fails as
  one Poisson process of rate ``nodes / MTBF`` (job MTBF ``M = MTBF / nodes``), at any moment: while
  computing, while writing a checkpoint, while restarting (a node does not stop failing because the
  job is restarting);
- the job computes ``N`` iterations (work ``W = N * iteration_s``), then writes a checkpoint for
  ``C`` seconds, synchronously (no iteration runs meanwhile); a checkpoint counts once it is written;
- a failure loses everything since the last written checkpoint (the work and a checkpoint being
  written), then the job restarts for ``R`` seconds (replace the node, reload); a failure during a
  restart starts the restart again. The job's first start costs no restart.

Closed form (steady state, :func:`closed_form`): one checkpointed segment takes on average
``E = M e^(R/M) (e^((W+C)/M) - 1)`` of wall time, so goodput is ``W / E``; the time lost splits
into checkpoint writing ``M (e^(C/M) - 1) / E`` (written and cut short), restarts ``1 - e^(-R/M)``
and rework (the rest). Goodput peaks where ``1 - e^(-(W+C)/M) = W/M`` (unimodal in ``W``), which is
independent of ``R``: a long restart lowers goodput by ``e^(-R/M)`` but does not move the optimum.

Monte Carlo (:func:`monte_carlo`): the failure times of each trial are drawn once (a Poisson
count over the horizon, then sorted uniform times: failures do not depend on what the job does), so
every checkpoint interval is evaluated against the same failures (common random numbers), and
between two failures the job's progress is arithmetic: no per-iteration loop. Useful time is the
work made durable by a checkpoint within ``--days``; work still unsaved at the horizon is reported
apart (``in_progress``), which is why the Monte Carlo sits a fraction ``<= W / horizon`` below the
steady state.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from emulator.errors import ConfigError

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0
# bounds of the arguments: beyond them the question is not a training run's (10 years, a node that
# never fails in 1000 years) or the Monte Carlo would not fit in memory and seconds
MAX_DAYS = 3650.0
MAX_MTBF_HOURS = 1e7
MAX_COST_S = 1e6  # checkpoint, restart and iteration seconds: 11.6 days
MAX_CHECKPOINT_EVERY = 10**9
MAX_TRIALS = 10_000
MAX_FAILURES_PER_TRIAL = 100_000  # expected failures over the horizon
MAX_FAILURES_TOTAL = 5_000_000  # expected failures over all trials: the Monte Carlo's arrays
CAUSES = ("checkpoint", "rework", "restart")  # where the time that is not useful goes


@dataclass(frozen=True)
class Scenario:
    """One long run: the job, its failures and its checkpoint policy (all validated)."""

    iteration_s: float
    nodes: int
    node_mtbf_hours: float
    checkpoint_every: int
    checkpoint_s: float
    restart_s: float
    days: float

    @property
    def job_mtbf_s(self) -> float:
        return self.node_mtbf_hours * SECONDS_PER_HOUR / self.nodes

    @property
    def horizon_s(self) -> float:
        return self.days * SECONDS_PER_DAY

    @property
    def work_s(self) -> float:
        return self.checkpoint_every * self.iteration_s

    def with_every(self, checkpoint_every: int) -> Scenario:
        return Scenario(**{**asdict(self), "checkpoint_every": checkpoint_every})


def _number(flag: str, value, low: float, high: float, low_inclusive: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (value >= low if low_inclusive else value > low) or value > high:
        bound = f">= {low:g}" if low_inclusive else f"> {low:g}"
        raise ConfigError(f"{flag} must be a finite number {bound} and <= {high:g}, got {value!r}")
    return float(value)


def _integer(flag: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{flag} must be an integer from {low} to {high}, got {value!r}")
    return value


def make_scenario(iteration_s, nodes, node_mtbf_hours, checkpoint_every, checkpoint_s, restart_s,
                  days) -> Scenario:  # fmt: skip
    """A validated :class:`Scenario`; ConfigError naming the flag otherwise."""
    s = Scenario(
        iteration_s=_number("--iteration-s", iteration_s, 0, MAX_COST_S),
        nodes=_integer("nodes", nodes, 1, 10**7),
        node_mtbf_hours=_number("--mtbf-hours", node_mtbf_hours, 0, MAX_MTBF_HOURS),
        checkpoint_every=_integer("--checkpoint-every", checkpoint_every, 1, MAX_CHECKPOINT_EVERY),
        checkpoint_s=_number("--checkpoint-s", checkpoint_s, 0, MAX_COST_S),
        restart_s=_number("--restart-s", restart_s, 0, MAX_COST_S, low_inclusive=True),
        days=_number("--days", days, 0, MAX_DAYS),
    )
    failures = s.horizon_s / s.job_mtbf_s
    if failures > MAX_FAILURES_PER_TRIAL:
        raise ConfigError(f"--mtbf-hours: {s.nodes} nodes of MTBF {s.node_mtbf_hours:g} h fail {failures:.3g} times "
                          f"in {s.days:g} days; at most {MAX_FAILURES_PER_TRIAL} are modelled")  # fmt: skip
    return s


# -- closed form ------------------------------------------------------------------------------------


def closed_form(s: Scenario) -> dict:
    """Steady-state fractions of wall time: ``goodput`` and the causes of loss; failures per horizon.

    Written with ``expm1`` and negative exponents so that nothing overflows when a segment is much
    longer than the MTBF (goodput then underflows to 0 instead).
    """
    lam = 1.0 / s.job_mtbf_s
    w, c, r = s.work_s, s.checkpoint_s, s.restart_s
    x = w + c
    fail_x = -math.expm1(-lam * x)  # P(a failure before a segment of work and checkpoint ends)
    # per segment: E = e^(lam R) (e^(lam X) - 1) / lam; every fraction below is (time) / E
    goodput = lam * w * math.exp(-lam * (r + x)) / fail_x
    checkpoint = math.exp(-lam * (r + x - c)) * -math.expm1(-lam * c) / fail_x
    restart = -math.expm1(-lam * r)
    # computing time of all attempts, e^(lam X) (1 - e^(-lam W)) / lam, less the W that is kept
    rework = math.exp(-lam * r) * (-math.expm1(-lam * w) - lam * w * math.exp(-lam * x)) / fail_x
    return {"goodput": goodput, "checkpoint": checkpoint, "rework": rework, "restart": restart,
            "failures": s.horizon_s * lam}  # fmt: skip


def optimal_work_s(job_mtbf_s: float, checkpoint_s: float) -> float:
    """Work between checkpoints that maximises :func:`closed_form`'s goodput, not rounded to iterations.

    The root of ``1 - e^(-(W+C)/M) = W/M`` (the derivative of log goodput), unique on (0, M].
    """
    lam = 1.0 / job_mtbf_s
    lo, hi = 0.0, job_mtbf_s
    for _ in range(200):  # bisection: the left side minus the right falls strictly, so this converges
        mid = 0.5 * (lo + hi)
        if -math.expm1(-lam * (mid + checkpoint_s)) > lam * mid:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * job_mtbf_s:
            break
    return 0.5 * (lo + hi)


def young_interval_s(job_mtbf_s: float, checkpoint_s: float) -> float:
    """Young (1974): ``sqrt(2 C M)``, first order in ``C / M``."""
    return math.sqrt(2.0 * checkpoint_s * job_mtbf_s)


def daly_interval_s(job_mtbf_s: float, checkpoint_s: float) -> float:
    """Daly (2006, FGCS 22, eq. 37): ``sqrt(2CM) (1 + sqrt(C/2M)/3 + (C/2M)/9) - C`` for ``C < 2M``, else ``M``."""
    c, m = checkpoint_s, job_mtbf_s
    if c >= 2.0 * m:
        return m
    ratio = c / (2.0 * m)
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - c


def best_checkpoint_every(s: Scenario) -> int:
    """The whole number of iterations between checkpoints with the highest closed-form goodput.

    Goodput is unimodal in the work ``W``, so the best whole number lies on either side of the
    continuous optimum; both sides are evaluated.
    """
    ideal = optimal_work_s(s.job_mtbf_s, s.checkpoint_s) / s.iteration_s
    sides = {min(MAX_CHECKPOINT_EVERY, max(1, n)) for n in (math.floor(ideal), math.ceil(ideal))}
    return max(sorted(sides), key=lambda n: closed_form(s.with_every(n))["goodput"])


# -- Monte Carlo ------------------------------------------------------------------------------------


def failure_times(s: Scenario, trials: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Failure times of each trial: (times, shape trials x m, sorted, padded with the horizon; counts)."""
    rng = np.random.default_rng(seed)
    horizon = s.horizon_s
    counts = rng.poisson(horizon / s.job_mtbf_s, size=trials)
    width = int(counts.max()) if trials else 0
    times = rng.uniform(0.0, horizon, size=(trials, width))
    times[np.arange(width)[None, :] >= counts[:, None]] = horizon  # past the count: no failure
    times.sort(axis=1)
    return times, counts


def monte_carlo(s: Scenario, times: np.ndarray, counts: np.ndarray) -> dict[str, np.ndarray]:
    """Per trial: seconds of useful work, of each cause, unsaved at the horizon; failures.

    The wall time between two failures (or the start, or the horizon) is a restart (none at the
    first start), then whole segments of work and checkpoint, then a part of one that the next
    failure discards (or that the horizon leaves unsaved).
    """
    trials = times.shape[0]
    horizon = s.horizon_s
    bounds = np.concatenate([np.zeros((trials, 1)), times, np.full((trials, 1), horizon)], axis=1)
    gap = np.diff(bounds, axis=1)  # interval j starts at failure j (j = 0: the start)
    j = np.arange(gap.shape[1])[None, :]
    restart = np.where(j == 0, 0.0, np.minimum(gap, s.restart_s))
    run = gap - restart
    w, c = s.work_s, s.checkpoint_s
    segments = np.floor(run / (w + c))
    left = run - segments * (w + c)  # the part of a segment the interval ends in
    computing = np.minimum(left, w)
    ends_in_failure = j < counts[:, None]
    return {
        "useful": segments.sum(axis=1) * w,
        "checkpoint": segments.sum(axis=1) * c + (left - computing).sum(axis=1),
        "rework": np.where(ends_in_failure, computing, 0.0).sum(axis=1),
        "restart": restart.sum(axis=1),
        "in_progress": np.where(j == counts[:, None], computing, 0.0).sum(axis=1),
        "failures": counts.astype(float),
    }


def _stats(values: np.ndarray) -> dict:
    n = len(values)
    sd = float(values.std(ddof=1)) if n > 1 else 0.0
    return {"mean": float(values.mean()), "sd": sd, "se": sd / math.sqrt(n)}


def simulate(s: Scenario, trials: int, seed: int, times=None, counts=None) -> dict:
    """Monte Carlo of ``s``: mean, sd and standard error of goodput, of each cause (fractions of the
    horizon) and of the failure count. ``times, counts``: failures drawn already (common numbers)."""
    if times is None:
        times, counts = failure_times(s, trials, seed)
    per_trial = monte_carlo(s, times, counts)
    out = {"goodput": _stats(per_trial["useful"] / s.horizon_s)}
    for key in (*CAUSES, "in_progress"):
        out[key] = _stats(per_trial[key] / s.horizon_s)
    out["failures"] = _stats(per_trial["failures"])
    return out


# -- the command ------------------------------------------------------------------------------------


def analyse(s: Scenario, trials: int, seed: int) -> dict:
    """Everything ``emulator goodput`` prints: the policy's closed form and Monte Carlo, and the
    candidate intervals (the search's optimum, Young, Daly, the given one, half and double the
    optimum), each with both, on the same failures."""
    trials = _integer("--trials", trials, 1, MAX_TRIALS)
    seed = _integer("--seed", seed, 0, 2**63 - 1)
    expected = trials * s.horizon_s / s.job_mtbf_s
    if expected > MAX_FAILURES_TOTAL:
        raise ConfigError(f"--trials: {trials} trials of {expected / trials:.3g} failures each exceed the "
                          f"Monte Carlo's {MAX_FAILURES_TOTAL} failures; use fewer trials")  # fmt: skip
    times, counts = failure_times(s, trials, seed)
    m, c = s.job_mtbf_s, s.checkpoint_s
    best = best_checkpoint_every(s)
    named = {"optimum": best, "Young": None, "Daly": None, "given": s.checkpoint_every,
             "optimum / 2": max(1, best // 2), "optimum x 2": min(MAX_CHECKPOINT_EVERY, best * 2)}  # fmt: skip
    formula_s = {"optimum": optimal_work_s(m, c), "Young": young_interval_s(m, c), "Daly": daly_interval_s(m, c)}
    for name in ("Young", "Daly"):
        named[name] = min(MAX_CHECKPOINT_EVERY, max(1, round(formula_s[name] / s.iteration_s)))
    candidates = []
    for name, every in named.items():
        t = s.with_every(every)
        candidates.append({"name": name, "checkpoint_every": every, "interval_s": t.work_s,
                           "formula_interval_s": formula_s.get(name), "closed_form": closed_form(t)["goodput"],
                           "monte_carlo": simulate(t, trials, seed, times, counts)["goodput"]})  # fmt: skip
    return {"scenario": {**asdict(s), "job_mtbf_hours": m / SECONDS_PER_HOUR, "horizon_s": s.horizon_s},
            "trials": trials, "seed": seed, "closed_form": closed_form(s),
            "monte_carlo": simulate(s, trials, seed, times, counts), "candidates": candidates}  # fmt: skip


def format_report(result: dict, name: str, source: str) -> str:
    """The text ``emulator goodput`` prints."""
    s, cf, mc = result["scenario"], result["closed_form"], result["monte_carlo"]
    horizon_h = s["horizon_s"] / SECONDS_PER_HOUR
    lines = [
        f"{name}: {s['nodes']} nodes, iteration {s['iteration_s']:.4f} s ({source}), {s['days']:g} days",
        f"failures: node MTBF {s['node_mtbf_hours']:g} h -> job MTBF {s['job_mtbf_hours']:.3g} h; expected "
        f"{cf['failures']:.1f}, Monte Carlo {mc['failures']['mean']:.1f} (sd {mc['failures']['sd']:.1f}) "
        f"over {result['trials']} trials, seed {result['seed']}",
        f"policy: checkpoint every {s['checkpoint_every']} iterations ({s['checkpoint_every'] * s['iteration_s']:.0f} s"
        f" of work), checkpoint {s['checkpoint_s']:g} s, restart {s['restart_s']:g} s",
        "",
        f"{'':<22}{'closed form':>20}{'Monte Carlo mean (sd)':>30}",
    ]  # fmt: skip
    rows = [("goodput", "goodput"), ("checkpoint writing", "checkpoint"), ("rework after failures", "rework"),
            ("restarts", "restart"), ("unsaved at the horizon", "in_progress")]  # fmt: skip
    for label, key in rows:
        f = cf.get(key)
        left = f"{100 * f:6.2f}% {f * horizon_h:8.1f} h" if f is not None else "-"
        st = mc[key]
        right = f"{100 * st['mean']:6.2f}% ({100 * st['sd']:.2f}) {st['mean'] * horizon_h:8.1f} h"
        lines.append(f"{label:<22}{left:>20}{right:>30}")
    lines += ["", f"{'checkpoint interval':<20}{'every':>10}{'work s':>10}{'formula s':>11}{'closed form':>13}"
                  f"{'Monte Carlo (se)':>20}"]  # fmt: skip
    for cand in result["candidates"]:
        formula = cand["formula_interval_s"]
        st = cand["monte_carlo"]
        formula_text = f"{formula:.0f}" if formula is not None else "-"
        mc_text = f"{100 * st['mean']:.3f}% ({100 * st['se']:.3f})"
        lines.append(f"{cand['name']:<20}{cand['checkpoint_every']:>10}{cand['interval_s']:>10.0f}{formula_text:>11}"
                     f"{100 * cand['closed_form']:>12.3f}%{mc_text:>20}")  # fmt: skip
    return "\n".join(lines + [""] + notes(result))


def notes(result: dict) -> list[str]:
    """Where Young and Daly stand against the search, and why the figures may differ."""
    s = result["scenario"]
    m, c, r = s["job_mtbf_hours"] * SECONDS_PER_HOUR, s["checkpoint_s"], s["restart_s"]
    by_name = {cand["name"]: cand for cand in result["candidates"]}
    exact = by_name["optimum"]["formula_interval_s"]
    off = {n: 100 * (by_name[n]["formula_interval_s"] / exact - 1) for n in ("Young", "Daly")}
    best_mc = max(result["candidates"], key=lambda cand: cand["monte_carlo"]["mean"])
    out = [f"C/M = {c / m:.2g}, R/M = {r / m:.2g}: Young's interval is {off['Young']:+.1f}%, "
           f"Daly's {off['Daly']:+.1f}% from the exact optimum {exact:.0f} s "
           "(R does not move it: it scales goodput by e^(-R/M))",
           f"Monte Carlo's best of these: {best_mc['name']} (every {best_mc['checkpoint_every']}), "
           "on the same failures"]  # fmt: skip
    if s["iteration_s"] > 0.05 * exact:
        out.append(f"quantised: an iteration ({s['iteration_s']:.3g} s) is {100 * s['iteration_s'] / exact:.0f}% of "
                   "the optimum interval, so the best whole number of iterations sits off the formulas")  # fmt: skip
    if exact > 0.02 * s["horizon_s"]:
        out.append(f"the optimum interval is {100 * exact / s['horizon_s']:.1f}% of the horizon: the Monte Carlo "
                   "counts only checkpointed work, so it falls below the steady state by up to one interval; "
                   "longer --days narrows this")  # fmt: skip
    return out


def iteration_source(args) -> tuple[str, int, float, str]:
    """(name, nodes, iteration seconds, where the iteration time came from) of the command's input.

    The input is a run file, emulated once unless ``--iteration-s`` is given, or a run directory
    (its ``config.yaml`` and ``summary.json``).
    """
    from emulator.config.loader import load_config

    path = Path(args.run)
    if path.is_dir():
        summary_path, config_path = path / "summary.json", path / "config.yaml"
        if not summary_path.is_file() or not config_path.is_file():
            raise ConfigError(f"{path}: not a run directory (needs summary.json and config.yaml)")
        config = load_config(config_path, args.overrides)
        iteration_s = args.iteration_s or json.loads(summary_path.read_text()).get("iteration_time_s")
        source = "given" if args.iteration_s else f"{summary_path}"
    else:
        config = load_config(path, args.overrides)
        iteration_s, source = args.iteration_s, "given"
        if iteration_s is None:
            from emulator.runner.sequence import run_job

            iteration_s = run_job(config, trace_ranks="none").summary.get("iteration_time_s")
            source = "emulated"
    if not iteration_s:
        raise ConfigError(f"{args.run}: the run has no iteration time (a program without iterations?); "
                          "give --iteration-s")  # fmt: skip
    return config.name, config.cluster.total_nodes, iteration_s, source


def add_goodput_parser(sub) -> argparse.ArgumentParser:
    """The ``goodput`` subcommand on an ``add_subparsers()`` object."""
    p = sub.add_parser("goodput", help="goodput over days of node failures; the best checkpoint interval")
    p.add_argument("run", help="run file (YAML), emulated once for its iteration time; or a run directory")
    p.add_argument("--days", type=float, required=True, help="length of the run in days of wall time")
    p.add_argument("--mtbf-hours", type=float, required=True, help="mean time between failures of one node")
    p.add_argument("--checkpoint-every", type=int, required=True, metavar="N", help="iterations between checkpoints")
    p.add_argument("--checkpoint-s", type=float, required=True, help="seconds to write a checkpoint (job stopped)")
    p.add_argument("--restart-s", type=float, required=True, help="seconds from a failure to computing again")
    p.add_argument("--iteration-s", type=float, help="iteration time: skip the emulation")
    p.add_argument("--trials", type=int, default=200, help="Monte Carlo trials (default 200)")
    p.add_argument("--seed", type=int, default=0, help="seed of the failure times (default 0)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a value of the run file (repeatable)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print every figure as JSON")
    return p


def cmd_goodput(args) -> int:
    """Run ``emulator goodput`` from parsed arguments; ConfigError for user errors."""
    # validate the flags before an emulation that may take minutes
    if args.iteration_s is not None:
        _number("--iteration-s", args.iteration_s, 0, MAX_COST_S)
    make_scenario(1.0, 1, args.mtbf_hours, args.checkpoint_every, args.checkpoint_s, args.restart_s, args.days)
    _integer("--trials", args.trials, 1, MAX_TRIALS)
    _integer("--seed", args.seed, 0, 2**63 - 1)
    name, nodes, iteration_s, source = iteration_source(args)
    s = make_scenario(iteration_s, nodes, args.mtbf_hours, args.checkpoint_every, args.checkpoint_s, args.restart_s,
                      args.days)  # fmt: skip
    result = analyse(s, args.trials, args.seed)
    result.update(name=name, iteration_source=source)
    print(json.dumps(result, indent=2) if args.json else format_report(result, name, source))
    return 0
