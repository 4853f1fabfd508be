"""``emulator torchrun --backend ray``: the ranks captured as Ray tasks over the session's four-node
cluster give the same capture, and the same replay, as local processes.

PYTHONPATH=. python -m pytest -q tests/actors/test_capture_ray.py
"""

from __future__ import annotations

import json
import textwrap

import pytest

from emulator.capture import torchrun
from emulator.cli import main

pytestmark = pytest.mark.ray
pytest.importorskip("torch")

SCRIPT = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
rank = dist.get_rank()
w = torch.zeros(4096, device="cuda")
for _ in range(2):
    x = torch.randn(256, 4096, device="cuda")
    y = (x * w).sum(0)
    if rank == 5:
        y = y * 2  # rank 5 does one more kernel: its own capture
    dist.all_reduce(y)
"""


def test_capture_as_ray_tasks_equals_local_capture_and_replays_alike(ray_cluster, tmp_path, monkeypatch, capsys):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    sets = {}
    for backend in ("inline", "ray"):
        monkeypatch.setenv("EMULATOR_CACHE_DIR", str(tmp_path / f"cache-{backend}"))
        captured = torchrun.capture(str(script), [], 2, 4, "dgx-h100-ndr", quiet=True, backend=backend)
        assert not captured.from_cache
        sets[backend] = json.loads(captured.path.read_text())
    assert sets["ray"] == sets["inline"]
    assert sets["ray"]["ranks_captured"] == [0, 5]  # LOCAL_RANK only as the device: rank 0 for all but rank 5
    # the whole verb on Ray (captured again as tasks, replayed on 2 Ray shards) against the inline
    # one, which replays the inline capture above from its cache (captured again, it would only
    # repeat that capture, already equal to the Ray one): the same fingerprint
    summaries = {}
    for backend, shards, again in (("inline", "1", []), ("ray", "2", ["--recapture"])):
        monkeypatch.setenv("EMULATOR_CACHE_DIR", str(tmp_path / f"cache-{backend}"))
        out = tmp_path / f"run-{backend}"
        code = main(["torchrun", "--nnodes", "2", "--nproc-per-node", "4", "--backend", backend, "--shards", shards,
                     *again, "--quiet", "--metrics-grace-s", "0", "--out", str(out), str(script)])  # fmt: skip
        assert code == 0, capsys.readouterr().err
        summaries[backend] = json.loads((out / "summary.json").read_text())
    assert summaries["ray"]["backend"] == "ray"
    assert summaries["ray"]["fingerprint"] == summaries["inline"]["fingerprint"]


def test_a_script_that_raises_on_ray_is_the_same_one_line(ray_cluster, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EMULATOR_CACHE_DIR", str(tmp_path / "cache"))
    script = tmp_path / "bad.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('nccl')\nraise KeyError('vocab')\n")
    code = main(["torchrun", "--nnodes", "1", "--nproc-per-node", "2", "--backend", "ray", "--quiet",
                 "--metrics-grace-s", "0", str(script)])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: rank 0: bad.py:3: the script raised KeyError: 'vocab'"  # rank 0 first, alone
