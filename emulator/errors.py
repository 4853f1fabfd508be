"""The project's exceptions for errors a user can fix.

Everything a user can fix (bad config, out of memory, deadlock, collective mismatch, unreachable
cluster) raises a subclass of :class:`EmulatorError`. The CLI prints ``str(error)`` as one line and
exits with code 2. Internal invariants use ``assert`` and are bugs, never user errors.
"""

from __future__ import annotations

# the base and the config error are raised by the network model too, which must not import the
# engine: they are defined there (netmodel/errors.py) and are the same classes here
from netmodel.errors import ConfigError, EmulatorError

__all__ = [
    "BackendError",
    "CollectiveMismatchError",
    "ConfigError",
    "DeadlockError",
    "EmulatorError",
    "FailureError",
    "OutOfMemoryError",
    "ProgramError",
]


class ProgramError(EmulatorError):
    """A rank's program raised or misused the mock GPU API; names the rank and the call site."""


class OutOfMemoryError(EmulatorError):
    """An allocation exceeded the GPU's capacity; names rank, virtual time and sizes."""


class DeadlockError(EmulatorError):
    """No event can progress while some ranks are still blocked; names the ranks and waits."""


class FailureError(EmulatorError):
    """A node or link failed (``faults.fail``) and ranks hung on it until the collective timeout;
    names the failure, its time, the stop time and the hung operations. ``stop_ns``: the virtual
    time the timeout fires (the run's end); ``failed_at_ns``: the first failure."""

    stop_ns: int | None = None
    failed_at_ns: int | None = None


class CollectiveMismatchError(EmulatorError):
    """Members of a process group issued different collectives; names ranks and calls."""


class BackendError(EmulatorError):
    """The execution backend failed: Ray missing or unreachable, a shard or host lost."""
