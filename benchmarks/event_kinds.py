"""Events and event-loop time per event kind, for one in-process run (a profiling mode).

    python benchmarks/event_kinds.py configs/runs/megatron-1t-3072gpu.yaml --set training.global_batch_size=192
    python benchmarks/event_kinds.py configs/runs/megatron-1t-3072gpu.yaml --set engine.op_engine=python
    cd <another checkout> && python <this checkout>/benchmarks/event_kinds.py --checkout . configs/runs/...

The engine keeps one event counter per shard, not one per kind, and its hot loop is left alone:
this script wraps the shard's dispatch methods from outside (``Shard._complete``, ``_step``,
``_handover``, ``_run_core`` and, where the compiled per-op engine exists, ``_run_ops``), in this
process only, and times each event the loop dispatches, from the call to its return, on the
event loop's own greenlet. A rank program resumed by an event runs inside that call (a greenlet
switch and back), so the ops it launches are counted in the event that resumed it. A Python-heap
event is one dispatch; a call into a compiled core (``_run_core``: message-level collectives,
``_run_ops``: the built-in workload's layer blocks) counts the events that core processed in it,
its kernel time (``NetCore.run`` / ``OpCore.run``, dispatch included) and the Python that follows
in the same call (the op the core finished, the program it resumes) apart. Where the loop calls
the cores' run methods itself (``Shard._ops_stopped`` exists: no ``_run_ops`` / ``_run_core`` frame),
each row of a core is its kernel calls alone, and the Python after them (a block's end, a resume,
a receive's completion) has rows of its own with no events. What no dispatch holds
- the heap pops, the comparisons between the heaps, the loop itself - is the row ``loop and
heaps``. The per-kind rows of compiled cores are one row per core: the kernels do not count by
kind (run the same config with ``--set engine.op_engine=python`` for the same events split by
kind; the order of events, hence their kinds, is the same under both settings).

The wrappers cost a clock read pair and a few attribute lookups per dispatched event (about 0.5
us): the instrumented loop is slower than a plain run's. The script prints both: the instrumented
loop's time and, with ``--plain``, the event rate of an uninstrumented run of the same config in
the same process beforehand. Results are unaffected (the wrappers only observe): the fingerprint
printed is the run's own.

It imports the emulator from ``--checkout`` (default: the checkout this script belongs to), so
that one script measures two commits alike. Output: a table, and with ``--json PATH`` one JSON
object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# dispatch labels, in the table's order (the op kinds by the engine's own KIND_NAMES)
OP_LABELS = {
    "compute": "compute completion (with the program's launches)",
    "collective": "collective completion, Python heap (closed form)",
    "send": "pipeline send completion",
    "recv": "pipeline receive completion",
}
HANDOVER = "message hand-over (pipeline point-to-point)"
STEP = "collective step, Python message level"
CORE = "message-level collectives (compiled core)"
OPS = "layer blocks (compiled op engine)"
LOOP = "loop and heaps (outside any dispatch)"
AFTER_OPS = "after the op kernels: block ends, resumes (Python)"
AFTER_CORE = "after the message core: receives, steps (Python)"


class Profile:
    """Per-label counters: events, dispatch nanoseconds, and for compiled cores the kernels' part."""

    def __init__(self) -> None:
        self.events: dict[str, int] = {}
        self.ns: dict[str, int] = {}
        self.kernel_ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}  # dispatch calls (a compiled core's call runs many events)
        self.depth = 0  # dispatch calls open on the event loop's greenlet
        self.loop_ns = 0  # inside run_until, all of it
        self.loop_cpu_s = 0.0  # process CPU seconds inside run_until
        self.main = None  # the event loop's greenlet

    def add(self, label: str, events: int, ns: int) -> None:
        self.events[label] = self.events.get(label, 0) + events
        self.calls[label] = self.calls.get(label, 0) + 1
        self.ns[label] = self.ns.get(label, 0) + ns


