"""Emulation speed and memory, per scenario, backend and shard count, with a projection to N hosts.

    python benchmarks/run.py                       # every scenario: in-process 1 shard, Ray 2 shards, 3 repeats
    python benchmarks/run.py --scenarios c,d --backends inline --repeat 1
    python benchmarks/run.py --scenarios d --backends inline,ray --shards 1,2,4 --json runs/bench.jsonl
    python benchmarks/run.py --scenarios a --backends ray --shards 4 --address auto   # an existing Ray cluster

Every measurement runs in a fresh subprocess so that peak RSS is that run's own (for Ray, the
driver's only: the shards are other processes). Scenario c uses the hierarchical algorithm (a flat
ring over 3072 GPUs expands into 2 * 3071 steps on each of 8 channels per GPU: 150 million
messages). Before the clock starts, the compiled kernels are loaded (``load s``, once per process)
and, for Ray, the driver joins Ray (``ray s``: starting a local Ray, or connecting to ``--address``).
A Ray run that exceeds ``--ray-budget-s`` is stopped and reported up to the virtual time reached.

In-process 1 shard of every scenario is always measured (first): it is what ``speedup`` and the
projection compare with. The projected speedup on N hosts (one shard per host) is

    in-process 1-shard wall time / (busiest shard's busy time + rounds x Ray overhead per round)

with the overhead per round measured on Ray in this invocation (same scenario; same shard count
where measured, else the nearest; ``ovh from`` says which), or ``--ray-overhead-us`` where no Ray
run of the scenario was measured. benchmarks/README.md explains every column.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCENARIOS = {
    "a": ("megatron-1t-3072gpu, one iteration", ["run", "configs/runs/megatron-1t-3072gpu.yaml"]),
    "b": ("gpt3-175b-1024gpu", ["run", "configs/runs/gpt3-175b-1024gpu.yaml"]),
    "c": ("collbench all_reduce hierarchical, 3072 GPUs, 1 GiB", ["collbench"]),
    "d": ("bloom-560m-zero2", ["run", "configs/runs/bloom-560m-zero2.yaml"]),
}

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {root!r})
from emulator.config.loader import load_cluster, load_run
from emulator.config.schema import RunConfig
from emulator.engine import coordinator
from emulator.engine.netcore import warm_up
from emulator.runner.sequence import execute
args = json.loads(sys.argv[1])
load_start = time.perf_counter()
warm_up()  # the compiled kernels' one-time loading (reported apart from the run)
load_s = time.perf_counter() - load_start


class Budget:
    # an observer that stops a run once it has used its wall-clock budget (the figures then
    # describe the virtual time reached; observing changes no result)
    def __init__(self, limit_s):
        self.limit_s, self.sim_s, self.events, self.rounds = limit_s, 0.0, 0, 0

    def update(self, rounds, t_min, shard_stats):
        self.rounds, self.sim_s = rounds, t_min / 1e9
        self.events = sum(s["events"] for s in shard_stats)
        if time.perf_counter() - start > self.limit_s:
            raise TimeoutError


STATS = {{}}  # the run's RoundStats: its counters also when the budget stops the run (no summary then)
run_rounds = coordinator.run_rounds


def kept_run_rounds(transport, lookahead_ns, stats, *rest, **options):
    STATS["stats"] = stats
    return run_rounds(transport, lookahead_ns, stats, *rest, **options)


ray_s = 0.0
if args["backend"] == "ray":
    coordinator.run_rounds = kept_run_rounds  # drive() looks it up at each call
    from actors.backend import connect, import_ray
    ray_start = time.perf_counter()
    connect(import_ray(), args["address"])  # the run reuses this connection
    ray_s = time.perf_counter() - ray_start

start = time.perf_counter()
partial = False
if args["what"][0] == "baseline":  # the interpreter and the emulator's modules, no run
    import emulator.workloads.training, emulator.backends.inline  # noqa: E401, F401
    summary = {{"sim_time_s": 0.0, "events": 0, "rounds": 0, "world_size": 1}}
else:
    if args["what"][0] == "collbench":
        cluster = load_cluster("dgx-a100-hdr", ["nodes=384"])
        program = {root!r} + "/emulator/studies/collbench.py:_bench_program"
        config = RunConfig(name="collbench", cluster=cluster, program=program,
                           program_args={{"n": 3072, "op": "all_reduce", "algo": "hierarchical", "size": 1 << 30}})
    else:
        config = load_run(args["what"][1], args["overrides"])
    budget = Budget(args["budget_s"]) if args["backend"] == "ray" else None
    try:
        summary = execute(config, backend=args["backend"], shards=args["shards"], address=args["address"],
                          observer=budget)[0]
    except TimeoutError as exc:
        partial = True
        busy = exc.partial_result.extra["shard_busy_s"] if exc.partial_result is not None else []
        summary = {{"sim_time_s": budget.sim_s, "events": budget.events, "rounds": budget.rounds,
                   "world_size": config.cluster.world_size}}
wall = time.perf_counter() - start
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
row = {{"wall_s": wall, "sim_s": summary["sim_time_s"], "events": summary["events"], "load_s": load_s, "ray_s": ray_s,
       "rounds": summary["rounds"], "world": summary["world_size"], "rss_bytes": rss, "partial": partial,
       "cross_shard_messages": summary.get("cross_shard_messages", 0),
       "shard_busy_s": summary.get("shard_busy_s", []), "round_overhead_s": summary.get("round_overhead_s", 0.0)}}
if "stats" in STATS:  # Ray: the same figures for a stopped run, and the busiest shard's time per round
    stats = STATS["stats"]
    row.update(rounds=stats.rounds, cross_shard_messages=stats.cross_shard_messages, round_overhead_s=stats.overhead_s,
               critical_s=stats.critical_s)
    if partial:
        row.update(shard_busy_s=busy)
print(json.dumps(row))
"""


