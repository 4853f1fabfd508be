"""``emulator torchrun``: a drop-in for ``torchrun`` that runs the script's ranks on virtual GPUs.

    emulator torchrun --cluster dgx-h100-ndr --nnodes 8 --nproc-per-node 8 configs/torch/fsdp_gpt.py --layers 8

Two steps. **Capture**: each rank of the script runs in a local process under PyTorch's fake process
group and fake tensors (emulator/capture/rank.py and the modules it runs, the only ones that import torch), with the
environment torchrun gives (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``...), and
writes the ordered stream of what its GPU would do. **Replay**: the streams run on the engine as
rank programs (emulator/workloads/replay.py), an ordinary run with every output of ``emulator run``.

Ranks that provably run the same stream are captured once (``--capture auto``, the default): a
capture records every use the script's own code makes of its rank identity (``dist.get_rank()``,
``LOCAL_RANK``, a device mesh's coordinate...) as a predicate, and a rank for which every predicate
answers the same, and that is a member of every process group the stream uses, runs that stream
(emulator/capture/identity.py, :func:`covers`). Ranks not covered are captured in turn, until
every rank is. ``--capture all`` captures every rank. Captured streams that are equal up to their
groups are kept once.

Captures are cached (``$EMULATOR_CACHE_DIR``, default ``~/.cache/emulator/torchrun``) by the script's
content, its arguments, the torch version, the world layout, the GPU type and the capture code
itself: an unchanged rerun replays at once, an edited script is captured again.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from emulator.capture.identity import Identity, evaluate, same_stream
from emulator.config.loader import load_cluster, load_run
from emulator.errors import ConfigError, ProgramError
from emulator.hardware.gpus import get_gpu
from emulator.workloads.replay import check_streams

REPLAY_PROGRAM = Path(__file__).resolve().parents[1] / "workloads" / "replay.py"
CAPTURE_DIR = Path(__file__).resolve().parent
# the capture code: what `python -m emulator.capture.rank` runs (rank.py and the modules it imports of
# this package). The cache key holds their source, so that an edit to any of them recaptures;
# tests/emulator/capture/test_cache_key.py fails if a module the capture imports is missing here
CAPTURE_MODULES = ("rank.py", "recorder.py", "dispatch.py", "device.py", "patches.py", "identity.py")
FORMAT = 2  # bump when the capture format changes (the cache key holds the capture code's source too)


@dataclass
class Captured:
    """What the capture step gave: the capture set's file and how it was obtained."""

    path: Path
    run_file: Path
    world_size: int
    ranks_captured: int
    templates: int
    from_cache: bool
    capture_wall_s: float  # the capture step as a whole (0 from the cache)
    rank_capture_s: list[float]  # each captured rank's process, start to end

    def describe(self) -> str:
        if self.from_cache:
            return (f"capture: reused {self.path.parent} ({self.ranks_captured} of {self.world_size} ranks captured, "
                    f"{self.templates} distinct stream(s))")  # fmt: skip
        per = sorted(self.rank_capture_s)[len(self.rank_capture_s) // 2] if self.rank_capture_s else 0.0
        return (f"capture: {self.ranks_captured} of {self.world_size} ranks captured in {self.capture_wall_s:.1f} s "
                f"(median {per:.1f} s per rank), {self.templates} distinct stream(s)")  # fmt: skip


def add_torchrun_parser(sub) -> None:
    p = sub.add_parser("torchrun", help="run your own PyTorch training script on the emulated cluster")
    p.add_argument("--cluster", default="dgx-h100-ndr", help="cluster file or preset name (default dgx-h100-ndr)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes (torchrun's --nnodes)")
    p.add_argument("--nproc-per-node", "--nproc_per_node", dest="nproc_per_node", type=int, required=True,
                   help="processes (GPUs) per node (torchrun's --nproc-per-node)")  # fmt: skip
    p.add_argument("--capture", choices=("auto", "all"), default="auto",
                   help="auto: capture until every rank is provably covered by a captured one (default); all: every "
                        "rank")  # fmt: skip
    p.add_argument("--workers", type=int, help="rank captures at once (default: the cores; with --backend ray, the "
                                               "cluster's CPUs)")  # fmt: skip
    p.add_argument("--recapture", action="store_true", help="ignore the cached capture")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE",
                   help="override a value of the replay's run config, as emulator run --set (repeatable), e.g. "
                        "--set cluster.tiers.1.algorithms.all_reduce=hierarchical")  # fmt: skip
    p.add_argument("--out", type=Path, help="run directory (default runs/<time>-<script>)")
    p.add_argument("--backend", default="inline",
                   help="inline (default): capture in local processes, replay in this one; ray: capture as Ray tasks "
                        "over the cluster, replay on Ray shards")  # fmt: skip
    p.add_argument("--shards", type=int, default=1, help="number of shards of the replay")
    p.add_argument("--address", help="Ray cluster address for --backend ray")
    p.add_argument("--quiet", action="store_true", help="print only the summary line")
    p.add_argument("--trace-ranks", default="default", metavar="RANKS", help="ranks in trace.json (as emulator run)")
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve live Prometheus metrics on this port")
    p.add_argument("--metrics-host", default="127.0.0.1")
    p.add_argument("--metrics-grace-s", type=float, default=30.0, metavar="SECONDS")
    p.add_argument("--rdzv-backend", "--rdzv_backend", dest="rdzv_backend", help=argparse_ignored())
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", dest="rdzv_endpoint", help=argparse_ignored())
    p.add_argument("--rdzv-id", "--rdzv_id", dest="rdzv_id", help=argparse_ignored())
    p.add_argument("--master-addr", "--master_addr", dest="master_addr", help=argparse_ignored())
    p.add_argument("--master-port", "--master_port", dest="master_port", help=argparse_ignored())
    p.add_argument("--node-rank", "--node_rank", dest="node_rank", help=argparse_ignored())
    p.add_argument("--standalone", action="store_true", help=argparse_ignored())
    p.add_argument("script", help="the training script (as given to torchrun)")
    p.add_argument("script_args", nargs="...", help="the script's own arguments")


