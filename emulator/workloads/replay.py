"""Replay of captured PyTorch ranks (``emulator torchrun``): each rank's recorded stream as its program.

    emulator torchrun --cluster dgx-h100-ndr --nnodes 8 --nproc-per-node 8 configs/torch/fsdp_gpt.py

emulator/capture/ runs the user's script per rank under fake tensors and writes what each rank's GPU
would do (compute with FLOPs and bytes, collectives and point-to-point with their groups, waits,
stream events, allocations, iteration marks; the format is in emulator/capture/rank.py). This
module turns that into a program of the mock GPU API, so that the replay is an ordinary run: the
engine, the network model, the backends, every output of ``emulator run``.

- compute: each aten op's roofline time on the rank's GPU (emulator/hardware/compute.py) at the
  op's own precision; consecutive ops of one stream with nothing else between them run as one
  kernel of their summed time (the same time, far fewer events);
- memory: per such run of ops, the peak the captured allocations and frees reach inside it, then
  the level they leave (the engine's peak and out-of-memory checks see what the GPU would hold);
- collectives run on one stream per process group (NCCL's communicator stream) after the work
  issued before them on the issuing stream; point-to-point on one stream per peer; a wait makes
  the waiting stream depend on the handle; events and ``wait_stream`` link streams;
- the iteration marks are the script's ``optimizer.step()`` calls.

Before the engine runs, :func:`check_streams` plays the ranks' communication in order without time
and reports a mismatched collective or a deadlock with the script's file:line and the ranks (the
engine would find them too, without the script's lines).
"""

from __future__ import annotations

import json
from pathlib import Path

from emulator.errors import CollectiveMismatchError, ConfigError, DeadlockError
from emulator.hardware.compute import op_duration_ns

_LOADED: dict[str, dict] = {}
_STEPS: dict[tuple, list] = {}

# replay steps: (code, ...) tuples
COMPUTE, COLL, P2P, WAIT, RECORD, STREAM_WAIT, SYNC, MARK, MEMORY = range(9)


def load_captures(path: str | Path) -> dict:
    """The capture set torchrun wrote: ``{"world_size", "templates": [...], "rank_template": [...]}``."""
    key = str(path)
    found = _LOADED.get(key)
    if found is None:
        try:
            with open(path) as f:
                found = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"program_args.capture: cannot read {path}: {exc}") from None
        _LOADED[key] = found
    return found


def frame_of(template: dict, index: int) -> str:
    frames = template["frames"]
    return frames[index] if 0 <= index < len(frames) else "the script"


def stream_name(index: int) -> str:
    return "compute" if index == 0 else f"cuda.s{index}"


def build_steps(template: dict, spec, precision_default: str = "bf16") -> list:
    """The template's records as replay steps on a GPU of ``spec``: fused compute, memory, the rest."""
    steps: list = []
    level = 0  # bytes live at the start of the current run of compute
    live: dict[int, int] = {}
    run_ns, run_stream, run_flops, run_first = 0, None, 0.0, -1
    run_level, run_peak, peak_frame = 0, 0, -1

    def close() -> None:
        nonlocal run_ns, run_stream, run_flops, run_level, run_peak, peak_frame, run_first
        if run_peak > run_level or level != run_level:
            steps.append((MEMORY, run_level, run_peak, level, frame_of(template, peak_frame)))
        if run_stream is not None and run_ns:
            steps.append((COMPUTE, stream_name(run_stream), run_ns, run_flops, frame_of(template, run_first)))
        run_ns, run_stream, run_flops, run_first = 0, None, 0.0, -1
        run_level = run_peak = level
        peak_frame = -1

    for op in template["ops"]:
        code = op[0]
        if code == "A":
            live[op[1]] = op[2]
            level += op[2]
            if level > run_peak:
                run_peak, peak_frame = level, op[3]
        elif code == "F":
            level -= live.pop(op[1], 0)
        elif code == "C":
            _, _name, flops, nbytes, kind, precision, frame, stream = op
            if run_stream is not None and stream != run_stream:
                close()
            if run_stream is None:
                run_stream, run_first = stream, frame
            run_ns += op_duration_ns(spec, flops, nbytes, kind, precision or precision_default)
            run_flops += flops
        else:
            close()
            if code == "K":
                _, coll, size, group, root, handle, frame, stream = op
                steps.append((COLL, coll, size, group, root, handle, frame_of(template, frame), stream_name(stream)))
            elif code == "P":
                _, kind, peer, size, tag, handle, frame, stream = op
                steps.append((P2P, kind, peer, size, tag, handle, frame_of(template, frame), stream_name(stream)))
            elif code == "W":
                steps.append((WAIT, op[1], stream_name(op[3])))
            elif code == "R":
                steps.append((RECORD, op[1], stream_name(op[2])))
            elif code == "S":
                steps.append((STREAM_WAIT, stream_name(op[1]), op[2]))
            elif code == "Y":
                steps.append((SYNC,))
            elif code == "I":
                steps.append((MARK,))
    close()
    return steps


