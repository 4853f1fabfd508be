"""The command line: exit codes, one-line errors, collbench JSON, check's memory table."""

import gc
import json
import subprocess
import sys

import pytest

from emulator.cli import main
from tests.conftest import CONFIGS, ROOT


@pytest.mark.parametrize("example,message", [
    ("deadlock", "error: deadlock: 32 rank(s) blocked forever (wait cycle of 32 ranks: 0 <- 31"),
    ("mismatch", "error: collective mismatch at t="),
    ("oom", "error: out of memory on rank 0"),
])  # fmt: skip
def test_user_errors_exit_2_with_one_line(example, message, capsys, tmp_path):
    """Bug reports are one line on stderr, exit code 2, no traceback."""
    code = main(["run", str(CONFIGS / "examples" / f"{example}.yaml"), "--out", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith(message)
    assert (tmp_path / "config.yaml").is_file()  # written before the run
    summary = json.loads((tmp_path / "summary.json").read_text())  # and what the run reached, after it
    assert summary["status"] == "failed" and "error: " + summary["error"] == err[0]
    assert summary["name"] == example and summary["backend"] == "inline" and summary["world_size"] == 32
    for key in ("virtual_time_reached_s", "rounds", "cross_shard_messages", "wall_time_s"):
        assert key in summary


def test_unknown_key_on_the_command_line_exits_2(capsys):
    code = main(["check", str(CONFIGS / "runs" / "megatron-22b-8gpu.yaml"), "--set", "parallel.tensr=4"])
    assert code == 2
    assert "unknown key 'parallel.tensr'; did you mean 'tensor'?" in capsys.readouterr().err


def test_check_prints_memory_per_stage(capsys):
    assert main(["check", str(CONFIGS / "runs" / "megatron-175b-64gpu.yaml")]) == 0
    out = capsys.readouterr().out
    assert "ok (64 GPUs)" in out and "peak GiB" in out and len(out.strip().splitlines()) == 2 + 8


def test_collbench_json_rows(capsys):
    """--json prints rows with size_bytes, time_us, algbw_GBps, busbw_GBps."""
    args = ["collbench", "--cluster", "dgx-a100-hdr", "--gpus", "8", "--min-bytes", "1M", "--max-bytes", "4M", "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["size_bytes"] for r in rows] == [1 << 20, 2 << 20, 4 << 20]
    assert set(rows[0]) == {"size_bytes", "time_us", "algbw_GBps", "busbw_GBps"}
    assert rows[-1]["busbw_GBps"] == pytest.approx(rows[-1]["algbw_GBps"] * 2 * 7 / 8)


def test_python_dash_m_runs_the_cli(tmp_path):
    """``python -m emulator`` is the ``emulator`` command; success exits 0 and writes summary.json."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "emulator",
            "run",
            str(CONFIGS / "examples" / "ping-pong.yaml"),
            "--out",
            str(out),
            "--quiet",
            "--set",
            "program_args.iterations=1",
        ],  # fmt: skip
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    for key in ("sim_time_s", "wall_time_s", "events", "world_size", "iteration_time_s", "bytes_by_tier",
                "message_size_histogram", "fingerprint"):  # fmt: skip
        assert key in summary


def test_deadlock_keeps_everything_measured_so_far(tmp_path):
    """Every rank ran until it blocked: the run directory has the figures and tables of a finished run."""
    (tmp_path / "stuck.py").write_text(
        "def program(gpu):\n"
        "    gpu.compute('f', duration_ns=5000)\n"
        "    gpu.send(gpu.rank ^ 1, 1 << 20)\n"
        "    gpu.recv(gpu.rank ^ 1, 1 << 20)\n"
        "    gpu.recv(gpu.rank ^ 1, 1 << 20)  # never sent\n"
    )
    out = tmp_path / "run"
    code = main(["run", str(CONFIGS / "examples" / "ping-pong.yaml"), "--program", f"{tmp_path / 'stuck.py'}:program",
                 "--set", "cluster.nodes=2", "--shards", "2", "--out", str(out), "--quiet"])  # fmt: skip
    assert code == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("deadlock: 16 rank(s) blocked forever")
    # every rank computed 5 us, then its partner's message arrived: the time reached is past both
    assert summary["virtual_time_reached_s"] == summary["sim_time_s"] > 5e-6
    assert summary["shards"] == 2 and summary["events"] > 0 and summary["fingerprint"]
    assert summary["messages_by_tier"] == {"pcie": 16, "tor": 0, "spine": 0}
    for table in ("links.csv", "ranks.csv", "trace.json"):
        assert (out / table).is_file()


def test_interrupted_run_keeps_what_it_reached(tmp_path, monkeypatch, capsys):
    """Ctrl-C in the third round: exit 130, summary.json says interrupted after two rounds."""
    from emulator.backends.inline import InlineTransport

    step = InlineTransport.step
    calls = []

    def interrupted(self, work):
        calls.append(work)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return step(self, work)

    monkeypatch.setattr(InlineTransport, "step", interrupted)
    out = tmp_path / "run"
    code = main(["run", str(CONFIGS / "examples" / "data-parallel.yaml"), "--shards", "2", "--out", str(out),
                 "--quiet", "--set", "program_args.iterations=1"])  # fmt: skip
    assert code == 130 and capsys.readouterr().err == "error: interrupted\n"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["error"] == "interrupted"
    assert summary["rounds"] == 2 and summary["virtual_time_reached_s"] > 0
    assert summary["cross_shard_messages"] > 0 and "lost_shard" not in summary


def test_completed_runs_say_so(tmp_path):
    assert main(["run", str(CONFIGS / "examples" / "ping-pong.yaml"), "--out", str(tmp_path), "--quiet",
                 "--set", "program_args.iterations=1"]) == 0  # fmt: skip
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "completed" and "error" not in summary


def test_goodput_on_the_command_line(capsys):
    """``emulator goodput`` is wired: the optimum interval line and one-line errors (exit 2)."""
    run = str(CONFIGS / "runs" / "megatron-1t-3072gpu.yaml")
    args = ["goodput", run, "--iteration-s", "98.19", "--days", "54", "--mtbf-hours", "6335",
            "--checkpoint-every", "10", "--checkpoint-s", "60", "--restart-s", "900"]  # fmt: skip
    assert main(args) == 0
    assert "384 nodes" in capsys.readouterr().out
    assert main([*args[:-2], "--restart-s", "-1"]) == 2
    assert capsys.readouterr().err.startswith("error: --restart-s")


def test_collbench_slow_link(capsys):
    """``--slow-link`` degrades a NIC for collbench: a 1 GiB all-reduce over 16 GPUs drops to the
    quarter-speed NIC's pace (the ring's busbw is its slowest link's)."""
    base = ["collbench", "--cluster", "dgx-a100-hdr", "--gpus", "16", "--min-bytes", "1G", "--max-bytes", "1G",
            "--json"]  # fmt: skip
    assert main(base) == 0
    healthy = json.loads(capsys.readouterr().out)[0]["busbw_GBps"]
    assert main([*base, "--slow-link", "node1.nic0=0.25"]) == 0
    degraded = json.loads(capsys.readouterr().out)[0]["busbw_GBps"]
    assert degraded == pytest.approx(healthy / 4, rel=0.01)


def test_a_command_of_this_file_parses_alike_without_the_studies_imported():
    """``emulator run ...`` builds only what it parses (emulator/cli.py ``_OWN``): the same
    namespace as the whole parser's, and the studies and the capture are not imported for it."""
    from emulator.cli import _OWN, build_parser

    argv = ["run", "configs/examples/ping-pong.yaml", "--quiet", "--set", "a.b=1", "--trace-ranks", "0-3"]
    assert build_parser("run").parse_args(argv) == build_parser().parse_args(argv)
    assert "run" in _OWN and "torchrun" not in _OWN and "plan" not in _OWN
    code = ("import sys; from emulator.cli import build_parser; build_parser('run'); "
            "print(sorted(m for m in sys.modules if m.startswith(('emulator.studies', 'emulator.capture'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_quiet_run_without_metrics_port_builds_no_monitor(tmp_path):
    """``--quiet`` without ``--metrics-port``: nothing would read live figures, so no monitor (nor
    its work plan, nor the monitoring package in a fresh process); the run's files are written."""
    from emulator.cli import _start_monitor, build_parser
    from emulator.config.loader import load_run
    from netmodel.topology import Topology

    path = str(CONFIGS / "examples" / "ping-pong.yaml")
    config = load_run(path)
    topo = Topology(config.cluster)
    quiet = build_parser("run").parse_args(["run", path, "--quiet"])
    assert _start_monitor(quiet, config, tmp_path, topo) is None
    shown = _start_monitor(build_parser("run").parse_args(["run", path]), config, tmp_path, topo)
    assert shown is not None and shown.active
    shown.close()
    code = ("import sys; from emulator.cli import main; code = main(sys.argv[1:]); "
            "assert code == 0 and not any(m.startswith('emulator.monitoring') for m in sys.modules), code")
    subprocess.run([sys.executable, "-c", code, "run", path, "--quiet", "--out", str(tmp_path / "run")],
                   cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    assert (tmp_path / "run" / "trace.json").is_file()


def test_the_command_lines_process_ends_as_pythons_exit_would(tmp_path):
    """cli._end_process (the command line's own process, after its command): the threads that are
    not daemons finish, the atexit handlers run, the output is flushed, the exit code is kept."""
    code = ("import atexit, threading, time; from emulator import cli; "
            "threading.Thread(target=lambda: (time.sleep(0.2), print('thread done'))).start(); "
            "atexit.register(print, 'atexit ran'); print('output', end=' '); cli._end_process(3)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 3 and done.stdout.split() == ["output", "thread", "done", "atexit", "ran"], done
    run = subprocess.run([sys.executable, "-m", "emulator", "run", str(CONFIGS / "examples" / "ping-pong.yaml"),
                          "--quiet", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0 and run.stdout.startswith("ping-pong") and (tmp_path / "trace.json").is_file(), run


def test_the_command_lines_run_tunes_the_collector_from_its_start(tmp_path):
    """``emulator run`` (the command line's own process) raises the collector's first threshold
    before its imports (gc_tuning); main called with ``argv`` leaves the collector as it is."""
    from emulator.engine.gc_tuning import YOUNG_THRESHOLD

    code = ("import atexit, gc, sys; from emulator.cli import main; "
            "atexit.register(lambda: print('threshold', gc.get_threshold()[0])); sys.exit(main())")  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code, "run", str(CONFIGS / "examples" / "ping-pong.yaml"), "--quiet",
                          "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0 and f"threshold {YOUNG_THRESHOLD}" in run.stdout, run
    before = gc.get_threshold()
    assert main(["run", str(CONFIGS / "examples" / "ping-pong.yaml"), "--quiet", "--out", str(tmp_path)]) == 0
    assert gc.get_threshold() == before
