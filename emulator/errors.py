"""The project's exceptions for errors a user can fix.

Everything a user can fix (bad config, out of memory, deadlock, collective mismatch, unreachable
cluster) raises a subclass of :class:`EmulatorError`. The CLI prints ``str(error)`` as one line and
exits with code 2. Internal invariants use ``assert`` and are bugs, never user errors.
"""

from __future__ import annotations


class EmulatorError(Exception):
    """Base of every user-fixable error; the CLI prints it as one line and exits 2."""

    exit_code = 2


class ConfigError(EmulatorError):
    """Invalid configuration: the message names the key path (``cluster.nodes``)."""


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
