"""A lost shard, as a user sees it: ``emulator run --backend ray`` on the local Ray it starts, a
shard's process killed mid-run. The terminal shows our one line and nothing of Ray's; the run
directory keeps a summary.json of what the run reached (status, virtual time, rounds, the shard)."""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, ROOT

pytestmark = [pytest.mark.ray,
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="follows the run's processes in /proc")]

# Ping-pong between the two shards (rank r and r + 16 are on different shards: a round trip per
# iteration); rank 0 (shard 0) writes its process id once ten iterations are done (synchronize: the
# only blocking call; launches run ahead): rounds have run, and the test knows which process to kill.
PROGRAM = """
import os
from pathlib import Path


def main(gpu):
    half = gpu.world_size // 2
    peer = (gpu.rank + half) % gpu.world_size
    for i in range(gpu.args["iterations"]):
        if i == 10 and gpu.rank == 0:
            gpu.synchronize()
            Path(gpu.args["marker"]).write_text(str(os.getpid()))
        gpu.compute("step", duration_ns=1_000_000)
        if gpu.rank < half:
            gpu.send(peer, 1 << 20)
            gpu.recv(peer, 1 << 20)
        else:
            gpu.recv(peer, 1 << 20)
            gpu.send(peer, 1 << 20)
        gpu.mark_iteration()
"""


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat fields after the command name (state, parent, ...), or None when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _family(root: int) -> dict[int, str]:
    """The processes descending from ``root``: {pid: start time} (a pid is reused; pid + start is not)."""
    stats = {int(p.name): _stat(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()}
    found, todo = {}, [root]
    while todo:
        parent = str(todo.pop())
        children = [pid for pid, st in stats.items() if st is not None and st[1] == parent]
        found.update({pid: stats[pid][19] for pid in children})
        todo += children
    return found


def _alive(pid: int, start: str) -> bool:
    st = _stat(pid)
    return st is not None and st[19] == start and st[0] != "Z"


def test_lost_shard_is_one_line_and_keeps_a_partial_summary(tmp_path):
    (tmp_path / "prog.py").write_text(PROGRAM)
    marker, out = tmp_path / "shard0.pid", tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # the CLI starts a local Ray
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "emulator", "run", str(CONFIGS / "examples/data-parallel.yaml"), "--program",
           f"{tmp_path / 'prog.py'}:main", "--set", "cluster.nodes=4", "--set", "program_args.iterations=100000",
           "--set", f"program_args.marker={marker}", "--backend", "ray", "--shards", "2", "--out", str(out),
           "--quiet"]  # fmt: skip  # minutes of rounds, unless a shard is lost
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    family: dict[int, str] = {}  # every process of this run's Ray: none may outlive the run
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and not marker.exists() and time.monotonic() < deadline:
            family.update(_family(proc.pid))
            time.sleep(0.1)
        time.sleep(0.1)  # the pid fully written
        family.update(_family(proc.pid))
        shard0 = int(marker.read_text()) if marker.exists() else None
        assert shard0 in family, (proc.poll(), proc.stderr.read() if proc.poll() is not None else "no marker")
        killed_at = time.monotonic()
        os.kill(shard0, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=60)
        stopped_s = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # the CLI shuts its Ray down on the way out
            proc.communicate(timeout=30)
        deadline = time.monotonic() + 10  # Ray's shutdown at exit: its processes go within seconds
        while any(_alive(pid, start) for pid, start in family.items()) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [pid for pid, start in family.items() if _alive(pid, start)]
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert not left
    assert proc.returncode == 2, stderr
    assert stopped_s < 15
    # one line, ours: no "(raylet) A worker died ...", no Ray warning, no traceback
    assert stdout == "" and len(stderr.splitlines()) == 1, stderr
    line = stderr.splitlines()[0]
    match = re.match(r"error: shard 0 on host (\S+.*) died: ", line)
    assert match, line
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "error: " + summary["error"] == line
    assert summary["lost_shard"] == 0 and summary["lost_shard_host"] == match[1]
    assert summary["backend"] == "ray" and summary["shards"] == 2 and summary["world_size"] == 32
    assert summary["rounds"] >= 10 and summary["cross_shard_messages"] >= 20  # rank 0: 10 round trips
    assert 0.005 < summary["virtual_time_reached_s"] < 10.0  # past half of the ten (1 ms each at least)
    assert (out / "config.yaml").is_file()
    # the shard that survived reported its results so far: its 16 ranks' rows, the lost shard's missing
    assert summary["ranks_missing"] == 16
    with (out / "ranks.csv").open() as f:
        assert sorted(int(row["rank"]) for row in csv.DictReader(f)) == list(range(16, 32))
