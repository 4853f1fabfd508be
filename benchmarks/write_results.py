"""How long a finished run's results take to write: the fingerprint and the whole run directory.

    python benchmarks/write_results.py configs/runs/megatron-1t-3072gpu.yaml               # emulates, then times
    python benchmarks/write_results.py configs/runs/megatron-1t-3072gpu.yaml --save runs/ref.pickle
    python benchmarks/write_results.py --load runs/ref.pickle --repeat 5                  # times only

The run is emulated once (or its results loaded from ``--save``'s pickle, so that another
checkout of the emulator can time the same results: ``PYTHONPATH=<checkout> python ...``); then
the fingerprint (emulator/engine/result.py) and ``write_results`` (emulator/results/rundir.py:
config.yaml, summary.json, every CSV table, trace.json) are timed ``--repeat`` times, each into a
fresh directory, and the medians printed: wall time, and the process's CPU time (user + system,
``time.process_time``), the steadier figure on a shared machine. The run's own wall time is not in
these figures.
"""

from __future__ import annotations

import argparse
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_file", nargs="?", help="run file to emulate (not with --load)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    parser.add_argument("--save", help="also pickle the run's results here")
    parser.add_argument("--load", help="time the results pickled by --save instead of emulating")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    from emulator.config.loader import load_run
    from emulator.engine.result import fingerprint
    from emulator.results.rundir import write_results
    from emulator.runner.sequence import execute, prepare

    if args.load:
        with open(args.load, "rb") as f:
            run_file, overrides, summary, result = pickle.load(f)
        config = load_run(run_file, overrides)
        topo = prepare(config).topo
    else:
        if not args.run_file:
            parser.error("give a run file or --load")
        run_file, overrides = args.run_file, args.overrides
        config = load_run(run_file, overrides)
        prepared = prepare(config)
        summary, result, topo = execute(config, trace_ranks=prepared.trace_ranks, topo=prepared.topo)
        print(f"emulated: {summary['events']} events in {summary['wall_time_s']:.1f} s")
        if args.save:
            with open(args.save, "wb") as f:
                pickle.dump((run_file, overrides, summary, result), f)
    digest, write, digest_cpu, write_cpu = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            start, cpu = time.perf_counter(), time.process_time()
            value = fingerprint(result)
            digest.append(time.perf_counter() - start)
            digest_cpu.append(time.process_time() - cpu)
            out = Path(tmp) / f"run{i}"
            start, cpu = time.perf_counter(), time.process_time()
            write_results(out, config, summary, result, topo)
            write.append(time.perf_counter() - start)
            write_cpu.append(time.process_time() - cpu)
            shutil.rmtree(out)
    print(f"fingerprint {value}: {statistics.median(digest):.3f} s; run directory: {statistics.median(write):.3f} s "
          f"(medians of {args.repeat}; fingerprint runs {', '.join(f'{t:.3f}' for t in digest)}; "
          f"writes {', '.join(f'{t:.3f}' for t in write)})")  # fmt: skip
    both = [a + b for a, b in zip(digest_cpu, write_cpu, strict=True)]
    print(f"CPU time: fingerprint {statistics.median(digest_cpu):.3f} s; "
          f"run directory {statistics.median(write_cpu):.3f} s; "
          f"both {statistics.median(both):.3f} s "
          f"(medians of {args.repeat}; writes {', '.join(f'{t:.3f}' for t in write_cpu)})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
