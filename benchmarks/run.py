"""Emulation speed and memory, per scenario and backend (issue: 3072 GPUs on two cores).

    python benchmarks/run.py                       # every scenario, inline and Ray (2 shards), 3 repeats
    python benchmarks/run.py --scenarios c,d --backends inline --repeat 1

Every measurement runs in a fresh subprocess so that peak RSS is that run's own (for Ray, the
driver's only: the shards are other processes). Scenario c uses the hierarchical algorithm (a flat
ring over 3072 GPUs expands into 2 * 3071 steps on each of 8 channels per GPU: 150 million
messages). Before the clock starts, the compiled kernels are loaded (``load s``, once per process).
A Ray run that exceeds ``--ray-budget-s`` is stopped and reported up to the virtual time reached.
Prints, per scenario: virtual time, wall time (median), speed ratio (virtual s / wall s), events,
events per wall second per core, rounds, peak RSS, memory per virtual GPU and kernel loading time.
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
from emulator.engine.netcore import warm_up
from emulator.run import execute
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


start = time.perf_counter()
partial = False
if args["what"][0] == "baseline":  # the interpreter and the emulator's modules, no run
    import emulator.workloads.training, emulator.backends.inline  # noqa: E401, F401
    summary = {{"sim_time_s": 0.0, "events": 0, "rounds": 0, "world_size": 1}}
else:
    if args["what"][0] == "collbench":
        cluster = load_cluster("dgx-a100-hdr", ["nodes=384"])
        program = {root!r} + "/emulator/collbench.py:_bench_program"
        config = RunConfig(name="collbench", cluster=cluster, program=program,
                           program_args={{"n": 3072, "op": "all_reduce", "algo": "hierarchical", "size": 1 << 30}})
    else:
        config = load_run(args["what"][1], args["overrides"])
    budget = Budget(args["budget_s"]) if args["backend"] == "ray" else None
    try:
        summary = execute(config, backend=args["backend"], shards=args["shards"], observer=budget)[0]
    except TimeoutError:
        partial = True
        summary = {{"sim_time_s": budget.sim_s, "events": budget.events, "rounds": budget.rounds,
                   "world_size": config.cluster.world_size}}
wall = time.perf_counter() - start
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({{"wall_s": wall, "sim_s": summary["sim_time_s"], "events": summary["events"], "load_s": load_s,
                  "rounds": summary["rounds"], "world": summary["world_size"], "rss_bytes": rss, "partial": partial}}))
"""


def measure(what: list[str], backend: str, shards: int, overrides: list[str], budget_s: float) -> dict:
    args = {"what": what, "backend": backend, "shards": shards, "overrides": overrides, "budget_s": budget_s}
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="a,b,c,d")
    parser.add_argument("--backends", default="inline,ray")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override for runs")
    parser.add_argument("--ray-budget-s", type=float, default=300.0,
                        help="stop a Ray run after this wall time and report the virtual time it reached")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    measure(["baseline"], "inline", 1, [], 0)  # compiles the kernels if numba's cache is cold (peak RSS)
    baseline = measure(["baseline"], "inline", 1, [], 0)["rss_bytes"]
    note = "KB/GPU = (RSS - baseline) / GPUs"
    print(f"# {cores} cores; baseline RSS (interpreter + modules) {baseline / 2**20:.0f} MiB; {note}")
    print(f"# reference loop (10 M Python additions): {reference_loop_s():.3f} s")
    print(f"{'scenario':<42} {'backend':<9} {'virtual s':>10} {'wall s':>8} {'speed':>7} {'events':>11} "
          f"{'ev/s/core':>10} {'rounds':>8} {'RSS MiB':>8} {'KB/GPU':>7} {'load s':>6}")  # fmt: skip
    for key in args.scenarios.split(","):
        label, what = SCENARIOS[key]
        for backend in args.backends.split(","):
            shards = 2 if backend == "ray" else 1
            runs = [measure(what, backend, shards, args.overrides, args.ray_budget_s) for _ in range(args.repeat)]
            wall = statistics.median(r["wall_s"] for r in runs)
            r = runs[0]
            used = min(cores, shards + (1 if backend == "ray" else 0)) if backend == "ray" else 1
            print(
                f"{label:<42} {backend:<9} {r['sim_s']:>10.3f} {wall:>8.1f} {r['sim_s'] / wall:>7.3f} "
                f"{r['events']:>11} {r['events'] / wall / used:>10.0f} {r['rounds']:>8} "
                f"{statistics.median(x['rss_bytes'] for x in runs) / 2**20:>8.0f} "
                f"{(statistics.median(x['rss_bytes'] for x in runs) - baseline) / r['world'] / 1e3:>7.1f} "
                f"{statistics.median(x['load_s'] for x in runs):>6.2f}"
                + (f"  (stopped after {args.ray_budget_s:.0f} s: figures up to the virtual time reached)"
                   if any(x["partial"] for x in runs) else ""),
                flush=True,
            )


if __name__ == "__main__":
    main()
