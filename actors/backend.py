"""The Ray backend: N shard actors pinned to Ray nodes, driven by the conservative round protocol.

    emulator run configs/examples/data-parallel.yaml --backend ray --shards 2 [--address auto|HOST:PORT]

The driver (this module) runs the round protocol of ``emulator/engine/coordinator.py`` (``drive``,
the one run sequence of every backend) with a transport whose shards live in other processes:
each round it sends every shard that has work one call carrying all the records routed to it and
gets back its outbound batches, next event time and output bound, so Ray calls grow with rounds,
never with messages. The horizons, the delivery order and the end-of-run checks are those of the
in-process backend, which is why results are identical bit for bit.
A shard whose process dies, or that stops answering pings (its host is gone), stops the run
within seconds with a ``BackendError`` naming the shard and its host.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

from emulator.engine.coordinator import Observer, drive, first_error
from emulator.engine.placement import shard_layout
from emulator.engine.result import RunResult
from emulator.engine.settings import EngineSettings
from emulator.errors import BackendError, EmulatorError

CHECK_EVERY_S = 1.0  # a round still running after this long has its shards pinged
PING_TIMEOUT_S = 5.0  # a shard that does not answer a ping this long is lost (host gone or frozen)
SALVAGE_TIMEOUT_S = 10.0  # how long a stopped run waits for the shards' results so far
START_TIMEOUT_S = 60.0  # creating the actors (worker processes, maybe on other hosts)
CONNECT_TIMEOUT_S = 3.0
LOCAL_OBJECT_STORE_BYTES = 256 << 20  # records and results are small; keep a local Ray light


def import_ray():
    """The ``ray`` module, or a one-line BackendError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise BackendError(f"the Ray backend needs Ray: pip install 'ray[default]==2.60.0' ({exc})") from None
    return ray


def _first_line(exc: BaseException, limit: int = 240) -> str:
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_reachable(address: str, shown: str | None = None) -> None:
    """Fail fast (seconds, one line) on an address nobody listens on; Ray itself retries for long.
    ``shown``: how the error names the address (default: as given)."""
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise BackendError(f"--address {address!r}: expected auto or HOST:PORT")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise BackendError(f"cannot connect to Ray at {shown or address}: {exc.strerror or exc}") from None


def _resolve_auto() -> str:
    """The address ``auto`` stands for, found as Ray finds it (RAY_ADDRESS, the last cluster
    ``ray start`` recorded in Ray's temp directory, a running GCS). Ray itself retries a recorded
    cluster that has since stopped for minutes; resolving first lets _check_reachable fail in
    seconds. Uses a private Ray function: where it is missing, ``auto`` is passed on unresolved."""
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:
        return "auto"
    try:
        found = canonicalize_bootstrap_address("auto")
    except ConnectionError as exc:
        raise BackendError(f"cannot connect to Ray at auto: {_first_line(exc)}") from None
    return found or "auto"


def connect(ray, address: str | None) -> bool:
    """Join Ray; returns True when this call started it. An initialised Ray is reused as it is.

    No address and no ``RAY_ADDRESS`` (which ``ray job submit`` sets) starts a small local Ray.
    """
    if ray.is_initialized():
        return False
    # our one-line errors, not Ray's output: no worker logs, no Ray warnings (a token-authentication
    # notice on every local start); Ray's errors still show, but see _quiet_driver
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
    # Ray starts worker processes (the shards) at niceness 15: on a host with anything else to run,
    # Ray's own daemons included, they lose their core (measured here: the reference run 1.4x slower
    # than in one process while other tests ran, against 2x faster on a quiet host). A Ray this call
    # starts runs them at normal priority; a shard on a running cluster raises its own (ShardHost).
    os.environ.setdefault("RAY_worker_niceness", "0")
    try:
        if address is not None and address != "auto":
            _check_reachable(address)
            ray.init(address=address, **quiet)
        elif address == "auto" or os.environ.get("RAY_ADDRESS"):
            if address == "auto" and (found := _resolve_auto()) != "auto":
                _check_reachable(found, f"auto (resolved to {found})")
            ray.init(address=address, **quiet)
        else:
            # "local": a new instance even where `ray start` runs on this host (that one is --address auto)
            ray.init(address="local", object_store_memory=LOCAL_OBJECT_STORE_BYTES, include_dashboard=False, **quiet)
    except BackendError:
        raise
    except Exception as exc:  # Ray raises ConnectionError, RuntimeError or ValueError here
        where = address or os.environ.get("RAY_ADDRESS") or "a new local instance"
        raise BackendError(f"cannot connect to Ray at {where}: {_first_line(exc)}") from None
    _quiet_driver(ray)
    return True