def program(gpu) -> None:
    """A captured rank's stream on the engine (``program_args: {capture: PATH}``)."""
    captures = load_captures(gpu.args["capture"])
    index = captures["rank_template"][gpu.rank]
    template = captures["templates"][index]
    key = (gpu.args["capture"], index, gpu.gpu_type)
    steps = _STEPS.get(key)
    if steps is None:
        steps = _STEPS[key] = build_steps(template, gpu.spec)
    groups = [gpu.new_group(ranks) for ranks in _rank_groups(captures, template, gpu.rank)]
    handles: dict[int, object] = {}
    last: dict[str, object] = {}  # stream -> the last op launched on it
    events: dict[int, object] = {}
    block = None  # the allocation holding what is live between runs of compute
    for step in steps:
        code = step[0]
        if code == COMPUTE:
            _, stream, ns, flops, frame = step
            last[stream] = gpu.compute(frame, flops=flops, duration_ns=ns, stream=stream)  # flops for ranks.csv
        elif code == MEMORY:
            _, start, peak, end, frame = step
            transient = gpu.alloc(peak - start, f"tensors at {frame}") if peak > start else None
            if block is not None:
                gpu.free(block)
            if transient is not None:
                gpu.free(transient)
            block = gpu.alloc(end, f"tensors live after {frame}") if end else None
        elif code == COLL:
            _, coll, size, group_index, root, handle, frame, stream = step
            group = groups[group_index]
            comm = f"nccl.{group_index}"
            before = last.get(stream)
            if stream != "compute" and before is not None:
                before.wait(stream=comm)
            if coll in ("broadcast", "reduce"):
                h = getattr(gpu, coll)(size, group.ranks[root], group, async_op=True, stream=comm)
            elif coll == "barrier":
                h = gpu.barrier(group, async_op=True, stream=comm)
            else:
                h = getattr(gpu, coll)(size, group, async_op=True, stream=comm)
            handles[handle] = last[comm] = h
        elif code == P2P:
            _, kind, peer, size, tag, handle, frame, stream = step
            comm = f"p2p.{peer}"
            before = last.get(stream)
            if stream != "compute" and before is not None:
                before.wait(stream=comm)
            if kind == "send":
                h = gpu.send(peer, size, async_op=True, stream=comm)
            else:
                h = gpu.recv(peer, size, async_op=True, stream=comm)
            handles[handle] = last[comm] = h
        elif code == WAIT:
            h = handles.get(step[1])
            if h is not None:
                h.wait(stream=step[2])
        elif code == RECORD:
            events[step[1]] = last.get(step[2])
        elif code == STREAM_WAIT:
            h = events.get(step[2])
            if h is not None:
                h.wait(stream=step[1])
        elif code == SYNC:
            gpu.synchronize()
        elif code == MARK:
            gpu.mark_iteration()
    if block is not None:
        gpu.free(block)


def _rank_groups(captures: dict, template: dict, rank: int) -> list:
    """The process groups of ``rank``: its own where it was captured, else its template's."""
    own = captures.get("rank_groups", {}).get(str(rank))
    return own if own is not None else template["groups"]


# -- checking the captured streams before the run ---------------------------------------------------
def _ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    spans, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            spans.append(f"{start}" if start == r else f"{start}-{r}")
            start = None
    text = ",".join(spans[:8])
    return text + (f",... ({len(ranks)} ranks)" if len(spans) > 8 else "")


