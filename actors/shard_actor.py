"""One shard of a run inside a Ray actor: the engine's ``Shard``, advanced one round per remote call.

    emulator run configs/examples/data-parallel.yaml --backend ray --shards 2   # creates these actors

The actor rebuilds everything from the picklable ``RunConfig`` (topology, program, shard), so the
engine code that runs here is exactly the inline backend's. One call per round does the whole
round for this shard: deliver the inbound batches, process events before the horizon, and return
the outbound batches (one msgpack blob per destination shard) with the time of its next event.
A small ``control`` thread answers pings while a long round runs, so the driver can tell a busy
shard from a lost host.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import sys
import tempfile
from pathlib import Path

import msgpack
import ray

from actors.peer import Mesh, PeerRounds
from emulator.engine.folding import fold_factor
from emulator.engine.gc_tuning import tune_process
from emulator.engine.result import export_shard
from emulator.engine.settings import EngineSettings
from emulator.engine.shard import Shard
from emulator.errors import BackendError
from emulator.workloads.programs import forget_program, resolve_program
from netmodel.topology import Topology

_BIG_INT = 1  # msgpack extension code for integers beyond 64 bits (a collective signature can be)
_PACKAGES = ("emulator", "netmodel", "actors")


def _pack_big(value: int) -> msgpack.ExtType:
    return msgpack.ExtType(_BIG_INT, str(value).encode())


def _unpack_ext(code: int, data: bytes) -> int:
    assert code == _BIG_INT, code
    return int(data)


def encode_records(records: list) -> bytes:
    """One destination's records as one msgpack blob (flat tuples of ints, order kept)."""
    try:
        return msgpack.packb(records)
    except OverflowError:
        fixed = [tuple(_pack_big(v) if isinstance(v, int) and not -(2**63) <= v < 2**64 else v for v in rec)
                 for rec in records]  # fmt: skip
        return msgpack.packb(fixed)


def decode_records(blob: bytes) -> list:
    """Inverse of :func:`encode_records`: a list of tuples."""
    return list(msgpack.unpackb(blob, use_list=False, ext_hook=_unpack_ext))


def _source_digest(root: Path) -> str:
    h = hashlib.sha256()
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


# Where this process imported the engine from, and its source files as they were then (an edit of
# the checkout after the import does not change the code this process runs, so neither its digest).
# Under `ray job submit --working-dir`, _ROOT is Ray's unpacked copy of the submitted checkout in
# the driver and in every shard: the job's PYTHONPATH puts it ahead of any installed copy.
_ROOT = Path(__file__).resolve().parents[1]
_DIGEST = _source_digest(_ROOT)


def _imported_elsewhere() -> list[str]:
    """Modules of this project that this process imported from another place than ``_ROOT``."""
    strays = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if name.partition(".")[0] in _PACKAGES and file and not Path(file).resolve().is_relative_to(_ROOT):
            strays.append(f"{name} from {Path(file).parent}")
    return sorted(strays)


def code_digest() -> str:
    """Digest of the engine's source files as this process imported them: every shard must run the
    code the driver runs.

    Raises BackendError where the process mixes code from two places: the files of the submitted
    copy went away under it (Ray nodes on one machine that share a temporary directory unpack a job's
    working_dir again for each node), and an installed checkout (``pip install -e``) filled in.
    """
    strays = _imported_elsewhere()
    if strays:
        raise BackendError(
            f"this process imported emulator code from two places, {_ROOT} and {strays[0]}"
            f"{f' (+{len(strays) - 1} more)' if len(strays) > 1 else ''}: a copy it ran from changed during the "
            "run (Ray nodes on one machine need a temporary directory each: ray start --temp-dir, which "
            "deploy/ray/start-worker.sh sets with RAY_PORT_OFFSET)"
        )
    return _DIGEST


