"""Command line: ``emulator run | torchrun | check | sweep | plan | goodput | collbench | validate | report | compare``.

User errors print one line (``error: ...``) and exit with code 2; success exits 0.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from pathlib import Path

from emulator.engine.gc_tuning import tune_process
from emulator.errors import EmulatorError


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_file", help="run file (YAML)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override any config value, e.g. --set cluster.nodes=2 (repeatable)")  # fmt: skip
    p.add_argument("--program", help="run this program (path.py:function) instead of the file's")


def _add_metrics_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve live Prometheus metrics on this port during the run (deploy/ scrapes 9431)",
    )
    p.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address the metrics endpoint binds to (default 127.0.0.1; 0.0.0.0 for every interface)",
    )
    p.add_argument("--metrics-grace-s", type=float, default=30.0, metavar="SECONDS",
                   help="keep the metrics endpoint up this long after the run so the final values are scraped "
                        "(default 30)")  # fmt: skip


# the commands whose parsers are defined in this file: `emulator run ...` builds its own parser
# without importing the studies and the capture (about 30 ms of imports a run does not use)
_OWN = ("run", "report", "compare", "sweep", "check", "collbench", "validate")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser; ``command`` one of ``_OWN``: only what parsing that command
    needs (the same options and messages for it), without importing the other commands' modules."""
    parser = argparse.ArgumentParser(prog="emulator", description="Emulate GPU training clusters on virtual GPUs.")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a training job or program on the emulated cluster")
    _add_config_args(run)
    run.add_argument("--out", type=Path, help="run directory (default runs/<time>-<name>)")
    run.add_argument("--backend", default="inline", help="inline (default) or ray")
    run.add_argument("--shards", type=int, default=1, help="number of shards (Ray actors, or in-process)")
    run.add_argument("--address", help="Ray cluster address: auto or HOST:PORT (default: start a local Ray)")
    run.add_argument("--quiet", action="store_true", help="print only the summary line (no progress bar)")
    _add_metrics_args(run)
    run.add_argument("--trace-ranks", default="default", metavar="RANKS",
                     help="ranks in trace.json: 0-7,64 | all | none (default: the first node's GPUs)")  # fmt: skip
    run.add_argument("--wandb", action="store_true", help="also log the run to Weights & Biases (needs wandb)")

    report = sub.add_parser("report", help="plots of a run directory in one self-contained HTML page")
    report.add_argument("run_dir", type=Path)
    report.add_argument("--out", type=Path, help="HTML file (default RUN_DIR/report.html); PNGs go beside it")

    compare = sub.add_parser("compare", help="config and result changes between two run directories")
    compare.add_argument("run_a", type=Path)
    compare.add_argument("run_b", type=Path)
    compare.add_argument("--json", action="store_true", help="print every figure as JSON")

    sweep = sub.add_parser("sweep", help="run many points of one base run in parallel (grid or list)")
    sweep.add_argument("sweep_file", help="sweep file (YAML): base run file and grid or points")
    sweep.add_argument("--out", type=Path, help="sweep directory (default runs/sweep-<name>)")
    sweep.add_argument("--workers", type=int, help="points run at once on this machine (default: the cores)")
    sweep.add_argument("--backend", default="inline", help="inline (local worker processes, default) or ray")
    sweep.add_argument("--address", help="Ray cluster address: auto or HOST:PORT (default: start a local Ray)")
    sweep.add_argument("--timeout-s", type=float, metavar="SECONDS", help="stop a point running longer than this")
    sweep.add_argument("--force", action="store_true", help="rerun the points already in sweep.csv")
    sweep.add_argument("--quiet", action="store_true", help="print only the final table")
    _add_metrics_args(sweep)

    if command not in _OWN:
        from emulator.studies.goodput import add_goodput_parser
        from emulator.studies.plan import add_plan_parser

        add_plan_parser(sub)
        add_goodput_parser(sub)

        from emulator.capture.torchrun import add_torchrun_parser

        add_torchrun_parser(sub)

    check = sub.add_parser("check", help="validate a run file without running it")
    _add_config_args(check)

    bench = sub.add_parser("collbench", help="nccl-tests-style collective benchmark")
    bench.add_argument("--cluster", required=True, help="cluster file or preset name")
    bench.add_argument("--op", default="all_reduce")
    bench.add_argument("--gpus", type=int, required=True, help="run on the first N GPUs")
    bench.add_argument("--algo", help="collective algorithm (default: the tier's)")
    bench.add_argument("--min-bytes", default="8")
    bench.add_argument("--max-bytes", default="128M")
    bench.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    bench.add_argument("--slow-link", dest="slow_links", action="append", default=[], metavar="NAME=FACTOR",
                       help="degrade a link (links.csv name), a NIC (node1.nic0) or a tier to FACTOR of its "
                            "bandwidth (repeatable)")  # fmt: skip
    bench.add_argument("--json", action="store_true", help="print rows as JSON")

    validate = sub.add_parser("validate", help="compare predictions with published measurements")
    validate.add_argument("--json", action="store_true")
    validate.add_argument("--only", help="run only the cases whose name contains this text")
    return parser