def argparse_ignored() -> str:
    return "accepted for torchrun compatibility; every rank of the emulated job is local"


def _gpu_facts(gpu_name: str) -> dict:
    """What ``torch.cuda`` answers during capture: the cluster's GPU."""
    spec = get_gpu(gpu_name)
    lower = spec.name.lower()
    major = 10 if "b200" in lower or "gb200" in lower else 9 if ("h100" in lower or "h200" in lower) else 8
    return {"gpu_name": f"NVIDIA {spec.name}", "capacity_bytes": int(spec.hbm_bytes), "major": major, "minor": 0,
            "sms": 132 if major >= 9 else 108}  # fmt: skip


def cache_root() -> Path:
    return Path(os.environ.get("EMULATOR_CACHE_DIR") or Path.home() / ".cache" / "emulator" / "torchrun")


def cache_key(script: Path, script_args: list[str], torch_version: str, nnodes: int, nproc: int, gpu: dict,
              mode: str) -> str:  # fmt: skip
    h = hashlib.sha256()
    for part in (script.read_bytes(), json.dumps(script_args).encode(), torch_version.encode(),
                 f"{nnodes}x{nproc}".encode(), json.dumps(gpu, sort_keys=True).encode(), mode.encode(),
                 *capture_code(), str(FORMAT).encode()):  # fmt: skip
        h.update(hashlib.sha256(part).digest())
    return h.hexdigest()[:24]


def capture_code() -> list[bytes]:
    """The source of every capture module, each with its name (a module renamed changes the key)."""
    return [name.encode() + b"\0" + (CAPTURE_DIR / name).read_bytes() for name in CAPTURE_MODULES]


def torch_version() -> str:
    if importlib.util.find_spec("torch") is None:
        raise ConfigError("emulator torchrun needs torch: pip install -e '.[torch]' (torch==2.13.0)")
    return importlib.metadata.version("torch")


