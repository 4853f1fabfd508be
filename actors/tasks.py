"""Plain Ray tasks over the cluster, for work that is not a shard: ``emulator torchrun --backend ray``
captures the script's ranks as tasks (emulator/capture/torchrun.py).

    with RayTasks(address) as tasks:
        results = tasks.map(capture_ranks, [(ranks_a,), (ranks_b,)])   # one task per call, in order

A task takes one CPU and is not retried (a capture that fails, fails the same way again). The
caller passes the function: this module runs it without importing the layers above.
"""

from __future__ import annotations

from actors.backend import connect, import_ray
from emulator.errors import BackendError


class RayTasks:
    """Ray joined (or started) for the ``with`` block; ``map`` runs calls as tasks."""

    def __init__(self, address: str | None):
        self.address = address
        self.ray = None
        self._started = False

    def __enter__(self) -> RayTasks:
        self.ray = import_ray()
        self._started = connect(self.ray, self.address)
        return self

    def __exit__(self, *exc) -> bool:
        if self._started:
            self.ray.shutdown()
        return False

    @property
    def slots(self) -> int:
        """Tasks that run at once: the cluster's CPUs."""
        return max(1, int(self.ray.cluster_resources().get("CPU", 1)))

    def map(self, fn, calls: list[tuple]) -> list:
        """``fn(*call)`` for every call, each a Ray task; the results in the calls' order. A task
        whose worker or host is lost is a one-line BackendError."""
        ray = self.ray
        task = ray.remote(num_cpus=1, max_retries=0)(fn)
        refs = [task.remote(*call) for call in calls]
        try:
            return ray.get(refs)
        except ray.exceptions.RayError as exc:
            for ref in refs:
                ray.cancel(ref, force=True)
            line = next((text.strip() for text in str(exc).splitlines() if text.strip()), type(exc).__name__)
            raise BackendError(f"a Ray task of {getattr(fn, '__name__', fn)} failed: {line[:240]}") from None