def _load(args):
    from emulator.config.loader import load_run

    overrides = list(args.overrides)
    if args.program:
        overrides.append(f"program={args.program}")
    return load_run(args.run_file, overrides)


def _start_monitor(args, config, out_dir: Path, topo):
    """Live figures for ``emulator run``: Prometheus exporter (``--metrics-port``), progress bar;
    None where nothing would consume them (``--quiet`` without ``--metrics-port``: the monitor
    would be inactive, see ``Monitor.active``), so that the run does not build the live state and
    its work plan (each stage's segments) nor import the monitoring package."""
    if args.quiet and args.metrics_port is None:
        return None
    from emulator.monitoring import Monitor
    from emulator.monitoring.progress import ProgressDisplay

    return Monitor(config, run_id=out_dir.name, backend=args.backend, shards=args.shards, port=args.metrics_port,
                   host=args.metrics_host, progress=ProgressDisplay.choose_mode(args.quiet), topo=topo)  # fmt: skip


def cmd_run(args) -> int:
    return _run_config(args, _load(args))


def cmd_torchrun(args) -> int:
    """Capture the script's ranks (or reuse the cached capture), then replay them like ``emulator run``."""
    from emulator.capture.torchrun import capture, replay_config

    captured = capture(args.script, list(args.script_args), args.nnodes, args.nproc_per_node, args.cluster,
                       args.capture, args.workers, args.recapture, args.quiet, args.backend, args.address)  # fmt: skip
    if not args.quiet:
        print(captured.describe(), file=sys.stderr, flush=True)
    args.wandb = False
    return _run_config(args, replay_config(captured, args.nnodes, args.nproc_per_node, args.overrides))


def _run_config(args, config) -> int:
    """Run ``config`` with the run options of ``args``; print the result line (emulator run's)."""
    from emulator.runner.sequence import default_out_dir, prepare, run_job

    prepared = prepare(config, args.backend, args.shards, args.trace_ranks)
    if args.wandb:
        from emulator.results.wandb_log import require_wandb

        require_wandb()  # fail before the run, not after it
    out = args.out or default_out_dir(config.name)
    monitor = _start_monitor(args, config, out, prepared.topo)
    try:
        done = run_job(config, out=out, backend=args.backend, shards=args.shards, address=args.address,
                       monitor=monitor, prepared=prepared)  # fmt: skip
    except EmulatorError as exc:
        # the run's own end (deadlock, OOM, a lost shard): say why now, then keep the endpoint up
        # so that Prometheus scrapes the final figures and the status, as after a completed run
        print(f"error: {exc}", file=sys.stderr, flush=True)
        _linger(monitor, args)
        return exc.exit_code
    except KeyboardInterrupt:
        # the run directory and the endpoint say "interrupted" with what was reached; a second
        # Ctrl-C ends the grace period at once
        print("error: interrupted", file=sys.stderr, flush=True)
        _linger(monitor, args)
        return 130
    except BaseException:
        if monitor is not None:
            monitor.close()  # a bug, with its traceback: no waiting
        raise
    summary = done.summary
    if args.wandb:
        from emulator.results.wandb_log import log_run

        url = log_run(done.tables, str(done.run_dir))
        print(f"wandb: {url or 'logged (offline)'}")
    it = summary.get("iteration_time_s")
    line = (
        f"{config.name}: {summary['world_size']} GPUs, virtual {summary['sim_time_s']:.6f} s in "
        f"{summary['wall_time_s']:.2f} s wall ({summary['events']} events)"
        + (f", iteration {it:.4f} s" if it else "")
        + (f", MFU {summary['mfu']:.3f}" if summary.get("mfu") is not None else "")
        + f" -> {done.run_dir}/summary.json"
    )
    print(line, flush=True)
    for job in summary.get("jobs", []):  # a run with jobs: each job's own figures (emulator/runner/jobs.py)
        it, mfu = job.get("iteration_time_s"), job.get("mfu")
        print(f"  job {job['name']}: {job['world_size']} GPUs" + (f", iteration {it:.4f} s" if it else "")
              + (f", MFU {mfu:.3f}" if mfu is not None else ""), flush=True)  # fmt: skip
    _linger(monitor, args)  # then stops the metrics endpoint
    return 0


def _linger(monitor, args) -> None:
    """The monitor's grace period (``Monitor.linger``), where there is a monitor."""
    if monitor is not None:
        monitor.linger(args.metrics_grace_s, quiet=args.quiet)