def _quiet_driver(ray) -> None:
    """Keep Ray's reports of a lost shard off the terminal: the run says it in one line naming the
    shard and its host (and summary.json records it); Ray's own logs keep the details.

    - A dead worker makes Ray print "(raylet) A worker died or was killed while executing a task ..."
      and a paragraph of advice, even with ``log_to_driver=False``: the driver prints the errors the
      cluster pushes from a thread of its own (``ray._private.worker.listen_error_messages``). They
      are turned off as Ray's debugger does it (``ray.util.rpdb``), in this driver only.
    """
    worker = getattr(getattr(ray, "_private", None), "worker", None)
    if hasattr(worker, "_worker_logs_enabled"):
        worker._worker_logs_enabled = False


def _key(placement: dict) -> tuple:
    return placement["node_id"], placement["num_cpus"]


def _ip_key(ip: str) -> tuple:
    parts = ip.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (ip,)


def place_shards(ray, count: int, cpus_per_shard: float = 1.0) -> list[dict]:
    """Shard i goes to Ray node i % nodes (alive nodes with CPUs, sorted by IP then node id).

    Each shard reserves ``cpus_per_shard`` CPUs, less where a node gets more shards than it has
    CPUs (they then share cores rather than wait forever for a free one).
    """
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    if not nodes:
        raise BackendError("the Ray cluster has no alive node with CPUs to host shards")
    nodes.sort(key=lambda n: (_ip_key(n["NodeManagerAddress"]), n["NodeID"]))
    chosen = [nodes[i % len(nodes)] for i in range(count)]
    per_node = {n["NodeID"]: sum(1 for c in chosen if c is n) for n in nodes}
    return [
        {
            "node_id": n["NodeID"],
            "ip": n["NodeManagerAddress"],
            "num_cpus": min(cpus_per_shard, n["Resources"]["CPU"] / per_node[n["NodeID"]]),
        }
        for n in chosen
    ]


# Shard actors a finished run left for this driver's next run, so that a notebook or a test
# session does not start worker processes each time: {"job": Ray job id, "idle": {(node, cpus): [actor]}}
_IDLE: dict = {"job": None, "idle": {}}


