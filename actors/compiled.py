"""Rounds over a Ray compiled graph: the shard actors' ``round`` methods bound once, executed per call.

    emulator run configs/runs/megatron-1t-3072gpu.yaml --backend ray --shards 2   # uses it by default

An ordinary actor call costs a task submission, a scheduling decision and an object-store result
per shard and round; a compiled graph (``ray.dag``, ``experimental_compile``) keeps one execution
loop per actor reading its input from a shared-memory channel, so a round is a channel write and
read per shard. Every shard takes part in every round (``None`` for a shard with nothing to do:
it answers at once). The run's start and finish go through the graph too, so that the rank
programs (greenlets, bound to the thread that made them) are always switched to from the graph's
thread. Two things differ from ordinary calls and are handled here:

- a compiled result can be read only once, even after a timeout, so the driver waits without a
  timeout while a watchdog thread pings the shards (their ``control`` thread answers while the
  loop runs); a shard that is lost or stops answering is killed, which ends the wait, and the run
  stops with the watchdog's one-line error;
- after an error the graph is unusable: it is torn down (:meth:`close`) before anything else is
  asked of the actors (``finish``, a later run).
"""

from __future__ import annotations

import threading

from emulator.errors import BackendError, EmulatorError

WAIT_S = 10 * 365 * 86400.0  # "no timeout" (Ray's default for compiled graphs is 10 s)


class CompiledRounds:
    """``step`` for :class:`~actors.backend.RayTransport` through one compiled graph."""

    def __init__(self, ray, pool, check_every_s: float):
        from ray.dag import InputNode, MultiOutputNode

        self.ray, self.pool, self.check_every_s = ray, pool, check_every_s
        self.shards = len(pool.actors)
        with InputNode() as inp:
            dag = MultiOutputNode([actor.round.bind(inp[i]) for i, actor in enumerate(pool.actors)])
        self.graph = dag.experimental_compile()

    def call(self, verb: str, work: dict) -> dict:
        """``verb`` (start, step, finish) with ``work[i]``'s arguments on the shards in ``work``."""
        refs = self.graph.execute(*((verb, work[i]) if i in work else None for i in range(self.shards)))
        lost: list[BackendError] = []
        waiting = threading.Event()
        watchdog = threading.Thread(target=self._watch, args=(waiting, lost), daemon=True)
        watchdog.start()
        try:
            results = {}
            for i, ref in enumerate(refs):  # in shard order, as the in-process backend meets errors
                try:
                    results[i] = self.ray.get(ref, timeout=WAIT_S)
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
            waiting.set()
            watchdog.join()
        return {i: results[i] for i in work}

    def _watch(self, done: threading.Event, lost: list) -> None:
        """Ping the shards while a round runs; on a lost one, record why and end the wait."""
        while not done.wait(self.check_every_s):
            try:
                self.pool.check_alive(list(range(self.shards)))
            except BackendError as exc:
                lost.append(exc)
                self.pool.kill()  # the driver's wait ends with an error; the run stops with ``exc``
                return

    def close(self) -> None:
        try:
            self.graph.teardown()
        except Exception:  # a graph whose actors are gone has nothing left to tear down
            pass