def install(profile: Profile) -> None:
    """Wrap the shard's dispatch methods (class attributes: every shard of this process)."""
    from greenlet import getcurrent

    from emulator.engine import netcore, ops, shard

    clock = time.perf_counter_ns
    kind_names = ops.KIND_NAMES
    Shard = shard.Shard

    def outermost() -> bool:
        # a dispatch called by the loop itself, not nested in another nor from a rank program
        return profile.depth == 0 and getcurrent() is profile.main

    orig_run_until = Shard.run_until

    def run_until(self, horizon):
        profile.main = getcurrent()
        cpu0, t0 = time.process_time(), clock()
        try:
            return orig_run_until(self, horizon)
        finally:
            profile.loop_ns += clock() - t0
            profile.loop_cpu_s += time.process_time() - cpu0

    def timed(orig, label_of, events=1):
        # one dispatch the loop makes: an event (or, with events=0, Python after a compiled core's call)
        def wrapper(self, *args, **kwargs):
            if not outermost():
                return orig(self, *args, **kwargs)
            profile.depth += 1
            t0 = clock()
            try:
                return orig(self, *args, **kwargs)
            finally:
                profile.depth -= 1
                profile.add(label_of(args), events, clock() - t0)

        return wrapper

    def op_label(args) -> str:
        name = kind_names[args[1].kind]
        return OP_LABELS.get(name, name + " completion")

    def timed_as(orig, label):
        return timed(orig, lambda args: label, events=0)

    def core_run(kernel_cls, label):
        orig = kernel_cls.run

        def wrapper(core, *args):
            if not outermost():
                return orig(core, *args)
            before = core.events
            profile.depth += 1
            t0 = clock()
            try:
                return orig(core, *args)
            finally:
                profile.depth -= 1
                ns = clock() - t0
                profile.add(label, core.events - before, ns)
                profile.kernel_ns[label] = profile.kernel_ns.get(label, 0) + ns

        kernel_cls.run = wrapper

    Shard.run_until = run_until
    Shard._complete = timed(Shard._complete, op_label)
    Shard._step = timed(Shard._step, lambda args: STEP)
    Shard._handover = timed(Shard._handover, lambda args: HANDOVER)

    def counted(orig, label, counter, kernel_cls):
        # a call into a compiled core: the events it processed (its counter's growth), the kernels'
        # time (the core's run method) and the Python that follows in the same call
        orig_kernel = kernel_cls.run

        def kernel(core, *args):
            if profile.depth != 1 or getcurrent() is not profile.main:
                return orig_kernel(core, *args)
            t0 = clock()
            try:
                return orig_kernel(core, *args)
            finally:
                profile.kernel_ns[label] = profile.kernel_ns.get(label, 0) + clock() - t0

        kernel_cls.run = kernel

        def wrapper(self, *args):
            if not outermost():
                return orig(self, *args)
            core = counter(self)
            before = core.events
            profile.depth += 1
            t0 = clock()
            try:
                return orig(self, *args)
            finally:
                profile.depth -= 1
                profile.add(label, core.events - before, clock() - t0)

        return wrapper

    if hasattr(Shard, "_ops_stopped"):
        # the compiled per-op engine's loop calls both cores' run methods itself (no _run_ops /
        # _run_core frame around them): each call is a dispatch of its own, the events its core
        # processed in it and its kernel time; what the loop does after it is timed apart below
        from emulator.engine import opcore

        core_run(netcore.NetCore, CORE)
        core_run(opcore.OpCore, OPS)
        Shard._run_core = counted(Shard._run_core, CORE, lambda s: s.core, netcore.NetCore)
        after = {"block": False}
        block_done = opcore.OpCore.block_done

        def noted(core):
            after["block"] = outermost()
            return block_done(core)

        opcore.OpCore.block_done = noted

        def block_end(complete):
            def wrapper(self, gpu, op, t, *args, **kwargs):
                # a block's end, after the kernels: the proxy's completion (not an event of its own)
                if not after["block"]:
                    return complete(self, gpu, op, t, *args, **kwargs)
                after["block"] = False
                profile.depth += 1
                t0 = clock()
                try:
                    return complete(self, gpu, op, t, *args, **kwargs)
                finally:
                    profile.depth -= 1
                    profile.add(AFTER_OPS, 0, clock() - t0)

            return wrapper

        Shard._complete = block_end(Shard._complete)
        if hasattr(Shard, "_complete_compiled"):  # the variant such a shard binds (Shard.dedicated)
            Shard._complete_compiled = block_end(timed(Shard._complete_compiled, op_label))
        Shard._ops_stopped = timed_as(Shard._ops_stopped, AFTER_OPS)
        Shard._core_receive = timed_as(Shard._core_receive, AFTER_CORE)
        Shard._core_stopped = timed_as(Shard._core_stopped, AFTER_CORE)
        return
    Shard._run_core = counted(Shard._run_core, CORE, lambda s: s.core, netcore.NetCore)
    if hasattr(Shard, "_run_ops"):  # the compiled per-op engine (issue 24); absent before it
        from emulator.engine import opcore

        Shard._run_ops = counted(Shard._run_ops, OPS, lambda s: s.ops_core, opcore.OpCore)


def load(config_path: str, overrides: list[str]):
    from emulator.config.loader import load_run

    try:
        from emulator.runner.sequence import execute
    except ImportError:  # before the runner package (b6dd35e and earlier)
        from emulator.run import execute
    return load_run(config_path, overrides), execute


