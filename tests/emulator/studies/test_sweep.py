"""``emulator sweep``: grid and point lists, statuses per point, rerun skips what is done."""

from __future__ import annotations

import csv
import textwrap
from pathlib import Path

import pytest

from emulator.cli import main
from emulator.errors import ConfigError
from emulator.studies.sweep import format_rows, load_sweep, run_sweep

ROOT = Path(__file__).resolve().parents[3]

PROGRAMS = textwrap.dedent('''
    from pathlib import Path

    def steps(gpu):
        """Compute and an all-reduce per iteration; rank 0 notes each run in the args' log file."""
        if gpu.rank == 0:
            with open(gpu.args["log"], "a") as f:
                f.write(f"{gpu.args['iterations']}\\n")
        for _ in range(gpu.args["iterations"]):
            gpu.compute("work", flops=gpu.args.get("flops", 1e12))
            gpu.all_reduce(gpu.args.get("bytes", 1 << 20))
            gpu.mark_iteration()

    def deadlock(gpu):
        gpu.recv((gpu.rank - 1) % gpu.world_size, 1 << 20)
        gpu.send((gpu.rank + 1) % gpu.world_size, 1 << 20)

    def hog(gpu):
        gpu.alloc(1 << 50, "everything")

    def dies(gpu):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)  # the point's whole process, as the kernel's OOM killer would

    def forever(gpu):
        while True:
            gpu.compute("work", flops=1e9)
            gpu.synchronize()
''')


@pytest.fixture
def base(tmp_path) -> Path:
    (tmp_path / "programs.py").write_text(PROGRAMS)
    run = tmp_path / "base.yaml"
    run.write_text(f"name: base\ncluster: {{from: dgx-a100-hdr, nodes: 2}}\nprogram: programs.py:steps\n"
                   f"program_args: {{iterations: 2, log: {tmp_path / 'log.txt'}}}\n")  # fmt: skip
    return run