def cmd_check(args) -> int:
    from emulator.runner.budget import estimate

    config = _load(args)
    if config.program is not None:
        from emulator.workloads.programs import check_program

        check_program(config.program)  # exists and defines the function; parsed, never executed
    # one line, the estimate after the verdict: scripts read the first line, the stage table follows
    print(f"{args.run_file}: ok ({config.cluster.world_size} GPUs); {estimate(config).describe()}")
    if config.model is not None:
        from emulator.workloads.memory import memory_report

        print(memory_report(config))
    return 0


def cmd_sweep(args) -> int:
    from emulator.studies.sweep import format_rows, run_sweep

    metrics = None
    if args.metrics_port is not None:
        from emulator.monitoring.sweep_metrics import SweepMetrics

        run_id = args.out.name if args.out else f"sweep-{Path(args.sweep_file).stem}"
        metrics = SweepMetrics(run_id, str(args.sweep_file), args.metrics_port, args.metrics_host)
    try:
        out, rows = run_sweep(args.sweep_file, out=args.out, workers=args.workers, backend=args.backend,
                              address=args.address, timeout_s=args.timeout_s, force=args.force, quiet=args.quiet,
                              metrics=metrics)  # fmt: skip
        print(format_rows(rows))
        print(f"{len(rows)} points ({sum(r['status'] == 'ok' for r in rows)} ok) -> {out}/sweep.csv", flush=True)
        if metrics is not None:
            metrics.exporter.serve_for(args.metrics_grace_s, args.quiet)
    finally:
        if metrics is not None:
            metrics.close()
    return 0


def cmd_plan(args) -> int:
    from emulator.studies.plan import cmd_plan as plan

    return plan(args)


def cmd_goodput(args) -> int:
    from emulator.studies.goodput import cmd_goodput as goodput

    return goodput(args)


def cmd_collbench(args) -> int:
    from emulator.config.loader import load_cluster
    from emulator.studies.collbench import collbench, format_table, parse_size, sizes_between

    cluster = load_cluster(args.cluster, args.overrides)
    sizes = sizes_between(parse_size(args.min_bytes), parse_size(args.max_bytes))
    rows = collbench(cluster, args.op, args.gpus, args.algo, sizes, args.slow_links)
    if args.json:
        print(json.dumps([{k: r[k] for k in ("size_bytes", "time_us", "algbw_GBps", "busbw_GBps")} for r in rows]))
    else:
        print(format_table(rows, args.op, args.gpus, args.algo))
    return 0


def cmd_validate(args) -> int:
    from emulator.studies.validate import format_report, run_validation

    rows = run_validation(args.only)
    print(json.dumps(rows, indent=2) if args.json else format_report(rows))
    return 0


def cmd_report(args) -> int:
    from emulator.reports.run_report import write_report

    page, pngs = write_report(args.run_dir, args.out)
    print(f"{page} ({len(pngs)} plots: {', '.join(p.name for p in pngs)})")
    return 0


def cmd_compare(args) -> int:
    from emulator.results.compare import compare, format_comparison

    cmp = compare(args.run_a, args.run_b)
    print(json.dumps(cmp, indent=2) if args.json else format_comparison(cmp))
    return 0


COMMANDS = {
    "run": cmd_run, "torchrun": cmd_torchrun, "check": cmd_check, "sweep": cmd_sweep, "plan": cmd_plan,
    "goodput": cmd_goodput, "collbench": cmd_collbench, "validate": cmd_validate, "report": cmd_report,
    "compare": cmd_compare,
}  # fmt: skip


def _end_process(code: int) -> None:
    """End the command line's own process now with ``code``, as Python's exit would (the threads
    that are not daemons joined, the ``atexit`` handlers run, the output streams flushed) but without
    its teardown, which clears every module and frees the objects they hold one by one (the engine's,
    numba's, LLVM's: ~0.05 s of CPU after the straggler run, for nothing). Where a stream cannot be
    flushed (a reader gone), it returns, and Python's own exit says so as before."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()  # (a kernel compile in netcore's warm-up thread: its cache written)
    atexit._run_exitfuncs()  # (runs each handler once: Python's exit finds none left)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if argv is None and words[:1] == ["run"]:
        # the command line's own run: the collector as the run has it (gc_tuning) from the start -
        # the imports (numba's, the engine's), the config and the topology make objects that live to
        # the end, which the default thresholds walked in ~130 collections finding next to nothing
        # (0.05 s of the straggler run); a caller passing ``argv`` keeps its collector as it was
        tune_process()
    args = build_parser(words[0] if words and words[0] in _OWN else None).parse_args(argv)
    try:
        code = COMMANDS[args.command](args)
        if argv is None:
            # the command line's own process, about to end: what is left (numba's compiled code,
            # the engine's modules) handed to the collector's permanent generation, so that the
            # interpreter's last full collection does not scan it (0.06-0.1 s after the reference
            # run) where _end_process leaves the exit to Python
            gc.freeze()
            _end_process(code)
        return code
    except EmulatorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `emulator check ... | head`: the reader is gone, nothing left to say
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - Python flushes stdout at exit; let it succeed
        return 0


if __name__ == "__main__":
    sys.exit(main())