def covers(records: dict, rank: int, nproc: int) -> bool:
    """Whether ``rank`` provably runs the stream of the captured ``records``: every use the
    script's code made of its identity answers the same for ``rank`` (emulator/capture/identity.py),
    and ``rank`` is a member of every process group the stream uses. The groups are what torch's
    libraries choose by reading the rank themselves (a device mesh's sub-group, FSDP's shard group);
    they choose the group that holds the rank, among groups that every rank creates in the same
    order, so a rank of each of them chooses them too. A stream with sends or receives covers only
    its own rank: their peers are ranks, which a library may derive from the rank it read itself."""
    if records["_has_p2p"] and rank != records["rank"]:
        return False
    return same_stream(records.get("predicates", []), Identity(rank, nproc)) and all(
        rank in members for members in records["_group_sets"])


def _capture_classes(run, captured: dict, world: int, nproc: int, workers: int, quiet: bool) -> list[int]:
    """Capture ranks until every rank is covered (:func:`covers`) by a captured one: rank 0 alone
    (a data-parallel script's one capture: a second rank at once would share its cores for nothing),
    then in each round up to ``workers`` ranks not covered yet (chosen by :func:`_next_batch`). Two
    rounds in a row whose ranks cover no other rank (a script whose every rank differs) are followed
    by all the rest at once, in one round. Returns each rank's representative."""
    rep_of = [-1] * world
    left = list(range(world))
    barren = 0  # rounds in a row that covered no rank beyond their own
    while left:
        batch = left[:1] if len(left) == world else _next_batch(left, captured, nproc, workers)
        if not quiet and len(left) == world:
            print(f"capture: rank {batch[0]} of {world}...", file=sys.stderr, flush=True)
        run(batch)
        for rank in batch:
            captured[rank]["_group_sets"] = [frozenset(g) for g in captured[rank]["groups"]]
            captured[rank]["_has_p2p"] = any(op[0] == "P" for op in captured[rank]["ops"])
            rep_of[rank] = rank
        still = []
        for rank in left:
            if rep_of[rank] >= 0:
                continue
            rep = next((b for b in batch if covers(captured[b], rank, nproc)), -1)
            if rep >= 0:
                rep_of[rank] = rep
            else:
                still.append(rank)
        barren = barren + 1 if len(left) - len(still) == len(batch) else 0
        if still and barren >= 2:
            if not quiet:
                print(f"capture: ranks {batch[0]}-{batch[-1]} cover no other rank: capturing the other "
                      f"{len(still)}...", file=sys.stderr, flush=True)  # fmt: skip
            run(still)
            for rank in still:
                rep_of[rank] = rank
            still = []
        elif still and not quiet and len(left) == world:
            print(f"capture: {len(still)} rank(s) not covered by those (their identity decides what they do): "
                  f"capturing until every rank is covered ({workers} at once)...", file=sys.stderr, flush=True)
        left = still
    for records in captured.values():
        records.pop("_group_sets", None)
        records.pop("_has_p2p", None)
    return rep_of


def _next_batch(left: list[int], captured: dict, nproc: int, workers: int) -> list[int]:
    """Up to ``workers`` ranks not covered yet that likely differ from each other: their values of
    the identity expressions the captured ranks recorded differ (a guess that only saves captures;
    what covers what is decided on the captured records)."""
    exprs = {json.dumps(expr): expr for records in captured.values() for expr, _ in records.get("predicates", [])}

    def signature(rank: int) -> tuple:
        who = Identity(rank, nproc)
        values = []
        for expr in exprs.values():
            try:
                values.append(json.dumps(evaluate(expr, who)))
            except (ArithmeticError, ValueError, TypeError, IndexError):
                values.append("error")
        return tuple(values)

    batch, seen = [], set()
    for rank in left:
        sig = signature(rank)
        if sig not in seen:
            seen.add(sig)
            batch.append(rank)
            if len(batch) == workers:
                break
    return batch