def measure(what: list[str], backend: str, shards: int, overrides: list[str], budget_s: float,
            address: str | None = None) -> dict:  # fmt: skip
    args = {"what": what, "backend": backend, "shards": shards, "overrides": overrides, "budget_s": budget_s,
            "address": address}  # fmt: skip
    code = CHILD.format(root=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"benchmark child failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def reference_loop_s() -> float:
    """Seconds for 10 million Python additions (median of 5): this VM's speed drifts by tens of
    percent over an hour, so figures taken at different times are compared through this."""
    times = []
    for _ in range(5):
        start, x = time.perf_counter(), 0
        for i in range(10_000_000):
            x += i
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def int_list(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected shard counts >= 1 separated by commas, got {text!r}")
    return values


def pick_overhead(scenario_rows: list[dict], shards: int, given_us: float | None) -> tuple[float | None, str]:
    """The Ray overhead per round (us) a projection uses, and where it comes from: the Ray run of
    this scenario with ``shards`` shards, else the one with the nearest count (more shards among
    equals; a 1-shard Ray run only for 1 shard: its rounds are observation windows, with no
    exchange), else ``--ray-overhead-us``."""
    ray = [r for r in scenario_rows if r["backend"] == "ray" and r["rounds"] > 0 and (r["shards"] > 1 or shards == 1)]
    if ray:
        best = min(ray, key=lambda r: (abs(r["shards"] - shards), -r["shards"]))
        return best["overhead_us_per_round"], f"ray/{best['shards']}"
    if given_us is not None:
        return given_us, "given"
    return None, "-"


HEADER = (f"{'sc':<2} {'backend':<7} {'shards':>6} {'virtual s':>9} {'wall s':>8} {'speed':>7} {'speedup':>7} "
          f"{'rounds':>9} {'rounds/vs':>9} {'ovh us':>7} {'driver s':>8} {'drv %':>5} {'proj x':>6} {'eff %':>5} "
          f"{'ovh from':>8} {'events':>10} {'ev/s/core':>9} {'RSS MiB':>7} {'KB/GPU':>6} {'load s':>6} {'ray s':>5}  "
          "busy s per shard")  # fmt: skip


def fmt(value, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


def format_row(r: dict) -> str:
    busy = "/".join(f"{b:.2f}" for b in r["shard_busy_s"]) or "-"
    efficiency = None if r["projected_efficiency"] is None else 100 * r["projected_efficiency"]
    flags = "  (stopped by --ray-budget-s: figures up to the virtual time reached)" if r["partial"] else ""
    return (f"{r['scenario']:<2} {r['backend']:<7} {r['shards']:>6} {r['virtual_s']:>9.3f} {r['wall_s']:>8.2f} "
            f"{fmt(r['speed'], '.3f', 7)} {fmt(r['speedup'], '.2f', 7)} {r['rounds']:>9} "
            f"{fmt(r['rounds_per_virtual_s'], '.0f', 9)} {fmt(r['overhead_us_per_round'], '.0f', 7)} "
            f"{r['driver_s']:>8.2f} {100 * r['driver_share']:>5.0f} {fmt(r['projected_speedup'], '.2f', 6)} "
            f"{fmt(efficiency, '.0f', 5)} "
            f"{r['projection_overhead_from']:>8} {r['events']:>10} {r['events_per_s_per_core']:>9.0f} "
            f"{r['rss_mib']:>7.0f} {fmt(r['kb_per_gpu'], '.1f', 6)} {r['load_s']:>6.2f} "
            f"{fmt(r['ray_init_s'], '.1f', 5)}  {busy}{flags}")  # fmt: skip


def make_row(key: str, backend: str, shards: int, runs: list[dict], cores: int, baseline: int) -> dict:
    """One table row from the repeats: wall time and memory as medians, the other figures from the
    run whose wall time is the (lower) median."""
    wall = statistics.median(x["wall_s"] for x in runs)
    r = sorted(runs, key=lambda x: x["wall_s"])[(len(runs) - 1) // 2]
    rss = statistics.median(x["rss_bytes"] for x in runs)
    busy = r["shard_busy_s"]
    if backend == "ray":  # the driver waits for the busiest shard of each round; the rest is its share
        driver = r["wall_s"] - r["critical_s"]
        used = min(cores, shards + 1)
    else:  # the shards take turns in the driver's process
        driver = r["wall_s"] - sum(busy)
        used = 1
    return {
        "scenario": key, "label": SCENARIOS[key][0], "backend": backend, "shards": shards,
        "virtual_s": r["sim_s"], "wall_s": wall, "walls_s": [x["wall_s"] for x in runs],
        "speed": r["sim_s"] / wall,
        "rounds": r["rounds"],
        "rounds_per_virtual_s": r["rounds"] / r["sim_s"] if r["sim_s"] > 0 else None,
        "round_overhead_s": r["round_overhead_s"],
        "overhead_us_per_round": 1e6 * r["round_overhead_s"] / r["rounds"] if r["rounds"] else None,
        "cross_shard_messages": r["cross_shard_messages"],
        "shard_busy_s": [round(b, 3) for b in busy], "busiest_per_round_s": r.get("critical_s"),
        "driver_s": driver, "driver_share": driver / r["wall_s"],
        "events": r["events"], "events_per_s_per_core": r["events"] / wall / used,
        "rss_mib": rss / 2**20, "kb_per_gpu": (rss - baseline) / r["world"] / 1e3 if backend == "inline" else None,
        "load_s": statistics.median(x["load_s"] for x in runs),
        "ray_init_s": statistics.median(x["ray_s"] for x in runs) if backend == "ray" else None,
        "partial": any(x["partial"] for x in runs),
    }  # fmt: skip


def compare(r: dict, rows: list[dict], given_us: float | None) -> None:
    """Speedup against in-process 1 shard (``rows[0]``), and the projection to one host per shard."""
    reference = rows[0]
    if r["partial"]:  # a stopped run: compare the speed ratios (virtual s per wall s)
        r["speedup"] = (r["virtual_s"] / r["wall_s"]) / (reference["virtual_s"] / reference["wall_s"])
    else:
        r["speedup"] = reference["wall_s"] / r["wall_s"]
    if r["backend"] == "inline" and r["shards"] == 1:
        overhead_us, source = 0.0, "-"  # no rounds to pay for
    else:
        overhead_us, source = pick_overhead(rows, r["shards"], given_us)
    r["projection_overhead_us"], r["projection_overhead_from"] = overhead_us, source
    r["projected_s"] = r["projected_speedup"] = r["projected_efficiency"] = None
    if overhead_us is not None and not r["partial"] and r["shard_busy_s"]:
        r["projected_s"] = max(r["shard_busy_s"]) + r["rounds"] * overhead_us / 1e6
        r["projected_speedup"] = reference["wall_s"] / r["projected_s"]
        r["projected_efficiency"] = r["projected_speedup"] / r["shards"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="a,b,c,d", help=f"comma-separated, from {','.join(SCENARIOS)}")
    parser.add_argument("--backends", default="inline,ray", help="comma-separated: inline, ray")
    parser.add_argument("--shards", type=int_list, default=None,
                        help="shard counts, comma-separated, for every backend (default: 1 in-process, 2 on Ray)")
    parser.add_argument("--address", default=None,
                        help="Ray cluster to run on (auto or HOST:PORT; default: a local Ray started per run)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override for runs")
    parser.add_argument("--ray-budget-s", type=float, default=300.0,
                        help="stop a Ray run after this wall time and report the virtual time it reached")
    parser.add_argument("--ray-overhead-us", type=float, default=None,
                        help="Ray overhead per round for projections of scenarios with no Ray run measured here")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON lines to this file")
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    for b in backends:
        if b not in ("inline", "ray"):
            parser.error(f"--backends: unknown backend {b!r} (inline, ray)")
    keys = [k for k in args.scenarios.split(",") if k]
    for k in keys:
        if k not in SCENARIOS:
            parser.error(f"--scenarios: unknown scenario {k!r} ({', '.join(SCENARIOS)})")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    measure(["baseline"], "inline", 1, [], 0)  # compiles the kernels if numba's cache is cold (peak RSS)
    baseline = measure(["baseline"], "inline", 1, [], 0)["rss_bytes"]
    loop_s = reference_loop_s()
    print(f"# {cores} cores; baseline RSS (interpreter + modules) {baseline / 2**20:.0f} MiB; "
          "KB/GPU = (RSS - baseline) / GPUs")  # fmt: skip
    print(f"# reference loop (10 M Python additions): {loop_s:.3f} s")
    print(f"# wall s: median of {args.repeat}; speedup and proj x against in-process 1 shard of the scenario; "
          "proj x = in-process wall / (busiest shard's busy s + rounds x ovh us of 'ovh from')")  # fmt: skip
    for k in keys:
        print(f"# {k}: {SCENARIOS[k][0]}" + (f" ({' '.join('--set ' + o for o in args.overrides)})"
                                              if args.overrides and SCENARIOS[k][1][0] == "run" else ""))  # fmt: skip
    print(HEADER, flush=True)
    out = args.json.open("w") if args.json else None
    for key in keys:
        what = SCENARIOS[key][1]
        # in-process 1 shard first (the reference), then Ray (whose overhead per round the in-process
        # multi-shard projections use), then the other in-process counts: each row prints when measured
        plan = [("inline", 1)]
        for backend in sorted(backends, key=lambda b: b != "ray"):
            counts = args.shards or ([2] if backend == "ray" else [1])
            plan += [(backend, n) for n in counts if (backend, n) not in plan]
        rows: list[dict] = []
        for backend, shards in plan:
            runs = [measure(what, backend, shards, args.overrides, args.ray_budget_s, args.address)
                    for _ in range(args.repeat)]  # fmt: skip
            row = make_row(key, backend, shards, runs, cores, baseline)
            rows.append(row)
            compare(row, rows, args.ray_overhead_us)
            print(format_row(row), flush=True)
            row.update(cores=cores, reference_loop_s=loop_s, overrides=args.overrides, repeat=args.repeat)
            if out is not None:
                out.write(json.dumps(row) + "\n")
                out.flush()
    if out is not None:
        out.close()


if __name__ == "__main__":
    main()