def localise_program(config, source: bytes | None):
    """Point ``config.program`` at the driver's copy of the program file.

    The driver ships the file's bytes with every run, so a program edited on the driver's host
    reaches every host on the next run; a host whose file differs (or lacks it) runs a private
    copy instead of a stale one.
    """
    if config.program is None or source is None:
        return config
    file_part, func = config.program.rsplit(":", 1)
    path = Path(file_part)
    try:
        if path.read_bytes() == source:
            return config
    except OSError:
        pass
    folder = Path(tempfile.gettempdir()) / "emulator-programs" / hashlib.sha256(source).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / path.name
    if not target.is_file():
        partial = folder / f".{path.name}.{os.getpid()}"
        partial.write_bytes(source)
        os.replace(partial, target)  # atomic: shards of one host may race here
    return dataclasses.replace(config, program=f"{target}:{func}")


def normal_priority() -> int:
    """Run this shard at normal priority where allowed; returns its niceness.

    Ray starts its workers at niceness 15 unless the node was started with ``RAY_worker_niceness=0``
    (deploy/ray/*.sh and a Ray that ``emulator run`` starts do that): a niced shard gets a core only
    when nothing else on the host wants one. Lowering niceness needs privileges (root or
    CAP_SYS_NICE); without them the shard keeps Ray's and ``describe`` reports it.
    """
    try:
        if os.getpriority(os.PRIO_PROCESS, 0) > 0:
            os.setpriority(os.PRIO_PROCESS, 0, 0)
    except OSError:
        pass
    return os.getpriority(os.PRIO_PROCESS, 0)


