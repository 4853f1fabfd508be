"""deploy/ray's node scripts without starting Ray: the ports of each RAY_PORT_OFFSET, and a stop that
only ever signals the node's own ``ray start`` process.

PYTHONPATH=. python -m pytest -q tests/actors/test_deploy_scripts.py
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT

SCRIPTS = ROOT / "deploy" / "ray"

# every port flag of one node, one per line, as start-head.sh passes them (with the head's own ports)
PORTS = """source "$1/ports.sh"
printf '%s\\n' "--port=$RAY_GCS_PORT" "--dashboard-port=$RAY_DASHBOARD_PORT" \
  "--ray-client-server-port=$RAY_CLIENT_PORT" "${RAY_NODE_PORT_FLAGS[@]}"
"""


def node_flags(offset, tmp_path) -> dict[str, str]:
    env = {**os.environ, "RAY_PORT_OFFSET": str(offset), "TMPDIR": str(tmp_path)}
    env.pop("RAY_NODE_TEMP_DIR", None)
    out = subprocess.run(["bash", "-c", PORTS, "ports", str(SCRIPTS)], env=env, capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    return dict(line.split("=", 1) for line in out.split() if "=" in line)


def ports_of(flags: dict[str, str]) -> set[int]:
    ports = {int(v) for k, v in flags.items() if k.endswith("port") and not k.endswith("-worker-port")}
    return ports | set(range(int(flags["--min-worker-port"]), int(flags["--max-worker-port"]) + 1))


def test_offsets_give_four_nodes_disjoint_ports(tmp_path):
    """Offset 0 is the README's port table; offsets 100, 200, 300 move every port (worker range by
    ten times the offset), never onto another node's, and give each node its own temporary directory."""
    flags = {offset: node_flags(offset, tmp_path) for offset in (0, 100, 200, 300)}
    assert ports_of(flags[0]) == {6379, 8265, 10001, 6380, 6381, 6382, 6383, 52365, 8090} | set(range(10002, 11000))
    assert "--temp-dir" not in flags[0]  # Ray's default, /tmp/ray
    assert flags[100]["--port"] == "6479" and flags[100]["--min-worker-port"] == "11002"
    for a in flags:
        for b in flags:
            if a < b:
                assert not ports_of(flags[a]) & ports_of(flags[b]), (a, b)
    assert len({flags[o]["--temp-dir"] for o in (100, 200, 300)}) == 3
    assert flags[100]["--temp-dir"] == f"{tmp_path}/ray-node-100"


@pytest.mark.parametrize("offset", ["150", "1000", "x"])
def test_bad_offset_is_refused(offset, tmp_path):
    proc = subprocess.run(["bash", "-c", PORTS, "ports", str(SCRIPTS)], capture_output=True, text=True,
                          env={**os.environ, "RAY_PORT_OFFSET": offset, "TMPDIR": str(tmp_path)})  # fmt: skip
    assert proc.returncode == 2 and "expected a multiple of 100 from 0 to 900" in proc.stderr


def test_stop_node_signals_only_its_own_node(tmp_path):
    """No record: nothing to stop. A recorded PID that is not that node's ``ray start`` (the number
    reused by another process): left alone, the stale record removed."""
    env = {**os.environ, "RAY_PORT_OFFSET": "700", "TMPDIR": str(tmp_path)}
    stop = [str(SCRIPTS / "stop-node.sh")]
    proc = subprocess.run(stop, env=env, capture_output=True, text=True)
    assert proc.returncode == 2 and "no Ray node of offset 700 was started here" in proc.stderr
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        record = tmp_path / "emulator-ray-node-7080.pid"  # named by the node-manager port, 6380 + 700
        record.write_text(f"{bystander.pid}\n")
        proc = subprocess.run(stop, env=env, capture_output=True, text=True)
        assert proc.returncode == 0 and "is not running" in proc.stdout, proc.stderr
        assert bystander.poll() is None and not record.exists()
    finally:
        bystander.kill()
        bystander.wait()
    for script in ("start-head.sh", "start-worker.sh", "stop-node.sh", "ports.sh"):
        subprocess.run(["bash", "-n", str(SCRIPTS / script)], check=True)


def test_worker_without_a_head_fails_in_seconds(tmp_path):
    """start-worker.sh towards an address nobody answers on: one line, exit 2, no node left behind
    (``ray start`` itself would retry for minutes)."""
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nobody listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "RAY_PORT_OFFSET": "700", "TMPDIR": str(tmp_path), "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.run([str(SCRIPTS / "start-worker.sh"), f"127.0.0.1:{port}", "1"], env=env,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: nothing answers at 127.0.0.1:{port}")
    assert not list(tmp_path.iterdir())
