"""The run sequence (emulator/runner/sequence.py): one path for ``emulator run`` and ``emulator.run``, and what a
run that stops early (Ctrl-C, a program error, OOM) leaves in its run directory."""

from __future__ import annotations

import csv
import json
import textwrap
from pathlib import Path

import pytest

from emulator.cli import main
from emulator.config.loader import load_run
from emulator.errors import ProgramError
from emulator.runner.sequence import run_job

PROGRAM = textwrap.dedent('''
    def stops(gpu):
        """Compute and a gradient all-reduce per iteration; rank 3 stops after two with ``STOP``."""
        for i in range(6):
            gpu.compute("work", flops=1e12)
            gpu.all_reduce(8 << 20)
            gpu.mark_iteration()
            gpu.synchronize()  # the program waits for its GPU here: the stop comes mid-run
            if i == 1 and gpu.rank == 3:
                raise STOP
''')


def _run_file(tmp_path: Path, stop: str) -> Path:
    (tmp_path / "stops.py").write_text(f"STOP = {stop}\n" + PROGRAM)
    run = tmp_path / "stops.yaml"
    run.write_text("name: stops\ncluster: {from: dgx-a100-hdr, nodes: 2}\nprogram: stops.py:stops\n")
    return run


def _rows(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("shards", [1, 2])
def test_ctrl_c_keeps_what_the_run_reached(tmp_path, capsys, shards):
    """Ctrl-C mid-run (here raised by a rank's program): exit 130, ``status: interrupted`` and every
    table so far - each rank's figures up to where it stopped, the links' traffic."""
    out = tmp_path / "run"
    rc = main(["run", str(_run_file(tmp_path, "KeyboardInterrupt")), "--out", str(out), "--quiet",
               "--shards", str(shards)])  # fmt: skip
    assert rc == 130
    assert capsys.readouterr().err.strip().splitlines() == ["error: interrupted"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"] == "interrupted"
    assert summary["ranks_missing"] == 0 and summary["world_size"] == 16
    assert 0 < summary["virtual_time_reached_s"] < 1
    ranks = _rows(out / "ranks.csv")
    assert len(ranks) == 16
    assert all(int(r["iterations"]) >= 1 for r in ranks)  # everyone got through the first iteration
    assert sum(int(r["bytes"]) for r in _rows(out / "links.csv")) > 0


def test_program_error_keeps_the_tables(tmp_path, capsys):
    """A program that raises is a one-line error (exit 2) with ``status: failed`` and the tables."""
    out = tmp_path / "run"
    assert main(["run", str(_run_file(tmp_path, "ValueError('bad batch')")), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: rank 3: program raised ValueError: bad batch")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"] == err[0][len("error: "):]
    assert len(_rows(out / "ranks.csv")) == 16 and (out / "trace.json").is_file()


class FakeMonitor:
    """What the run sequence hands a monitor: observing, then the final figures once."""

    active = True

    def __init__(self):
        self.updates, self.finished = 0, []

    def update(self, rounds, virtual_time_ns, shard_stats):
        self.updates += 1

    def finish(self, summary, result=None):
        self.finished.append((summary, result))


def test_monitor_gets_the_end_of_a_failed_run(tmp_path):
    """The monitor hears why a run ended (status and error) with the partial results."""
    config = load_run(_run_file(tmp_path, "ValueError('bad batch')"))
    monitor = FakeMonitor()
    with pytest.raises(ProgramError):
        run_job(config, monitor=monitor)
    (summary, result), = monitor.finished
    assert summary["status"] == "failed" and "bad batch" in summary["error"]
    assert result is not None and len(result.ranks) == 16


def test_monitor_gets_a_completed_run(tmp_path):
    run = tmp_path / "pp.yaml"
    run.write_text("cluster: {from: dgx-a100-hdr, nodes: 2}\nprogram: "
                   f"{Path(__file__).parents[3] / 'configs/examples/programs.py'}:ping_pong\n")  # fmt: skip
    monitor = FakeMonitor()
    done = run_job(load_run(run), monitor=monitor)
    (summary, result), = monitor.finished
    assert summary is done.summary and result is done.result and summary["status"] == "completed"


def test_a_run_this_host_cannot_hold_is_refused_before_it_starts(tmp_path, capsys):
    """800,000 GPUs: one line naming the host memory it would need, exit 2, nothing written."""
    out = tmp_path / "run"
    rc = main(["run", str(Path(__file__).parents[3] / "configs/runs/bloom-560m-zero2.yaml"), "--out", str(out),
               "--set", "cluster.nodes=100000", "--set", "parallel.data=800000",
               "--set", "training.global_batch_size=3200000"])  # fmt: skip
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the run needs ~") and "800000 GPUs" in err[0]
    assert not out.exists()


def test_one_topology_per_run_and_no_import_circle(tmp_path, monkeypatch):
    """``emulator run`` with live figures builds the topology once (run, monitor, results share
    it), and the results package does not import the run sequence (api -> run -> results, one way)."""
    import subprocess
    import sys

    import netmodel.topology

    built = []
    original = netmodel.topology.Topology.__init__

    def counting(self, cluster, *args, **kwargs):
        built.append(cluster.world_size)  # (the kernels' warm-up builds a one-node topology of its own)
        original(self, cluster, *args, **kwargs)

    monkeypatch.setattr(netmodel.topology.Topology, "__init__", counting)
    run = Path(__file__).parents[3] / "configs/examples/ping-pong.yaml"
    assert main(["run", str(run), "--out", str(tmp_path / "pp"), "--set", "program_args.iterations=1"]) == 0
    assert built.count(256) == 1
    code = "import sys, emulator.results.rundir, emulator.reports.run_report; print('emulator.run' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


@pytest.mark.parametrize("stop", [None, "KeyboardInterrupt"])
def test_the_collector_is_left_as_it_was(tmp_path, capsys, stop):
    """run_job keeps the collector aside during the run and the writing (emulator/runner/sequence.py),
    and gives it back as it found it, after a completed run and after one that stopped; the command
    line called with its words (as here, or from a script) freezes nothing when it ends."""
    import gc

    before = gc.get_threshold(), gc.isenabled(), gc.get_freeze_count()
    run = _run_file(tmp_path, stop or "None")
    if stop is None:
        (tmp_path / "stops.py").write_text("STOP = None\n" + PROGRAM.replace("raise STOP", "pass"))
        run_job(load_run(run), out=tmp_path / "job")
        assert (tmp_path / "job" / "trace.json").is_file()
    else:
        with pytest.raises(KeyboardInterrupt):
            run_job(load_run(run), out=tmp_path / "job")
    assert (gc.get_threshold(), gc.isenabled(), gc.get_freeze_count()) == before
    assert main(["run", str(run), "--quiet", "--metrics-grace-s", "0", "--out", str(tmp_path / "cli")]) in (0, 130)
    assert (gc.get_threshold(), gc.isenabled(), gc.get_freeze_count()) == before
