"""``ray job submit --working-dir`` of an edited checkout: the edit shows on the first try, in the
driver and in the shards, with an editable install of this project on the host.

The Ray here is one of its own (the head with the job server, and a second node), started on this
machine like deploy/ray/start-*.sh with RAY_PORT_OFFSET start nodes: each node has its own temporary
directory. Nodes that share one unpack a job's working_dir again for each node (Ray's working_dir
plugin replaces the directory the first time a node sees it), under the driver and the shards that
already run from it: the first submission after an edit then failed, the driver falling back to
the host's editable install for the modules that had gone ("runs different emulator code").

PYTHONPATH=. python -m pytest -q tests/actors/test_job_submit.py
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import types
import uuid
from pathlib import Path

import pytest
import yaml

from emulator.errors import BackendError
from tests.conftest import ROOT, cluster_dict

pytestmark = pytest.mark.ray

SUBMIT_TIMEOUT_S = 150  # a job takes 10-15 s on two cores

# The program of the submitted run: point to point across the two nodes, hence across the shards
# (no collective: the compiled engine's kernels, compiled anew for each unpacked copy, stay out).
# Its compute step also takes SUBMITTED_EDIT_NS from the engine's own package (netmodel), which only
# the edited copy defines: the shards show that they run the copy.
PROGRAM = """import netmodel


def main(gpu):
    gpu.compute("step", duration_ns={duration} + getattr(netmodel, "SUBMITTED_EDIT_NS", 0))
    peer = (gpu.rank + gpu.gpus_per_node) % gpu.world_size
    if gpu.rank < gpu.gpus_per_node:
        gpu.send(peer, 1 << 20)
    else:
        gpu.recv(peer, 1 << 20)
    gpu.mark_iteration()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _copy_checkout(target: Path) -> None:
    """The files ``ray job submit --working-dir`` would upload from this checkout (tracked and
    untracked, minus what .gitignore lists), as they are in the working tree."""
    listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             capture_output=True, check=True).stdout.decode()  # fmt: skip
    for name in filter(None, listing.split("\0")):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is not there
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


class JobCluster:
    """A two-node Ray with the job server; every node with a temporary directory of its own."""

    def __init__(self, base: Path):
        from ray.cluster_utils import Cluster

        self.base = base
        common = {"num_cpus": 1, "object_store_memory": 80 << 20}
        head = {**common, "include_dashboard": True, "dashboard_port": _free_port(),
                "dashboard_agent_listen_port": _free_port(), "temp_dir": str(base / "head")}  # fmt: skip
        self.cluster = Cluster(initialize_head=True, head_node_args=head)
        self.cluster.add_node(**common, dashboard_agent_listen_port=_free_port(), temp_dir=str(base / "node1"))
        self.cluster.wait_for_nodes()
        self.address = f"http://{self.cluster.webui_url}"

    def driver_logs(self, limit: int = 4000) -> str:
        """The end of every job driver's log (what the entrypoint printed), for a failure message."""
        logs = sorted(self.base.glob("head/session_*/logs/job-driver-*.log"))
        return "\n".join(f"--- {log.name}:\n{log.read_text(errors='replace')[-limit:]}" for log in logs)


@pytest.fixture(scope="module")
def job_cluster():
    pytest.importorskip("ray")
    base = Path(tempfile.mkdtemp(prefix="ray-jobs-", dir="/tmp"))  # short: Ray's socket paths live in it
    cluster = None
    try:
        cluster = JobCluster(base)
        yield cluster
    finally:
        if cluster is not None:
            cluster.cluster.shutdown()
        shutil.rmtree(base, ignore_errors=True)


def _submit(cluster: JobCluster, checkout: Path, out: Path) -> dict:
    """``ray job submit --working-dir . -- emulator run run.yaml --backend ray --shards 2`` from ``checkout``.

    With --no-wait, then the job's status polled: the CLI's log tailing (a websocket) can stop early
    or outlive the job (ray-project/ray#57002, #57037), which says nothing about the run.
    """
    from ray.job_submission import JobStatus, JobSubmissionClient

    emulator = Path(sys.executable).with_name("emulator")  # the console script of the host's install
    command = [str(emulator)] if emulator.is_file() else [sys.executable, "-m", "emulator"]
    job = f"edit-{out.name}-{uuid.uuid4().hex[:8]}"
    submit = [str(Path(sys.executable).with_name("ray")), "job", "submit", "--address", cluster.address,
              "--submission-id", job, "--no-wait", "--working-dir", ".", "--", *command, "run", "run.yaml",
              "--backend", "ray", "--shards", "2", "--out", str(out), "--quiet",
              # named: with another Ray on this machine (the session's), Ray's job supervisor may hand the
              # driver that one's address (it reads /tmp/ray/ray_current_cluster, which the last started wrote)
              "--address", cluster.cluster.address]  # fmt: skip
    proc = subprocess.run(submit, cwd=checkout, capture_output=True, text=True, timeout=SUBMIT_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    client = JobSubmissionClient(cluster.address)
    deadline = time.monotonic() + SUBMIT_TIMEOUT_S
    while (status := client.get_job_status(job)) not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
        assert time.monotonic() < deadline, f"job {job} {status} after {SUBMIT_TIMEOUT_S} s\n{cluster.driver_logs()}"
        time.sleep(0.5)
    assert status == JobStatus.SUCCEEDED, f"job {job} {status}:\n{client.get_job_logs(job)[-3000:]}"
    return json.loads((out / "summary.json").read_text())


def test_submitted_edit_runs_on_the_first_try(job_cluster, tmp_path):
    """Submit, edit the program and the engine, submit again: the second run shows both edits."""
    checkout = tmp_path / "checkout"
    _copy_checkout(checkout)
    (checkout / "run.yaml").write_text(yaml.safe_dump({"name": "edit", "program": "step.py:main",
                                                        "cluster": cluster_dict(nodes=2, gpus=2)}))  # fmt: skip
    (checkout / "step.py").write_text(PROGRAM.format(duration=1000))
    before = _submit(job_cluster, checkout, tmp_path / "before")

    (checkout / "step.py").write_text(PROGRAM.format(duration=5000))
    with (checkout / "netmodel" / "__init__.py").open("a") as f:
        f.write("\nSUBMITTED_EDIT_NS = 3000  # written by tests/actors/test_job_submit.py\n")
    after = _submit(job_cluster, checkout, tmp_path / "after")

    assert before["backend"] == after["backend"] == "ray" and after["shards"] == 2
    assert len({s["node_id"] for s in after["shard_nodes"]}) == 2  # a shard on each node
    # 1000 ns before; 5000 + 3000 after: the program and the engine as submitted the second time
    assert after["iteration_time_s"] == pytest.approx(before["iteration_time_s"] + 7e-6, abs=1e-12)


def test_code_from_two_places_is_refused(monkeypatch, tmp_path):
    """A process that imported some of this project from elsewhere (an installed checkout filling
    in for files that went away) refuses to run rather than mix code."""
    from actors.shard_actor import code_digest

    assert code_digest() == code_digest()
    stray = types.ModuleType("netmodel.stray")
    stray.__file__ = str(tmp_path / "netmodel" / "stray.py")
    monkeypatch.setitem(sys.modules, "netmodel.stray", stray)
    with pytest.raises(BackendError, match=r"^this process imported emulator code from two places, .* and "
                                           r"netmodel\.stray from .*: a copy it ran from changed"):  # fmt: skip
        code_digest()