class ShardPool:
    """The shard actors, where they live, and calls to them that notice lost shards."""

    def __init__(self, ray, placement: list[dict], reuse: bool = True):
        self.ray = ray
        self.placement = placement
        self.hosts = [p["ip"] for p in placement]
        self.info: dict[int, dict] = {}
        job = ray.get_runtime_context().get_job_id()
        idle = _IDLE["idle"] if _IDLE["job"] == job and reuse else {}
        self.actors = [(idle.get(_key(p)) or [None]).pop() for p in placement]
        self.reused = sum(a is not None for a in self.actors)
        for actors in idle.values():  # free their CPUs for the actors created below
            self._kill(actors)
        _IDLE.update(job=job, idle={})
        self.actors = [a or self._create(p) for a, p in zip(self.actors, placement, strict=True)]

    def _create(self, p: dict):
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from actors.shard_actor import ShardActor

        strategy = NodeAffinitySchedulingStrategy(node_id=p["node_id"], soft=False)
        return ShardActor.options(num_cpus=p["num_cpus"], max_restarts=0, scheduling_strategy=strategy).remote()

    def describe(self) -> None:
        """Wait for every actor to exist; learn its host; refuse code that differs from the driver's."""
        from actors.shard_actor import code_digest

        args = {i: () for i in range(len(self.actors))}
        try:
            self.info = self.call("describe", args, timeout_s=START_TIMEOUT_S)
        except BackendError:
            if not self.reused:
                raise
            self.kill()  # a kept actor was lost since the last run: start afresh
            self.actors, self.reused = [self._create(p) for p in self.placement], 0
            self.info = self.call("describe", args, timeout_s=START_TIMEOUT_S)
        for i, info in sorted(self.info.items()):
            self.hosts[i] = f"{info['ip']} ({info['host']})" if info["host"] != info["ip"] else info["ip"]
            if info["code"] != code_digest():
                raise BackendError(
                    f"shard {i} on host {self.hosts[i]} runs different emulator code than the driver: install the "
                    "same version on every host, or ship it with `ray job submit --working-dir . -- emulator run ...`"
                )

    def release(self) -> None:
        """Keep the actors for this driver's next run (after a run that ended well)."""
        for p, actor in zip(self.placement, self.actors, strict=True):
            _IDLE["idle"].setdefault(_key(p), []).append(actor)

    def shard_error(self, index: int, what: str) -> BackendError:
        """A BackendError about shard ``index``: "shard I on host H <what>", with ``shard`` and
        ``host`` attributes (a failed run's summary.json names them: ``lost_shard``)."""
        err = BackendError(f"shard {index} on host {self.hosts[index]} {what}")
        err.shard, err.host = index, self.hosts[index]
        return err

    def lost(self, index: int, exc: BaseException) -> BackendError:
        return self.shard_error(index, f"died: {_first_line(exc)}")

    def call(self, method: str, args: dict[int, tuple], timeout_s: float | None = None) -> dict:
        """Call ``method`` on the given shards at once; results by shard.

        A lost shard becomes a BackendError naming it (the first in shard order); user errors raised
        in shards are re-raised here unchanged once every shard answered, the first in event order
        of them (coordinator.first_error), as the inline backend does.
        """
        ray = self.ray
        refs = {i: getattr(self.actors[i], method).remote(*a) for i, a in args.items()}
        order = sorted(refs)
        pending = [refs[i] for i in order]
        try:  # the usual case, in one Ray call: every shard answers well within CHECK_EVERY_S
            return dict(zip(order, ray.get(pending, timeout=CHECK_EVERY_S), strict=True))
        except ray.exceptions.RayError:
            pass  # slow, timed out or failed: sort it out below, in shard order
        started = time.monotonic()
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=CHECK_EVERY_S)
            if not pending:
                break
            waiting = set(pending)
            for i in order:  # a dead shard ends the round at once, whatever the others do
                if refs[i] not in waiting:
                    self._raise_if_lost(i, refs[i])
            late = [i for i in order if refs[i] in waiting]
            if timeout_s is not None:
                if time.monotonic() - started > timeout_s:
                    raise self.shard_error(late[0], f"did not start within {timeout_s:.0f} s "
                                                    "(no free CPU there, or its worker process failed)")  # fmt: skip
            else:
                self.check_alive(late)
        results, errors = {}, []
        for i in order:
            try:
                results[i] = ray.get(refs[i])
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if not isinstance(cause, EmulatorError):
                    raise
                errors.append(cause)  # its event_key came along (an exception pickles its attributes)
            except ray.exceptions.RayError as exc:
                raise self.lost(i, exc) from None
        if errors:
            raise first_error(errors) from None
        return results

    def _raise_if_lost(self, index: int, ref) -> None:
        try:
            self.ray.get(ref, timeout=0)
        except self.ray.exceptions.RayTaskError:
            pass  # raised in shard order once every shard has answered
        except self.ray.exceptions.RayError as exc:
            raise self.lost(index, exc) from None

    def check_alive(self, indices: list[int]) -> None:
        """Ping shards busy in a long round (their control thread answers at once)."""
        ray = self.ray
        pings = {i: self.actors[i].ping.remote() for i in indices}
        _, silent = ray.wait(list(pings.values()), num_returns=len(pings), timeout=PING_TIMEOUT_S)
        for i, ref in pings.items():
            if ref in silent:
                raise self.shard_error(i, f"stopped answering for {PING_TIMEOUT_S:.0f} s "
                                          "(host lost or process frozen)")  # fmt: skip
            self._raise_if_lost(i, ref)

    def kill(self) -> None:
        self._kill(self.actors)

    def _kill(self, actors: list) -> None:
        for actor in actors:
            try:
                self.ray.kill(actor)
            except Exception:  # already gone with its host: nothing left to free
                pass


