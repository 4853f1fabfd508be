"""Rounds over a Ray compiled graph: the shard actors' ``round`` methods bound once, executed per call.

    emulator run configs/runs/megatron-1t-3072gpu.yaml --backend ray --shards 4 --set engine.ray_rounds=compiled

An ordinary actor call costs a task submission, a scheduling decision and an object-store result
per shard and round; a compiled graph (``ray.dag``, ``experimental_compile``) keeps one execution
loop per actor reading its input from a shared-memory channel, so a round is a channel write and
read per shard: a third of the overhead per round of ordinary calls, measured on two cores (467
against 1,486 us). But its processes spin while they wait for the next round, so where the
shards and the driver have no core to spare (two shards and a driver on two cores) that costs
more wall time than it saves, and ordinary calls are the default. Every shard takes part in
every round (``None`` for a shard with nothing to do: it answers at once). The run's start and
finish go through the graph too, so that the rank programs (greenlets, bound to the thread that
made them) are always switched to from the graph's thread. Two things differ from ordinary calls
and are handled here:

- a compiled result can be read only once, even after a timeout, so the driver waits without a
  timeout while a watchdog thread pings the shards once a call has run for ``CHECK_EVERY_S`` (their
  ``control`` thread answers while the loop runs); a shard that is lost or stops answering is
  killed, which ends the wait, and the run stops with the watchdog's one-line error;
- after an error the graph is unusable: it is torn down (:meth:`close`) before anything else is
  asked of the actors (``finish``, a later run).
"""

from __future__ import annotations

import threading
import time

from emulator.errors import BackendError, EmulatorError


class CompiledRounds:
    """The calls of :class:`~actors.backend.RayTransport` (start, step, finish) through one compiled graph."""

    def __init__(self, ray, pool, check_every_s: float):
        from ray.dag import InputNode, MultiOutputNode

        self.ray, self.pool, self.check_every_s = ray, pool, check_every_s
        self.shards = len(pool.actors)
        with InputNode() as inp:
            dag = MultiOutputNode([actor.round.bind(inp[i]) for i, actor in enumerate(pool.actors)])
        self.graph = dag.experimental_compile()
        self.in_flight_since: float | None = None  # when the call under way started (the watchdog's cue)
        self.lost: list[BackendError] = []
        self.closed = threading.Event()
        # one thread for the graph's life: rounds are short and many, a thread per round would cost more
        self.watchdog = threading.Thread(target=self._watch, daemon=True)
        self.watchdog.start()

    def call(self, verb: str, work: dict) -> dict:
        """``verb`` (start, step, finish) with ``work[i]``'s arguments on the shards in ``work``."""
        refs = self.graph.execute(*((verb, work[i]) if i in work else None for i in range(self.shards)))
        self.in_flight_since = time.monotonic()
        lost = self.lost
        try:
            results = {}
            for i, ref in enumerate(refs):  # in shard order, as the in-process backend meets errors
                try:
                    results[i] = self.ray.get(ref, timeout=-1)
                except self.ray.exceptions.RayTaskError as exc:
                    if lost:
                        raise lost[0] from None
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, EmulatorError):
                        raise cause from None
                    raise
                except self.ray.exceptions.RayError as exc:
                    if not lost:  # a lost shard breaks every output of the graph: find which one it is
                        self.pool.check_alive(list(range(self.shards)))
                    raise (lost[0] if lost else self.pool.lost(i, exc)) from None
        finally:
            self.in_flight_since = None
        return {i: results[i] for i in work}

    def _watch(self) -> None:
        """Ping the shards while a call has run for a while; on a lost one, record why and end the wait."""
        while not self.closed.wait(self.check_every_s):
            since = self.in_flight_since
            if since is None or time.monotonic() - since < self.check_every_s:
                continue
            try:
                self.pool.check_alive(list(range(self.shards)))
            except BackendError as exc:
                self.lost.append(exc)
                self.pool.kill()  # the driver's wait ends with an error; the run stops with ``exc``
                return

    def close(self) -> None:
        self.closed.set()
        try:
            self.graph.teardown()
        except Exception:  # a graph whose actors are gone has nothing left to tear down
            pass