def table(profile: Profile, summary: dict, plain: dict | None) -> tuple[list[dict], list[str]]:
    total_events = summary["events"]
    rows = []
    order = [*OP_LABELS.values(), HANDOVER, STEP, CORE, AFTER_CORE, OPS, AFTER_OPS]
    labels = [x for x in order if x in profile.events] + sorted(set(profile.events) - set(order))
    dispatched_ns = sum(profile.ns.values())
    for label in labels:
        n, ns = profile.events[label], profile.ns[label]
        row = {"kind": label, "events": n, "calls": profile.calls[label], "share": n / total_events, "s": ns / 1e9,
               "time_share": ns / profile.loop_ns, "us_per_event": ns / 1e3 / n if n else None,
               "events_per_s": n / (ns / 1e9) if ns else None}  # fmt: skip
        if label in profile.kernel_ns:
            row["kernel_s"] = profile.kernel_ns[label] / 1e9
        rows.append(row)
    rest = profile.loop_ns - dispatched_ns
    rows.append({"kind": LOOP, "events": 0, "calls": 0, "share": 0.0, "s": rest / 1e9,
                 "time_share": rest / profile.loop_ns, "us_per_event": None, "events_per_s": None})  # fmt: skip
    counted = sum(profile.events.values())
    lines = [f"{'event kind':<52} {'events':>10} {'calls':>9} {'share':>6} {'loop s':>8} {'time %':>6} {'us/event':>8} "
             f"{'events/s':>10}  kernels s"]  # fmt: skip
    for r in rows:
        us = "-" if r["us_per_event"] is None else f"{r['us_per_event']:.2f}"
        rate = "-" if r["events_per_s"] is None else f"{r['events_per_s']:.0f}"
        kernel = f"{r['kernel_s']:.2f}" if "kernel_s" in r else "-"
        lines.append(f"{r['kind']:<52} {r['events']:>10} {r['calls']:>9} {100 * r['share']:>5.1f}% {r['s']:>8.2f} "
                     f"{100 * r['time_share']:>5.1f}% {us:>8} {rate:>10}  {kernel}")  # fmt: skip
    loop_s = profile.loop_ns / 1e9
    lines.append(f"{'event loop (run_until), instrumented':<52} {counted:>10} {'':>9} {'':>6} {loop_s:>8.2f} "
                 f"{'':>6} {1e6 * loop_s / counted:>8.2f} {counted / loop_s:>10.0f}  "
                 f"CPU {profile.loop_cpu_s:.2f} s")  # fmt: skip
    if counted != total_events:  # a failed GPU's events are popped and skipped, not dispatched
        lines.append(f"(summary.json counts {total_events} events; {total_events - counted} were not dispatched)")
    lines.append(f"run: {summary['events']} events, wall {summary['wall_time_s']:.2f} s, "
                 f"{summary['events_per_s']:.0f} events/s (summary.json, instrumented), "
                 f"fingerprint {summary.get('fingerprint', '-')}")  # fmt: skip
    if plain is not None:
        lines.append(f"plain run (no wrappers, same process, before): wall {plain['wall_time_s']:.2f} s, "
                     f"{plain['events_per_s']:.0f} events/s (summary.json); "
                     f"instrumented/plain wall {summary['wall_time_s'] / plain['wall_time_s']:.3f}")  # fmt: skip
    return rows, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="a run file (configs/runs/*.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override")
    parser.add_argument("--shards", type=int, default=1, help="in-process shards (default 1)")
    parser.add_argument("--checkout", type=Path, default=ROOT,
                        help="the checkout whose emulator is imported (default: this script's)")  # fmt: skip
    parser.add_argument(
        "--plain",
        action="store_true",
        help="first run the config once without the wrappers (its events/s, for the overhead)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as one JSON object here")
    args = parser.parse_args()
    checkout = args.checkout.resolve()
    sys.path.insert(0, str(checkout))
    import emulator

    if Path(emulator.__file__).resolve().parents[1] != checkout:
        raise SystemExit(f"emulator imported from {emulator.__file__}, not from --checkout {checkout}")
    from emulator.engine.netcore import warm_up

    warm_up()  # the compiled kernels' loading (and the op engine's, where it exists) outside the loop
    if (checkout / "emulator/engine/opcore.py").exists():
        from emulator.engine import opcore

        opcore.warm_up()
    config, execute = load(args.config, args.overrides)
    plain = execute(config, backend="inline", shards=args.shards)[0] if args.plain else None
    profile = Profile()
    install(profile)
    summary = execute(config, backend="inline", shards=args.shards)[0]
    rows, lines = table(profile, summary, plain)
    print(f"# {args.config} {' '.join('--set ' + o for o in args.overrides)} (in-process, {args.shards} shard(s); "
          f"emulator from {checkout})")  # fmt: skip
    print("\n".join(lines))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        keep = ("events", "wall_time_s", "events_per_s", "fingerprint")
        args.json.write_text(json.dumps({
            "config": args.config, "overrides": args.overrides, "shards": args.shards, "checkout": str(checkout),
            "rows": rows, "loop_s": profile.loop_ns / 1e9, "loop_cpu_s": profile.loop_cpu_s,
            "summary": {k: summary.get(k) for k in keep},
            "plain": None if plain is None else {k: plain.get(k) for k in keep},
        }) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