def _program_source(config) -> bytes | None:
    if config.program is None:
        return None
    try:
        return Path(config.program.rsplit(":", 1)[0]).read_bytes()
    except OSError:
        return None  # resolve_program in the shard reports the missing file


class RayTransport:
    """The shard actors as the round protocol's transport: one actor call per busy shard and round,
    each carrying the msgpack batches routed to it (so Ray calls grow with rounds, not messages)."""

    def __init__(self, ray, pool: ShardPool, config, topo, layout, rank_shard, trace_ranks,
                 settings: EngineSettings | None = None):  # fmt: skip
        self.ray, self.pool, self.config = ray, pool, config
        self.layout, self.rank_shard, self.trace_ranks = layout, rank_shard, tuple(trace_ranks)
        # the engine settings every shard is built with, resolved once here in the driver (its
        # EMULATOR_TAPE: settings.tape_mode), not in each actor's process
        self.settings = settings if settings is not None else EngineSettings.from_run_config(config)
        self.shards = len(layout)
        self.world_size = topo.world_size

    def _call(self, verb: str, work: dict) -> dict:
        return self.pool.call(verb, work)

    def start(self) -> dict:
        # put once: every shard's call takes the same references
        config_ref, rank_shard_ref = self.ray.put(self.config), self.ray.put(self.rank_shard)
        source, settings_ref = _program_source(self.config), self.ray.put(self.settings)
        return self._call("start", {i: (config_ref, self.layout[i], rank_shard_ref, i, self.trace_ranks, source,
                                        settings_ref) for i in range(self.shards)})  # fmt: skip

    def step(self, work: dict) -> dict:
        return self._call("step", work)

    def finish(self) -> list[tuple[list, dict, dict]]:
        finished = self._call("finish", {i: () for i in range(self.shards)})
        return [finished[i] for i in range(self.shards)]

    def salvage(self, lost: set[int]) -> list[dict | None]:
        ray = self.ray
        refs = {i: actor.salvage.remote() for i, actor in enumerate(self.pool.actors) if i not in lost}
        # a shard still busy in its last round answers when the round ends; a frozen one never does
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=SALVAGE_TIMEOUT_S)
        exports: list[dict | None] = []
        for i in range(len(self.pool.actors)):
            try:
                exports.append(ray.get(refs[i], timeout=0) if i in refs and refs[i] in ready else None)
            except ray.exceptions.RayError:
                exports.append(None)
        return exports