class ShardHost:
    """The actor's body, a plain class (the Ray actor is ``ShardActor`` below)."""

    def __init__(self) -> None:
        tune_process()  # this process only hosts a shard: keep the cyclic collector out of its loop
        normal_priority()
        self.shard: Shard | None = None
        self.program_digests: dict[str, str] = {}  # actors serve several runs of one driver
        self.mesh: Mesh | None = None  # connections to the other shards (engine.ray_rounds: direct)
        self.peer: PeerRounds | None = None
        self.tapes: dict | None = None  # how the last shard built here ran tapes (:meth:`tapes_ran`)
        code_digest()

    def tapes_ran(self) -> dict | None:
        """How the last shard built here ran the built-in program's pipeline steps (tape.py): the
        EMULATOR_TAPE mode the driver gave it, and whether tapes, their kernel sends and receives were
        on; None before any run. (What a run measured, kept after it; tests/actors/test_tape_ray.py.)"""
        return self.tapes

    def describe(self) -> dict:
        """Where this shard lives and which code it runs (checked against the driver's)."""
        return {
            "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "code": code_digest(),
            "niceness": os.getpriority(os.PRIO_PROCESS, 0),
        }

    def start(self, config, ranks: list[int], rank_shard: list[int], index: int, trace_ranks=(),
              program_source: bytes | None = None, settings: EngineSettings | None = None) -> tuple:  # fmt: skip
        """Build the shard and run every program to its first suspension; replies as :meth:`step`.
        ``settings``: the engine settings the driver built (None: built here from ``config``)."""
        reply = self._build(config, ranks, rank_shard, index, trace_ranks, program_source, settings)
        return self._reply(reply, False)

    # -- rounds among the shards (engine.ray_rounds: direct, actors/peer.py) --------------------
    def open_mesh(self, index: int, shards: int) -> tuple[str, int]:
        """Listen for the other shards of a run; returns the address they connect to."""
        self.close_mesh()
        self.mesh = Mesh(index, shards, ray.util.get_node_ip_address())
        return self.mesh.address

    def connect_mesh(self, addresses: list[tuple[str, int]], timeout_s: float) -> None:
        self.mesh.connect(addresses, timeout_s)

    def start_direct(self, config, ranks: list[int], rank_shard: list[int], index: int, trace_ranks,
                     program_source: bytes | None, lookahead_ns: float,
                     settings: EngineSettings | None = None) -> None:  # fmt: skip
        """:meth:`start`, its reply kept for the first exchange with the other shards."""
        reply = self._build(config, ranks, rank_shard, index, trace_ranks, program_source, settings)
        self.peer = PeerRounds(self.shard, index, self.mesh.shards, self.mesh, lookahead_ns, encode_records,
                               decode_records)  # fmt: skip
        self.peer.begin(reply)

    def run(self, budget_s: float, want_stats: bool) -> dict:
        """Rounds with the other shards for about ``budget_s`` (actors/peer.py, ``PeerRounds.run``)."""
        reply = self.peer.run(budget_s)
        reply["stats"] = self.live_stats() if want_stats else None
        return reply

    def progress(self) -> tuple | None:
        """The rounds' counters so far (after the rounds stopped), as ``PeerRounds.run`` returns them."""
        return self.peer.counters() if self.peer is not None else None

    @ray.method(concurrency_group="control")
    def abort(self) -> None:
        """Wake this shard's rounds if they wait on a peer that will never answer (a lost host)."""
        if self.mesh is not None:
            self.mesh.abort()

    def close_mesh(self) -> None:
        if self.mesh is not None:
            self.mesh.close()
        self.mesh, self.peer = None, None

    def _build(self, config, ranks: list[int], rank_shard: list[int], index: int, trace_ranks,
               program_source: bytes | None, settings: EngineSettings | None = None) -> tuple:  # fmt: skip
        """Build the shard and run every program to its first suspension; the shard's reply."""
        config = localise_program(config, program_source)
        if program_source is not None:  # an edited program is imported again, as a new driver would
            digest = hashlib.sha256(program_source).hexdigest()
            if self.program_digests.get(config.program, digest) != digest:
                forget_program(config.program)
            self.program_digests[config.program] = digest
        program, args = resolve_program(config)
        topo = Topology(config.cluster)
        # the driver's settings: what it read of its own process (the EMULATOR_TAPE mode) is not this
        # actor's environment, which a cluster started elsewhere (--address) set
        if settings is None:
            settings = EngineSettings.from_run_config(config)
        fold = fold_factor(settings, topo)  # resolve_program gave the built-in workload iff config.program is None
        self.shard = Shard(topo, ranks, rank_shard, index, program, settings, args, trace_ranks, fold, config)
        shard = self.shard
        self.tapes = {"mode": settings.tape, "on": shard.tapes_on, "kernel_sends": bool(shard.kernel_sends),
                      "kernel_receives": bool(shard.kernel_receives)}  # fmt: skip
        return self.shard.start()

    def step(self, horizon: float, inbound: list[bytes], want_stats: bool) -> tuple:
        """One round: deliver ``inbound`` (blobs in source-shard order), run before ``horizon``.

        Returns ``(next_time, output_bound, {dst: (count, earliest_time, blob)}, live_stats or None)``.
        """
        return self._reply(self.shard.step(horizon, [decode_records(blob) for blob in inbound]), want_stats)

    def _reply(self, result: tuple, want_stats: bool) -> tuple:
        next_time, bound, out, busy_s = result
        batches = {dst: (len(recs), min(r[0] for r in recs), encode_records(recs)) for dst, recs in out.items() if recs}
        return next_time, bound, batches, (self.live_stats() if want_stats else None), busy_s

    def live_stats(self) -> dict:
        return {**self.shard.live_stats(), "pid": os.getpid(), "host": socket.gethostname()}

    def finish(self) -> tuple[list[dict], dict, dict]:
        """What every unfinished rank is blocked on, the shard's results, its last live figures."""
        stats = self.live_stats()
        shard, self.shard = self.shard, None  # the actor may serve the driver's next run
        self.close_mesh()
        return shard.blocked(), export_shard(shard), stats

    def salvage(self) -> dict | None:
        """The shard's results so far, after the driver stopped the run (an error elsewhere, Ctrl-C)."""
        shard, self.shard = self.shard, None
        self.close_mesh()
        return export_shard(shard) if shard is not None else None

    @ray.method(concurrency_group="control")
    def ping(self) -> int:
        return os.getpid()


# One thread runs every engine call (greenlets stay on the thread that made them); "control" is
# a second thread for pings, so a shard busy in a long round still answers.
ShardActor = ray.remote(concurrency_groups={"control": 1})(ShardHost)
