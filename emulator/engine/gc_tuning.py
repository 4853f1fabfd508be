"""Keep CPython's cyclic garbage collector out of the event loop.

The engine allocates millions of short-lived objects (operations, event tuples, message records)
that reference counting frees on its own: they form no cycles once completed. With the default
thresholds the cyclic collector still scans the young objects every 700 allocations, which cost
about a fifth of a run's CPU time (measured: 13.2 s -> 10.5 s on a reduced copy of the 3072-GPU
scenario, same fingerprint). During a run the objects that existed before it (modules, configs,
the topology) are frozen out of every scan, and the first threshold is raised; the collector
still runs, rarely, so that memory stays bounded.

The threshold counts the tracked objects a run keeps (CPython's young count rises at each container
made and falls at each one freed), and those it keeps - its records, its programs' tapes - are
almost all alive at its end, so a young collection finds next to nothing (742 objects in the
1,536-microbatch straggler variant of the 3072-GPU scenario) yet still walks every object made since
the last one. 200,000 made that run collect 5 times (about 0.1 s each on a loaded 2-core machine),
1,000,000 once (0.44 s, as long: the walk is per object); 3,000,000 is above what either that run or
the reference run keeps, so neither collects during the event loop, and peak memory is unchanged
(559 MB and 384 MB: what is collected is not what holds it). A program that makes cyclic garbage is
still collected after 3,000,000 kept containers (their size is the program's: not bounded here). The
counting above is CPython 3.10-3.12's (the versions the project supports; 3.13 changed the collector).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 3_000_000


@contextmanager
def relaxed_gc() -> Iterator[None]:
    """Run the body with the collector tuned for the engine; restores the previous settings."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, old[1], old[2])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        gc.unfreeze()


def tune_process() -> None:
    """For processes that only host shards (Ray actors), and the command line's ``emulator run``
    from its start (emulator/cli.py): tune once, for good."""
    old = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, old[1], old[2])
