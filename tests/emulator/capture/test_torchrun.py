"""``emulator torchrun``: capture of real PyTorch scripts (torch, CPU build) and their replay.

    python -m pytest -q tests/emulator/capture

Each test writes a small script and runs it on 2-4 virtual GPUs; the captures go to a fresh cache.
The core package without torch is tested too (it must not need it).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from emulator.capture import torchrun
from emulator.cli import main

ROOT = Path(__file__).resolve().parents[3]

HEADER = """\
import os
import torch
import torch.distributed as dist

dist.init_process_group("nccl")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
"""


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EMULATOR_CACHE_DIR", str(tmp_path / "cache"))


def _script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def _line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _torchrun(capsys, path: Path, *extra: str, nproc: int = 2) -> tuple[int, str, str]:
    code = main(["torchrun", "--cluster", "dgx-h100-ndr", "--nnodes", "1", "--nproc-per-node", str(nproc),
                 "--metrics-grace-s", "0", "--quiet", *extra, str(path)])  # fmt: skip
    out, err = capsys.readouterr()
    return code, out, err


def test_core_package_and_cli_work_without_torch():
    # torch made unimportable: the package, its CLI and a run still work, and nothing imports torch
    code = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None
        import emulator
        from emulator.cli import build_parser, main
        build_parser().parse_args(["torchrun", "--nproc-per-node", "2", "x.py"])
        assert main(["check", "configs/examples/data-parallel.yaml"]) == 0
        r = emulator.run("configs/examples/data-parallel.yaml", overrides={"program_args.iterations": 1})
        assert r.summary["world_size"] == 32
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")


torch = pytest.importorskip("torch")


def test_a_training_step_is_captured_and_replayed(tmp_path, capsys):
    path = _script(tmp_path, """
        model = torch.nn.Linear(1024, 1024, bias=False).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            x = torch.randn(512, 1024, device="cuda")
            model(x).sum().backward()
            dist.all_reduce(model.weight.grad)
            opt.step()
    """)
    out_dir = tmp_path / "run"
    code, out, err = _torchrun(capsys, path, "--out", str(out_dir))
    assert code == 0, err
    # emulator run's result line
    assert out.startswith("train: 2 GPUs, virtual ") and f"-> {out_dir}/summary.json" in out
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["iterations"] == 2
    captures = json.loads(next((tmp_path / "cache").glob("*/captures.json")).read_text())
    ops = captures["templates"][0]["ops"]
    matmuls = [op for op in ops if op[0] == "C" and op[4] == "matmul"]
    # forward x @ W^T and the weight gradient: 2 * 512 * 1024 * 1024 FLOPs each, every iteration
    assert [op[2] for op in matmuls] == [2 * 512 * 1024 * 1024] * 4
    colls = [op for op in ops if op[0] == "K"]
    assert [(op[1], op[2]) for op in colls] == [("all_reduce", 4 * 1024 * 1024)] * 2
    assert captures["templates"][0]["groups"] == [[0, 1]]
    # the rank's peak holds at least the weights, their gradient and the input
    assert captures["templates"][0]["peak_bytes"] >= 3 * 4 * 1024 * 1024
    assert main(["report", str(out_dir)]) == 0


def _bare(tmp_path: Path, body: str, name: str) -> Path:
    """A script that reads no rank identity of its own (no HEADER)."""
    path = tmp_path / name
    path.write_text("import torch\nimport torch.distributed as dist\n\ndist.init_process_group('nccl')\n"
                    + textwrap.dedent(body))  # fmt: skip
    return path


def test_ranks_that_never_read_their_identity_are_captured_once(tmp_path):
    same = _bare(tmp_path, """
        w = torch.zeros(256, device="cuda")
        for _ in range(2):
            dist.all_reduce(w)
        print("world", dist.get_world_size())  # the world size is the same on every rank
    """, "same.py")  # fmt: skip
    captured = torchrun.capture(str(same), [], 2, 4, "dgx-h100-ndr", workers=1, quiet=True)
    assert (captured.ranks_captured, captured.templates) == (1, 1)
    captures = json.loads(captured.path.read_text())
    assert captures["ranks_captured"] == [0] and captures["rank_template"] == [0] * 8


def test_a_script_that_uses_local_rank_only_as_its_device_is_captured_once(tmp_path):
    # LOCAL_RANK through int() is the identity's stand-in; as the device (set_device, torch.device,
    # .to(i), .cuda(i)) it is not a use: every index is the same fake device
    same = _script(tmp_path, """
        local = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local)
        assert isinstance(device, torch.device) and device.type == "cuda"
        model = torch.nn.Linear(256, 256).to(device)
        x = torch.randn(8, 256, device=device).to(local)
        bias = torch.ones(256).cuda(local)
        (model(x) + bias).sum().backward()
        dist.all_reduce(model.weight.grad)
    """, "local.py")  # fmt: skip
    captured = torchrun.capture(str(same), [], 3, 4, "dgx-h100-ndr", workers=2, quiet=True)
    captures = json.loads(captured.path.read_text())
    assert captures["ranks_captured"] == [0] and captured.templates == 1
    assert captures["rank_template"] == [0] * 12
    # the work is on the GPU: the forward and weight-gradient matmuls and the all-reduce
    ops = captures["templates"][0]["ops"]
    assert [op[2] for op in ops if op[0] == "C" and op[4] == "matmul"][:1] == [2 * 8 * 256 * 256]
    assert [(op[1], op[2]) for op in ops if op[0] == "K"] == [("all_reduce", 4 * 256 * 256)]


def test_a_stream_that_depends_on_local_rank_is_captured_per_distinct_value(tmp_path):
    # the stand-in reaching a kernel's shape records its exact value: ranks share a stream only with
    # ranks of the same shape
    differ = _script(tmp_path, """
        local = int(os.environ["LOCAL_RANK"])
        device = torch.device("cuda", local)
        x = torch.zeros(256 * (1 + local % 2), device=device)
        (x * 2).sum()
        w = torch.zeros(256, device=device)
        dist.all_reduce(w)
    """, "shapes.py")  # fmt: skip
    captured = torchrun.capture(str(differ), [], 2, 4, "dgx-h100-ndr", workers=2, quiet=True)
    captures = json.loads(captured.path.read_text())
    assert captures["ranks_captured"] == [0, 1] and captured.templates == 2
    assert captures["rank_template"] == [0, 1] * 4
    muls = [[op[3] for op in template["ops"] if op[0] == "C" and op[1] == "mul"] for template in captures["templates"]]
    assert muls == [[2 * 256 * 4], [2 * 512 * 4]]  # bytes read and written: the input and the output


# 2 nodes: the uses recorded exactly on 2 GPUs each (each local rank its own capture, the other
# node's ranks covered by theirs; a use that went unrecorded leaves rank 0 alone), the comparison on
# 4 each, where local ranks 2 and 3 share rank 0's answer
@pytest.mark.parametrize(("use", "nproc", "ranks"), [
    ('print("on", device)', 2, [0, 1]),  # printing the device is its exact index
    ('print(os.environ["LOCAL_RANK"])', 2, [0, 1]),  # the text itself
    ("if device.index == 1:\n    print('one')", 4, [0, 1]),  # a comparison: its answer
    ('torch.zeros(torch.cuda.current_device() + 1, device="cuda") * 2', 2, [0, 1]),  # a shape
])  # fmt: skip
def test_other_uses_of_the_local_rank_device_record_what_they_read(tmp_path, use, nproc, ranks):
    script = _script(tmp_path, textwrap.dedent("""
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        w = torch.zeros(256, device=device)
        dist.all_reduce(w)
    """) + use + "\n", "uses.py")  # fmt: skip
    captured = torchrun.capture(str(script), [], 2, nproc, "dgx-h100-ndr", workers=2, quiet=True)
    captures = json.loads(captured.path.read_text())
    assert captures["ranks_captured"] == ranks


@pytest.mark.parametrize(("use", "ranks"), [
    # numpy takes the script's int as the builtin's dtype: still one capture
    ("import numpy as np\nassert np.zeros(3, dtype=int).dtype == np.int64", [0]),
    # torch's parser does not: the script trips, and is captured again with plain values
    ("assert torch.zeros(3, dtype=int).dtype == torch.int64", [0, 1]),
])  # fmt: skip
def test_int_as_a_dtype_in_the_script(tmp_path, use, ranks):
    # two ranks: a rank that tripped covers no other, so each is captured (with four, the rounds
    # after two barren ones - test_every_rank_is_captured_when_each_uses_its_identity - cost 2x)
    script = _script(tmp_path, textwrap.dedent("""
        w = torch.zeros(256, device="cuda")
        dist.all_reduce(w)
    """) + use + "\n", "dtype.py")  # fmt: skip
    captured = torchrun.capture(str(script), [], 1, 2, "dgx-h100-ndr", workers=2, quiet=True)
    captures = json.loads(captured.path.read_text())
    assert captures["ranks_captured"] == ranks and captured.templates == 1


def test_a_rank_whose_identity_changes_its_stream_is_captured_and_the_others_share(tmp_path):
    # rank 7 of 8 does an extra op: neither the first node's ranks nor a sample of probes show it
    differ = _bare(tmp_path, """
        rank = dist.get_rank()
        w = torch.zeros(256, device="cuda")
        if rank == 7:
            w = w * 3
        if rank % 4 == 0:
            print("a node's first rank logs")  # a use that changes nothing on the GPU
        dist.all_reduce(w)
    """, "seventh.py")  # fmt: skip
    captured = torchrun.capture(str(differ), [], 2, 4, "dgx-h100-ndr", workers=2, quiet=True)
    captures = json.loads(captured.path.read_text())
    # ranks 0 and 1 first (2 at once): 0 covers the ranks whose answers match its own (rank == 7 no,
    # rank % 4 == 0 yes), 4; 1 covers 2, 3, 5 and 6; 7 is its own
    assert captures["ranks_captured"] == [0, 1, 7]
    assert captured.templates == 2  # rank 1's stream equals rank 0's: one copy
    assert [captures["templates"][t]["captured_from"] for t in captures["rank_template"]] == [0] * 7 + [7]
    mul = [op for op in captures["templates"][1]["ops"] if op[0] == "C" and op[1] == "mul"]
    assert mul and not [op for op in captures["templates"][0]["ops"] if op[0] == "C" and op[1] == "mul"]


def test_every_rank_is_captured_when_each_uses_its_identity(tmp_path):
    differ = _script(tmp_path, """
        x = torch.ones(64 * (1 + rank), device="cuda") * 2  # each rank's own kernel size
        w = torch.zeros(256, device="cuda")
        dist.all_reduce(w)
    """, "differ.py")  # fmt: skip
    captured = torchrun.capture(str(differ), [], 1, 4, "dgx-h100-ndr", quiet=True)
    assert (captured.ranks_captured, captured.templates) == (4, 4)


def test_ranks_outside_the_captured_ranks_groups_are_captured_themselves(tmp_path):
    # each node's ranks form a group chosen by torch's device mesh (its own read of the rank): a rank
    # of another node cannot take rank 0's groups, though the script's code never reads the rank
    script = _bare(tmp_path, """
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
        w = torch.zeros(256, device="cuda")
        dist.all_reduce(w, group=mesh.get_group("tp"))
    """, "mesh.py")  # fmt: skip
    captured = torchrun.capture(str(script), [], 2, 4, "dgx-h100-ndr", workers=1, quiet=True)
    captures = json.loads(captured.path.read_text())
    assert captures["ranks_captured"] == [0, 4] and captured.templates == 1
    assert captures["rank_groups"] == {str(r): [[4, 5, 6, 7]] for r in range(4, 8)}


def test_a_stream_with_sends_covers_only_its_own_rank(tmp_path):
    # the peers come from a library's own read of the rank, which capture does not follow
    library = tmp_path / "site-packages" / "peerlib.py"
    library.parent.mkdir()
    library.write_text("import torch.distributed as dist\n\n\ndef peers(n):\n    me = dist.get_rank()\n"
                       "    return (me + 1) % n, (me - 1) % n\n")  # fmt: skip
    script = _bare(tmp_path, """
        import sys
        sys.path.insert(0, sys.argv[0].rsplit("/", 1)[0] + "/site-packages")
        import peerlib
        after, before = peerlib.peers(4)
        buf = torch.zeros(256, device="cuda")
        ops = [dist.P2POp(dist.isend, buf, after), dist.P2POp(dist.irecv, buf, before)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
    """, "ring.py")  # fmt: skip
    captured = torchrun.capture(str(script), [], 1, 4, "dgx-h100-ndr", workers=1, quiet=True)
    captures = json.loads(captured.path.read_text())
    assert captures["ranks_captured"] == [0, 1, 2, 3]
    peers = [[op[2] for op in captures["templates"][t]["ops"] if op[0] == "P"] for t in captures["rank_template"]]
    assert peers == [[1, 3], [2, 0], [3, 1], [0, 2]]


def test_a_script_that_trips_on_the_identity_value_is_captured_with_plain_values(tmp_path):
    script = _bare(tmp_path, """
        import json
        rank = dist.get_rank()
        assert isinstance(rank, int), type(rank)  # the script's int: a RankValue holding an int is one
        json.dumps({"rank": rank})  # not for json: captured again, exactly
        w = torch.zeros(256, device="cuda")
        dist.all_reduce(w)
    """, "strict.py")  # fmt: skip
    # two ranks: each captured, one stream (four only repeat the barren rounds that
    # test_every_rank_is_captured_when_each_uses_its_identity takes)
    captured = torchrun.capture(str(script), [], 1, 2, "dgx-h100-ndr", quiet=True)
    assert (captured.ranks_captured, captured.templates) == (2, 1)


def test_an_unchanged_rerun_reuses_the_capture_and_an_edit_recaptures(tmp_path, monkeypatch):
    path = _script(tmp_path, """
        w = torch.zeros(1024, device="cuda")
        dist.all_reduce(w)
    """)
    first = torchrun.capture(str(path), [], 1, 2, "dgx-h100-ndr", quiet=True)
    assert not first.from_cache

    def no_capture(*args, **kwargs):
        raise AssertionError("recaptured")

    monkeypatch.setattr(torchrun, "_capture_batch", no_capture)
    again = torchrun.capture(str(path), [], 1, 2, "dgx-h100-ndr", quiet=True)
    assert again.from_cache and again.path == first.path
    with pytest.raises(AssertionError, match="recaptured"):  # other arguments: a new capture
        torchrun.capture(str(path), ["--steps", "3"], 1, 2, "dgx-h100-ndr", quiet=True)
    path.write_text(path.read_text() + "dist.all_reduce(w)\n")
    with pytest.raises(AssertionError, match="recaptured"):  # an edited script: a new capture
        torchrun.capture(str(path), [], 1, 2, "dgx-h100-ndr", quiet=True)


def test_a_script_that_raises_is_one_line_with_its_location(tmp_path, capsys):
    path = _script(tmp_path, """
        def build():
            raise ValueError("hidden size must divide by heads")
        build()
    """)
    code, out, err = _torchrun(capsys, path)
    assert code == 2
    line = _line_of(path, "raise ValueError")
    assert err.strip() == (f"error: rank 0: train.py:{line}: the script raised ValueError: hidden size must divide "
                           f"by heads")  # fmt: skip  (rank 0 is captured first, alone)


def test_mismatched_send_recv_order_deadlocks_with_the_script_line(tmp_path, capsys):
    path = _script(tmp_path, """
        buf = torch.zeros(1024, device="cuda")
        peer = 1 - rank
        dist.recv(buf, src=peer)   # both ranks receive first: neither sends
        dist.send(buf, dst=peer)
    """)
    code, out, err = _torchrun(capsys, path)
    assert code == 2
    line = _line_of(path, "dist.recv")
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("error: deadlock: rank(s) 0-1 blocked forever")
    assert f"rank 0 waits at train.py:{line} for a receive from rank 1" in err


def test_a_collective_mismatch_names_the_script_lines_and_ranks(tmp_path, capsys):
    path = _script(tmp_path, """
        buf = torch.zeros(1024, device="cuda")
        if rank == 0:
            dist.all_reduce(buf)
        else:
            out = torch.zeros(2048, device="cuda")
            dist.all_gather_into_tensor(out, buf)
    """)
    code, out, err = _torchrun(capsys, path)
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    reduce_line, gather_line = _line_of(path, "dist.all_reduce"), _line_of(path, "all_gather_into_tensor")
    assert (f"collective mismatch: rank 1 issued all_gather (8192 B) at train.py:{gather_line} but rank(s) 0 "
            f"issued all_reduce (4096 B) at train.py:{reduce_line}") in err  # fmt: skip


def test_torch_cuda_answers_as_the_clusters_gpu(tmp_path, capsys):
    path = _script(tmp_path, """
        props = torch.cuda.get_device_properties(0)
        assert torch.cuda.is_available() and torch.cuda.device_count() == 2, torch.cuda.device_count()
        assert props.name == "NVIDIA h100-sxm-80gb" and props.total_memory > 80e9, props
        before = torch.cuda.memory_allocated()
        x = torch.empty(1 << 20, device="cuda")
        assert torch.cuda.memory_allocated() - before == 4 << 20
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            y = x * 2
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        dist.all_reduce(y)
    """)
    code, out, err = _torchrun(capsys, path)
    assert code == 0, err


def test_transformer_encoder_layer_captures_in_training_and_inference(tmp_path, capsys):
    path = _script(tmp_path, """
        layer = torch.nn.TransformerEncoderLayer(256, 4, batch_first=True).cuda()
        x = torch.randn(2, 64, 256, device="cuda")
        layer(x).sum().backward()
        dist.all_reduce(layer.linear1.weight.grad)
        layer.eval()
        with torch.no_grad():  # the fused inference fast path
            layer(x)
    """)
    code, out, err = _torchrun(capsys, path)
    assert code == 0, err


def _optimizer_ops(tmp_path: Path, name: str, optimizer_args: str, layers: int) -> list[str]:
    path = _script(tmp_path, f"""
        model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range({layers})]).cuda()
        optimizer = torch.optim.AdamW(model.parameters(){optimizer_args})
        model(torch.randn(4, 64, device="cuda")).sum().backward()
        marker = torch.ones(1, device="cuda")
        dist.all_reduce(marker)  # the step's ops follow this collective
        optimizer.step()
    """, name)  # fmt: skip
    captured = torchrun.capture(str(path), [], 1, 2, "dgx-h100-ndr", workers=1, quiet=True)
    ops = json.loads(captured.path.read_text())["templates"][0]["ops"]
    after = next(i for i, op in enumerate(ops) if op[0] == "K")
    # the optimizer's state is created per parameter on the first step, on a GPU too: left out
    return [op[1] for op in ops[after:] if op[0] == "C" and op[1] != "zeros_like"]


def test_optimizers_on_the_pretend_gpu_run_the_multi_tensor_kernels_a_gpu_gets(tmp_path):
    """torch's default for CUDA parameters is foreach: the step's kernel count does not grow with the
    number of parameters; a script that asks for the per-parameter loop still gets it."""
    two = _optimizer_ops(tmp_path, "two.py", "", 2)
    eight = _optimizer_ops(tmp_path, "eight.py", "", 8)
    assert len(two) == len(eight) and any(name.startswith("_foreach") for name in eight), eight
    looped = _optimizer_ops(tmp_path, "looped.py", ", foreach=False", 8)
    assert len(looped) > 4 * len(eight) and not any(name.startswith("_foreach") for name in looped)