class DirectRayTransport(RayTransport):
    """The shard actors running the rounds among themselves (``engine.ray_rounds: direct``,
    actors/peer.py): a TCP connection between every pair of shards carries each round's replies and
    records; the driver starts the rounds, hears from the shards every so often, and finishes them."""

    exchanges_directly = True

    def __init__(self, ray, pool: ShardPool, config, topo, layout, rank_shard, trace_ranks,
                 settings: EngineSettings | None = None):  # fmt: skip
        super().__init__(ray, pool, config, topo, layout, rank_shard, trace_ranks, settings)
        self.lookahead_ns = topo.min_cross_node_latency_ns()
        self.reached: tuple | None = None

    def start(self) -> None:
        n = self.shards
        addresses = self.pool.call("open_mesh", {i: (i, n) for i in range(n)})
        addresses = [addresses[i] for i in range(n)]
        self.pool.call("connect_mesh", {i: (addresses, START_TIMEOUT_S) for i in range(n)}, timeout_s=START_TIMEOUT_S)
        config_ref, rank_shard_ref = self.ray.put(self.config), self.ray.put(self.rank_shard)
        source, settings_ref = _program_source(self.config), self.ray.put(self.settings)
        self.pool.call("start_direct", {i: (config_ref, self.layout[i], rank_shard_ref, i, self.trace_ranks, source,
                                            self.lookahead_ns, settings_ref) for i in range(n)})  # fmt: skip

    def advance(self, budget_s: float, want_stats: bool) -> tuple[bool, tuple, list]:
        replies = self.pool.call("run", {i: (budget_s, want_stats) for i in range(self.shards)})
        for i in range(self.shards):
            if replies[i]["status"] == "peer_lost":  # its process is alive, but it stopped taking part
                peer = replies[i]["peer"]
                raise self.pool.shard_error(peer, f"lost its connection to shard {i}")
        statuses = {r["status"] for r in replies.values()}
        assert len(statuses) == 1, statuses  # every shard stops after the same round, for the same reason
        return statuses == {"done"}, replies[0]["counters"], [replies[i]["stats"] for i in range(self.shards)]

    def salvage(self, lost: set[int]) -> list[dict | None]:
        ray = self.ray
        alive = [(i, actor) for i, actor in enumerate(self.pool.actors) if i not in lost]
        for _, actor in alive:  # rounds waiting on a lost peer end at once
            actor.abort.remote()
        # the driver hears the counters only every so often: take them from the shards still there
        # (the least advanced; they stopped within a round of each other)
        refs = [actor.progress.remote() for _, actor in alive]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=SALVAGE_TIMEOUT_S)
        reached = []
        for ref in ready:
            try:
                reached.append(ray.get(ref, timeout=0))
            except ray.exceptions.RayError:
                pass
        reached = [r for r in reached if r is not None]
        self.reached = min(reached) if reached else None
        return super().salvage(lost)


def run_ray(config, topo, shards: int, address: str | None = None, observer: Observer | None = None,
            trace_ranks=(), cpus_per_shard: float = 1.0) -> RunResult:  # fmt: skip
    """Run ``config`` on ``shards`` Ray actors; the same results as ``run_inline``."""
    ray = import_ray()
    connect(ray, address)
    settings = EngineSettings.from_run_config(config)  # (the driver's EMULATOR_TAPE: a ConfigError before any actor)
    layout, rank_shard = shard_layout(topo, shards, settings)
    pool = ShardPool(ray, place_shards(ray, len(layout), cpus_per_shard))
    try:
        pool.describe()
        direct = len(layout) > 1 and config.engine.ray_rounds == "direct"
        transport = (DirectRayTransport if direct else RayTransport)(ray, pool, config, topo, layout, rank_shard,
                                                                     trace_ranks, settings)  # fmt: skip
        result = drive(transport, topo.min_cross_node_latency_ns(), observer)
    except BaseException as exc:
        pool.kill()  # a failed run leaves no actor behind (nor one in an unknown state)
        if isinstance(exc, ray.exceptions.RayError) and not isinstance(exc, ray.exceptions.RayTaskError):
            err = BackendError(f"Ray failed during the run: {_first_line(exc)}")
            for reached in ("round_stats", "partial_result"):  # what the run reached (coordinator.drive)
                setattr(err, reached, getattr(exc, reached, None))
            raise err from None
        raise  # the run's own errors, and bugs (RayTaskError) with their remote traceback
    pool.release()
    result.extra["shard_nodes"] = [{"node_id": pool.info[i]["node_id"], "host": pool.hosts[i],
                                    "niceness": pool.info[i]["niceness"]} for i in range(len(layout))]  # fmt: skip
    return result
