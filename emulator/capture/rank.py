"""Capture one rank of a user's PyTorch training script: what its GPU would do, with no GPU and no data.

    python -m emulator.capture.rank SPEC.json      # what emulator/capture/torchrun.py runs per rank

The entry point of the capture, which is these modules (the only ones of the project that import
torch, each run in the capture's own processes):

- ``rank`` (this one): runs the script as one rank, forks a child per rank, writes its records;
- ``recorder``: the rank's stream of records, its GPU memory and handles, the script lines, and
  the stand-in for the rank identity the script reads (``RankValue``);
- ``dispatch``: the ``TorchDispatchMode`` that records what the GPU runs;
- ``device``: the pretend CUDA device (``cuda`` tensors, ``torch.cuda``, autocast, ``Module.to``);
- ``patches``: torch's libraries under capture (process group, DDP, device meshes, pipelining,
  the identity reads, optimizers).

The script runs unchanged in this process as rank ``r`` of ``N``: ``init_process_group``
(whatever backend it asks for) becomes PyTorch's fake process group
(``init_process_group("fake", store=FakeStore(), ...)``: every collective returns at once, moving
nothing), every tensor is a fake tensor (``FakeTensorMode``: shapes, dtypes and strides, no
storage), and ``torch.cuda`` answers as a GPU of the cluster's type would (emulator/capture/device.py).

A ``TorchDispatchMode`` sees every aten op with its shapes and records, in order:

- ``C`` compute: FLOPs (``torch.utils.flop_counter``'s formulas), bytes read and written (the
  distinct input and output storages), kind (matmul, attention, elementwise), precision (dtype);
- ``K`` collectives (c10d and functional): op, bytes (nccl-tests' convention), the process
  group's ranks, a handle; ``P`` sends and receives with peer, bytes, tag and handle;
- ``W`` waits: a blocking call waits at once; an async handle is waited for where its tensors are
  next used (what ``work.wait()`` or a stream dependency does on a GPU) or at the iteration's end;
- ``A``/``F`` allocations and frees of storages on the GPU (tensor lifetimes: the peak a real run
  would reach);
- ``I`` an iteration mark at every ``optimizer.step()`` (or ``emulator_mark_iteration()``).

Each record carries the line of the user's script that issued it (the innermost frame in that
file), so that the replay's errors name the script's file:line.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import sys
import time
import traceback

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from emulator.capture.device import Devices, patch_autocast, patch_cuda, patch_module_to
from emulator.capture.dispatch import Dispatch
from emulator.capture.patches import patch_distributed, patch_identity, patch_optimizer
from emulator.capture.recorder import CaptureError, Recorder, ScriptInt

# imported before torch.cuda pretends to be there: the modules whose classes capture patches
PREIMPORT = ("torch.distributed.device_mesh", "torch.nn.parallel")


def capture(spec: dict) -> dict:
    """Run the script of ``spec`` as one rank; the rank's records."""
    rank, world, local_rank, nproc = spec["rank"], spec["world_size"], spec["local_rank"], spec["nproc_per_node"]
    env = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": nproc,
           "GROUP_RANK": rank // nproc, "NODE_RANK": rank // nproc, "ROLE_RANK": rank, "ROLE_WORLD_SIZE": world,
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "emulator",
           "OMP_NUM_THREADS": "1", "EMULATOR_CAPTURE": "1"}  # fmt: skip
    os.environ.update({k: str(v) for k, v in env.items()})
    rec = Recorder(spec["script"], rank, world, spec["gpu"]["capacity_bytes"])
    # the distributed packages a script uses, imported before torch.cuda pretends to be there (some
    # choose CUDA-only code paths at import time)
    for module in PREIMPORT:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    patch_cuda(rec, spec["gpu"], local_rank, nproc)
    patch_autocast()
    patch_module_to(rec)
    patch_distributed(rec, rank, world)
    patch_identity(rec)
    rec.exact = bool(spec.get("exact_identity"))
    patch_optimizer(rec)
    builtins_mark = rec.mark_iteration
    import builtins

    builtins.emulator_mark_iteration = builtins_mark  # a user mark: emulator_mark_iteration()
    sys.argv = [rec.script, *spec["args"]]
    script_dir = os.path.dirname(os.path.realpath(spec["script"]))
    sys.path.insert(0, script_dir)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    # the cycle collector runs when allocation counts say so, which differ from process to process:
    # frees would land at different places in ranks that run the same script; it runs at each
    # iteration mark instead (and reference counting frees everything else at once)
    gc.collect()
    gc.disable()
    try:
        with fake, Devices(rec), Dispatch(rec):
            # the script's own int(): its identity read from the environment stays a stand-in
            names = {} if rec.exact else {"int": ScriptInt}
            runpy.run_path(rec.script, init_globals=names, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise CaptureError(f"{_where(exc, rec.script)}: the script exited with status {exc.code}") from None
    except CaptureError:
        raise
    except BaseException as exc:
        if os.environ.get("EMULATOR_CAPTURE_DEBUG"):
            traceback.print_exc()
        raise CaptureError(f"{_where(exc, rec.script)}: the script raised {type(exc).__name__}: "
                           f"{_first_line(exc)}") from None  # fmt: skip
    rec.wait_all(-1)
    rec.sweep()
    return rec.dump()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


def _where(exc: BaseException, script: str) -> str:
    """``file:line`` of the innermost frame of the traceback in the user's script (else the last)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if os.path.realpath(f.filename) == script]
    frame = mine[-1] if mine else (frames[-1] if frames else None)
    if frame is None:
        return os.path.basename(script)
    return f"{os.path.basename(frame.filename)}:{frame.lineno}"


def _capture_to_file(spec: dict) -> int:
    try:
        result = capture(spec)
    except CaptureError as exc:
        with open(spec["out"] + ".error", "w") as f:
            f.write(str(exc))
        return 2
    tmp = spec["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, separators=(",", ":"))
    os.replace(tmp, spec["out"])
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m emulator.capture.rank SPECS.json``: capture each rank of the list SPECS, each in a
    child forked from this process once torch and the distributed packages are imported (the imports
    are most of a small script's capture); each child writes its ``out`` (or ``out.error``), what
    the script printed to ``out.log`` and the seconds it took to ``out.seconds``.

    ``python -m emulator.capture.rank --serve``: the same for every line of stdin (a JSON list of
    specs), answering each with a line holding the batch's exit status: a capture that goes on in
    rounds (emulator/capture/torchrun.py) imports torch once per worker, not once per round."""
    argv = sys.argv[1:] if argv is None else argv
    for module in PREIMPORT:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    if argv[0] == "--serve":
        answer = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)  # nothing else of this process may write to the answers
        for line in sys.stdin:
            answer.write(f"{_capture_specs(json.loads(line))}\n")
            answer.flush()
        return 0
    with open(argv[0]) as f:
        return _capture_specs(json.load(f))


def _capture_specs(specs: list[dict]) -> int:
    status = 0
    for spec in specs:
        start = time.perf_counter()
        code = _forked(spec)
        if code != 0 and not spec.get("exact_identity"):
            # a script may trip on the RankValues its identity reads return (a type check, a C
            # function wanting an int): again with plain values, each read recorded exactly
            with contextlib.suppress(FileNotFoundError):
                os.remove(spec["out"] + ".error")
            code = _forked(dict(spec, exact_identity=True))
        with open(spec["out"] + ".seconds", "w") as f:
            f.write(f"{time.perf_counter() - start:.3f}")
        status = max(status, code)
    return status


def _forked(spec: dict) -> int:
    """Capture ``spec``'s rank in a child forked from this process; its exit code. The child's
    output (the script's prints, argparse's complaints) goes to ``out.log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: one rank, then gone without running the parent's exit handlers
        code = 1
        try:
            log = os.open(spec["out"] + ".log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            code = _capture_to_file(spec)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, wait_status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wait_status)


if __name__ == "__main__":
    sys.exit(main())