def _sweep(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text("base: base.yaml\n" + textwrap.dedent(body))
    return path


def test_grid_is_every_combination_in_file_order(tmp_path, base):
    sweep = load_sweep(_sweep(tmp_path, """
        grid:
          program_args.iterations: [1, 2, 3]
          program_args.bytes: [1024, 2048]
    """))
    assert sweep.knobs == ["program_args.iterations", "program_args.bytes"]
    assert [p.knobs for p in sweep.points][:3] == [
        {"program_args.iterations": 1, "program_args.bytes": 1024},
        {"program_args.iterations": 1, "program_args.bytes": 2048},
        {"program_args.iterations": 2, "program_args.bytes": 1024},
    ]
    assert len(sweep.points) == 6 and len({p.key for p in sweep.points}) == 6


@pytest.mark.parametrize(("body", "message"), [
    ("", "give either grid"),
    ("grid: {a.b: [1]}\npoints: [{a.b: 1}]\n", "not both"),
    ("grid: {program_args.x: []}\n", "non-empty list"),
    ("points: [3]\n", r"points\[0\]: expected a mapping"),
    ("grid: {a: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]}\n" * 1 + "colour: red\n", "unknown key 'colour'"),
    ("grid: {" + ", ".join(f"k{i}: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]" for i in range(6)) + "}\n", "more than 100000"),
])  # fmt: skip
def test_bad_sweep_files_are_one_line(tmp_path, base, body, message):
    with pytest.raises(ConfigError, match=message):
        load_sweep(_sweep(tmp_path, body))


def test_empty_and_missing_base(tmp_path):
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        load_sweep(tmp_path / "empty.yaml")
    with pytest.raises(ConfigError, match="no run file 'base.yaml'"):
        load_sweep(_sweep(tmp_path, "points: [{program_args.iterations: 1}]\n"))


def test_every_status_and_rerun_skips_what_is_done(tmp_path, base):
    """ok, invalid, oom, deadlock, timeout side by side; none stops the sweep. The same command
    again runs nothing; --force runs every point again; timeouts always run again."""
    prog = tmp_path / "programs.py"
    sweep = _sweep(tmp_path, f"""
        points:
          - {{program_args.iterations: 1}}
          - {{program_args.iterations: 3}}
          - {{cluster.nodes: 0}}
          - {{program: "{prog}:hog"}}
          - {{program: "{prog}:deadlock"}}
          - {{program: "{prog}:forever"}}
    """)
    out = tmp_path / "out"
    _, rows = run_sweep(sweep, out=out, workers=2, timeout_s=8, quiet=True)
    assert [r["status"] for r in rows] == ["ok", "ok", "invalid", "oom", "deadlock", "timeout"]
    assert "cluster.nodes must be >= 1" in rows[2]["reason"] and "out of memory on rank" in rows[3]["reason"]
    assert "deadlock" in rows[4]["reason"] and "after 8 s" in rows[5]["reason"]
    assert rows[1]["iteration_time_s"] == pytest.approx(rows[0]["iteration_time_s"], rel=1e-3)  # the same steps
    log = tmp_path / "log.txt"
    assert sorted(log.read_text().split()) == ["1", "3"]
    with (out / "sweep.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["status"] for r in table] == [r["status"] for r in rows]
    assert table[0]["program_args.iterations"] == "1" and table[2]["cluster.nodes"] == "0"

    _, again = run_sweep(sweep, out=out, workers=2, timeout_s=1, quiet=True)  # only the timeout reruns
    assert sorted(log.read_text().split()) == ["1", "3"]
    assert [r["status"] for r in again] == [r["status"] for r in rows]
    run_sweep(sweep, out=out, workers=2, timeout_s=1, force=True, quiet=True)
    assert sorted(log.read_text().split()) == ["1", "1", "3", "3"]
    lines = format_rows(again).splitlines()
    assert "deadlock" in lines[5] and lines[0].split()[:2] == ["point", "program_args.iterations"]


def test_cli_sweep(tmp_path, base, capsys):
    sweep = _sweep(tmp_path, "grid: {program_args.iterations: [1, 2]}\n")
    assert main(["sweep", str(sweep), "--out", str(tmp_path / "o"), "--quiet", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith(f"2 points (2 ok) -> {tmp_path / 'o'}/sweep.csv")
    assert main(["sweep", str(tmp_path / "nope.yaml")]) == 2
    assert capsys.readouterr().err.startswith("error: cannot read config file")


def test_shipped_sweep_loads():
    sweep = load_sweep(ROOT / "configs/sweeps/bloom-560m-batch-zero.yaml")
    assert len(sweep.points) == 8 and all(p.invalid is None for p in sweep.points)


def test_live_metrics_of_a_sweep(tmp_path, base):
    """Points by status, the best point and each point's figures, labelled with the sweep's run."""
    import socket
    import urllib.request

    from emulator.monitoring.sweep_metrics import SweepMetrics

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    metrics = SweepMetrics("sw", "sweep.yaml", port)
    try:
        sweep = _sweep(tmp_path, "points: [{program_args.iterations: 1}, {program_args.flops: 4.0e+12}, "
                                 "{cluster.nodes: 0}]\n")  # fmt: skip
        _, rows = run_sweep(sweep, out=tmp_path / "o", workers=2, quiet=True, metrics=metrics)
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        metrics.close()
    assert 'emulator_sweep_points_total{run="sw"} 3.0' in text
    assert 'emulator_sweep_points{run="sw",status="ok"} 2.0' in text
    assert 'emulator_sweep_points{run="sw",status="invalid"} 1.0' in text
    # point 0 has the quarter-size compute: it is the best
    assert f'emulator_sweep_best_iteration_seconds{{point="0",run="sw"}} {rows[0]["iteration_time_s"]!r}' in text
    assert f'emulator_sweep_point_iteration_seconds{{point="1",run="sw"}} {rows[1]["iteration_time_s"]!r}' in text
    assert "emulator_sweep_point_mfu_ratio{" not in text  # a program has no model FLOPs: no MFU series


def test_a_worker_that_dies_is_a_row(tmp_path, base):
    """A point whose process is killed is an error row; the points around it run on."""
    prog = tmp_path / "programs.py"
    sweep = _sweep(tmp_path, f"""
        points:
          - {{program_args.iterations: 1}}
          - {{program: "{prog}:dies"}}
          - {{program_args.iterations: 2}}
    """)
    _, rows = run_sweep(sweep, out=tmp_path / "out", workers=2, quiet=True)
    assert [r["status"] for r in rows] == ["ok", "error", "ok"]
    assert rows[1]["reason"] == "the point's process ended with exit code -9"