def check_streams(captures: dict) -> None:
    """Play every rank's communication in order, without time: raise CollectiveMismatchError when
    the members of a group issue different collectives, DeadlockError when ranks wait forever (a
    receive no send matches, a collective some member never issues). Sends are eager, as in the
    engine; a wait blocks until its collective has every member or its receive its send."""
    world = captures["world_size"]
    templates = captures["templates"]
    comm_ops = {}
    for index, template in enumerate(templates):
        comm_ops[index] = [op for op in template["ops"] if op[0] in "KPW"]
    group_ids: dict[tuple, int] = {}
    rank_groups = []
    for rank in range(world):
        template = templates[captures["rank_template"][rank]]
        ids = []
        for ranks in _rank_groups(captures, template, rank):
            key = tuple(ranks)
            ids.append(group_ids.setdefault(key, len(group_ids)))
        rank_groups.append(ids)
    group_ranks = {gid: ranks for ranks, gid in group_ids.items()}
    pos = [0] * world
    seq: list[dict[int, int]] = [{} for _ in range(world)]
    calls: dict[tuple[int, int], list] = {}  # (group, call #) -> [signature, frame, ranks, template]
    sends: dict[tuple[int, int], int] = {}  # (src, dst) -> sends issued
    recvs: dict[tuple[int, int], int] = {}
    pending: list[dict[int, tuple]] = [{} for _ in range(world)]  # rank -> handle -> what it waits for
    done = [False] * world

    def ready(rank: int, what: tuple) -> bool:
        if what[0] == "K":
            entry = calls[(what[1], what[2])]
            return len(entry[2]) == len(group_ranks[what[1]])
        if what[0] == "recv":
            return sends.get((what[1], rank), 0) > what[2]
        return True

    progress = True
    while progress:
        progress = False
        for rank in range(world):
            if done[rank]:
                continue
            t_index = captures["rank_template"][rank]
            ops = comm_ops[t_index]
            template = templates[t_index]
            i = pos[rank]
            while i < len(ops):
                op = ops[i]
                if op[0] == "K":
                    _, coll, size, group, root, handle, frame, _ = op
                    gid = rank_groups[rank][group]
                    n = seq[rank].get(gid, 0)
                    seq[rank][gid] = n + 1
                    sig = (coll, size, root)
                    entry = calls.get((gid, n))
                    if entry is None:
                        entry = calls[(gid, n)] = [sig, frame_of(template, frame), [], rank]
                    elif entry[0] != sig:
                        raise CollectiveMismatchError(_mismatch_line(entry, sig, frame_of(template, frame), rank, gid,
                                                                     n, group_ranks[gid]))  # fmt: skip
                    entry[2].append(rank)
                    pending[rank][handle] = ("K", gid, n)
                elif op[0] == "P":
                    _, kind, peer, size, tag, handle, frame, _ = op
                    if kind == "send":
                        sends[(rank, peer)] = sends.get((rank, peer), 0) + 1
                        pending[rank][handle] = ("send",)
                    else:
                        n = recvs.get((peer, rank), 0)
                        recvs[(peer, rank)] = n + 1
                        pending[rank][handle] = ("recv", peer, n, frame_of(template, frame))
                else:  # a wait
                    what = pending[rank].get(op[1])
                    if what is not None and not ready(rank, what):
                        break
                    pending[rank].pop(op[1], None)
                i += 1
                progress = True
            pos[rank] = i
            if i == len(ops):
                done[rank] = True
    stuck = [r for r in range(world) if not done[r]]
    if stuck:
        raise DeadlockError(_deadlock_line(stuck, captures, templates, comm_ops, pos, pending, calls, group_ranks))


def _mismatch_line(entry, sig, frame, rank, gid, n, ranks) -> str:
    first_sig, first_frame, members, first_rank = entry
    return (f"collective mismatch: rank {rank} issued {sig[0]} ({sig[1]} B) at {frame} but rank(s) "
            f"{_ranks_text(members)} issued {first_sig[0]} ({first_sig[1]} B) at {first_frame} as call #{n} "
            f"on group[{_ranks_text(ranks)}]")  # fmt: skip


def _deadlock_line(stuck, captures, templates, comm_ops, pos, pending, calls, group_ranks) -> str:
    parts = []
    for rank in stuck[:4]:
        t_index = captures["rank_template"][rank]
        template = templates[t_index]
        op = comm_ops[t_index][pos[rank]]
        what = pending[rank].get(op[1])
        where = frame_of(template, op[2])
        if what is None:
            parts.append(f"rank {rank} at {where}")
        elif what[0] == "recv":
            parts.append(f"rank {rank} waits at {where} for a receive from rank {what[1]} (posted at {what[3]})")
        else:
            entry = calls[(what[1], what[2])]
            missing = sorted(set(group_ranks[what[1]]) - set(entry[2]))
            parts.append(f"rank {rank} waits at {where} for {entry[0][0]} #{what[2]} (issued at {entry[1]}) "
                         f"that rank(s) {_ranks_text(missing)} never issue")  # fmt: skip
    more = f" | ... (+{len(stuck) - 4} more ranks)" if len(stuck) > 4 else ""
    return f"deadlock: rank(s) {_ranks_text(stuck)} blocked forever: " + " | ".join(parts) + more