def capture_ranks_task(script_text: str, script: str, cwd: str, script_args: list[str], ranks: list[int], world: int,
                       nproc: int, gpu: dict) -> list[tuple[int, dict | None, str | None, float]]:  # fmt: skip
    """:func:`_capture_batch` as a Ray task on any host of the cluster (``--backend ray``): the
    script is the one at its path where that host has it unchanged, else its text written to a
    folder of the task's own under the same name (a stream names only the file, so both capture
    the same); the working directory is the driver's where the host has it."""
    with tempfile.TemporaryDirectory(prefix="emulator-capture-") as tmp:
        path = Path(script)
        if not (path.is_file() and path.read_text() == script_text):
            path = Path(tmp) / "script" / path.name
            path.parent.mkdir()
            path.write_text(script_text)
        run_in = cwd if Path(cwd).is_dir() else tmp
        return _capture_batch(path, script_args, ranks, world, nproc, gpu, Path(tmp), run_in)


class _Servers:
    """One ``python -m emulator.capture.rank --serve`` per worker, started at its first batch and
    kept for the capture's rounds (each imports torch once)."""

    def __init__(self, work: Path):
        self.work = work
        self.procs: dict[int, subprocess.Popen] = {}

    def run(self, worker: int, spec_path: Path) -> None:
        proc = self.procs.get(worker)
        if proc is None or proc.poll() is not None:
            log = open(self.work / f"server{worker}.log", "a")  # noqa: SIM115 - the process's, closed with it
            proc = self.procs[worker] = subprocess.Popen(
                [sys.executable, "-m", "emulator.capture.rank", "--serve"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, text=True, env=_capture_env(), cwd=str(Path.cwd()))  # fmt: skip
            log.close()
        proc.stdin.write(spec_path.read_text().replace("\n", " ") + "\n")
        proc.stdin.flush()
        if not proc.stdout.readline():  # it died: what it said is in its log
            proc.wait()

    def tail(self, worker: int) -> str:
        path = self.work / f"server{worker}.log"
        lines = path.read_text().strip().splitlines() if path.exists() else []
        return lines[-1] if lines else "no output"

    def close(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(OSError):
                proc.stdin.close()
            proc.wait()


def _capture_env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")


def _capture_batch(script: Path, script_args: list[str], ranks: list[int], world: int, nproc: int, gpu: dict,
                   work: Path, cwd: str | None = None, servers: _Servers | None = None,
                   worker: int = 0) -> list[tuple[int, dict | None, str | None, float]]:  # fmt: skip
    """Capture ``ranks`` one after the other in one process (emulator/capture/rank.py forks a child
    per rank): a worker of ``servers``, else a process of its own; ``[(rank, records or None, error
    line or None, seconds)]``."""
    specs = [{"script": str(script), "args": script_args, "rank": rank, "world_size": world,
              "local_rank": rank % nproc, "nproc_per_node": nproc, "gpu": gpu, "out": str(work / f"rank{rank}.json")}
             for rank in ranks]  # fmt: skip
    spec_path = work / f"batch{ranks[0]}.json"
    spec_path.write_text(json.dumps(specs))
    if servers is not None:
        servers.run(worker, spec_path)
        failed = servers.tail(worker)
    else:
        proc = subprocess.run([sys.executable, "-m", "emulator.capture.rank", str(spec_path)], env=_capture_env(),
                              capture_output=True, text=True, cwd=cwd or str(Path.cwd()))  # fmt: skip
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        failed = tail[-1] if tail else str(proc.returncode)
    results = []
    for spec in specs:
        out = Path(spec["out"])
        error_path, seconds_path, log_path = Path(f"{out}.error"), Path(f"{out}.seconds"), Path(f"{out}.log")
        seconds = float(seconds_path.read_text()) if seconds_path.exists() else 0.0
        if error_path.exists():
            line = error_path.read_text().strip()
            said = [text for text in log_path.read_text().strip().splitlines() if text.strip()] \
                if log_path.exists() else []  # fmt: skip
            if "exited with status" in line and said:  # argparse and the like say why on stderr
                line += f" ({said[-1].strip()})"
            results.append((spec["rank"], None, line, seconds))
        elif not out.exists():
            results.append((spec["rank"], None, f"capture process failed: {failed}", seconds))
        else:
            with open(out) as f:
                results.append((spec["rank"], json.load(f), None, seconds))
    return results


def _ops_key(records: dict) -> str:
    """The stream up to its groups: ranks that differ only in their groups share one copy."""
    return hashlib.sha256(json.dumps([records["ops"], records["frames"]], separators=(",", ":")).encode()).hexdigest()


def capture(script: str, script_args: list[str], nnodes: int, nproc: int, cluster: str, mode: str = "auto",
            workers: int | None = None, recapture: bool = False, quiet: bool = False, backend: str = "inline",
            address: str | None = None) -> Captured:  # fmt: skip
    """Capture the script's ranks (or find them in the cache); the capture set and its run file.
    ``backend``: ``inline`` captures in local processes, ``ray`` as Ray tasks over the cluster at
    ``address`` (actors/tasks.py); the captures are the same."""
    if backend not in ("inline", "ray"):
        raise ConfigError(f"torchrun: --backend {backend!r}: choose inline or ray")
    path = Path(script)
    if not path.is_file():
        raise ConfigError(f"torchrun: no script {script!r}")
    if nnodes < 1 or nproc < 1:
        raise ConfigError(f"torchrun: --nnodes and --nproc-per-node must be >= 1, got {nnodes} and {nproc}")
    version = torch_version()
    overrides = [f"nodes={nnodes}", f"gpus_per_node={nproc}"]
    cluster_config = load_cluster(cluster, overrides)
    gpu = _gpu_facts(cluster_config.groups()[0].gpu)
    world = nnodes * nproc
    key = cache_key(path, script_args, version, nnodes, nproc, gpu, mode)
    folder = cache_root() / key
    captures_path, meta_path = folder / "captures.json", folder / "meta.json"
    run_file = folder / "run.yaml"
    cluster_ref = str(Path(cluster).resolve()) if Path(cluster).is_file() else cluster
    if not recapture and captures_path.exists() and meta_path.exists():
        _write_run_file(run_file, path, cluster_ref, nnodes, nproc, captures_path)
        meta = json.loads(meta_path.read_text())
        return Captured(captures_path, run_file, world, meta["ranks_captured"], meta["templates"], True, 0.0, [])
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    captured: dict[int, dict] = {}
    seconds: list[float] = []
    with tempfile.TemporaryDirectory(prefix="emulator-capture-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        tasks = None
        if backend == "ray":
            from actors.tasks import RayTasks

            tasks = stack.enter_context(RayTasks(address))
        workers = max(1, workers or (tasks.slots if tasks is not None else os.cpu_count()) or 1)
        script_text = path.read_text() if tasks is not None else ""
        servers = None
        if tasks is None:
            servers = _Servers(work)
            stack.callback(servers.close)

        def run(ranks: list[int]) -> None:
            if not ranks:
                return
            batches = [ranks[i::workers] for i in range(min(workers, len(ranks)))]
            if tasks is not None:
                calls = [(script_text, str(path.resolve()), str(Path.cwd()), script_args, b, world, nproc, gpu)
                         for b in batches]  # fmt: skip
                results = [r for batch in tasks.map(capture_ranks_task, calls) for r in batch]
            else:
                with ThreadPoolExecutor(max_workers=len(batches)) as pool:
                    results = [r for batch in pool.map(lambda i: _capture_batch(path.resolve(), script_args,
                                                                                batches[i], world, nproc, gpu, work,
                                                                                servers=servers, worker=i),
                                                       range(len(batches))) for r in batch]  # fmt: skip
            errors = sorted((r, e) for r, _, e, _ in results if e is not None)
            if errors:
                rank, line = errors[0]
                others = f" (and {len(errors) - 1} more rank(s))" if len(errors) > 1 else ""
                raise ProgramError(f"rank {rank}: {line}{others}")
            for r, records, _, s in results:
                captured[r] = records
                seconds.append(s)

        if mode == "all":
            if not quiet:
                print(f"capture: {world} rank(s) ({workers} at once)...", file=sys.stderr, flush=True)
            run(list(range(world)))
            rep_of = list(range(world))
        else:
            rep_of = _capture_classes(run, captured, world, nproc, workers, quiet)
    captures = _assemble(captured, rep_of)
    check_streams(captures)  # a mismatch or deadlock is reported now, with the script's lines
    tmp_path = captures_path.with_suffix(".tmp")
    tmp_path.write_text(json.dumps(captures, separators=(",", ":")))
    os.replace(tmp_path, captures_path)
    meta = {"ranks_captured": len(captured), "templates": len(captures["templates"]),
            "capture_wall_s": time.perf_counter() - start, "rank_capture_s": seconds, "torch": version,
            "script": str(path.resolve()), "args": script_args, "nnodes": nnodes, "nproc_per_node": nproc}  # fmt: skip
    meta_path.write_text(json.dumps(meta, indent=1))
    _write_run_file(run_file, path, cluster_ref, nnodes, nproc, captures_path)
    return Captured(captures_path, run_file, world, len(captured), len(captures["templates"]), False,
                    meta["capture_wall_s"], seconds)  # fmt: skip


def _assemble(captured: dict[int, dict], rep_of: list[int]) -> dict:
    """The capture set: one template per distinct stream (up to groups), each rank's template (its
    representative's), and the groups of the ranks whose groups differ from their template's."""
    world = len(rep_of)
    templates: list[dict] = []
    by_key: dict[str, int] = {}
    template_of: dict[int, int] = {}
    for rank in sorted(captured):
        records = captured[rank]
        key = _ops_key(records)
        index = by_key.get(key)
        if index is None:
            index = by_key[key] = len(templates)
            templates.append({"ops": records["ops"], "frames": records["frames"], "groups": records["groups"],
                              "peak_bytes": records["peak_bytes"], "iterations": records["iterations"],
                              "captured_from": rank})  # fmt: skip
        template_of[rank] = index
    rank_template = [0] * world
    rank_groups: dict[str, list] = {}
    for rank in range(world):
        rep = rep_of[rank]
        assert rep in captured, f"rank {rank} has no captured representative"
        index = rank_template[rank] = template_of[rep]
        if captured[rep]["groups"] != templates[index]["groups"]:
            rank_groups[str(rank)] = captured[rep]["groups"]
    return {"world_size": world, "templates": templates, "rank_template": rank_template, "rank_groups": rank_groups,
            "ranks_captured": sorted(captured)}  # fmt: skip


def _write_run_file(run_file: Path, script: Path, cluster: str, nnodes: int, nproc: int, captures: Path) -> None:
    """The run file of the replay: the cluster, and the replay program with the capture set."""
    run_file.parent.mkdir(parents=True, exist_ok=True)
    text = (f"# emulator torchrun {script.name}: the replay of its captured ranks (emulator/workloads/replay.py)\n"
            f"name: {json.dumps(script.stem)}\n"
            f"cluster: {json.dumps(cluster)}\n"
            f"program: {json.dumps(f'{REPLAY_PROGRAM}:program')}\n"
            f"program_args: {{capture: {json.dumps(str(captures))}}}\n")  # fmt: skip
    run_file.write_text(text)


def replay_config(captured: Captured, nnodes: int, nproc: int, overrides: list[str] = ()):
    """The run config of the replay (``emulator run`` of the run file, the world layout set, then
    the ``--set`` overrides: the network's algorithms, faults, engine knobs)."""
    for text in overrides:
        if text.split("=", 1)[0].strip() in ("cluster.nodes", "cluster.gpus_per_node", "program", "program_args"):
            raise ConfigError(f"torchrun: --set {text}: the world layout is --nnodes and --nproc-per-node, the "
                              f"program is the capture")  # fmt: skip
    return load_run(captured.run_file, [f"cluster.nodes={nnodes}", f"cluster.gpus_per_node={nproc}", *overrides])
