"""Test helper: the collectives one rank of the built-in workload issues, by kind and size."""

from __future__ import annotations

from collections import Counter

from emulator.backends.inline import run_inline
from emulator.workloads.training import training_program
from netmodel.topology import Topology

KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")


def collective_calls(config, rank: int = 0) -> Counter:
    """``{(kind, size_bytes): calls}`` of ``rank`` over the whole run (every iteration)."""
    calls: Counter = Counter()
    program = training_program(config)

    class Recording:
        def __init__(self, gpu):
            self._gpu = gpu

        def __getattr__(self, name):
            found = getattr(self._gpu, name)
            if name not in KINDS or self._gpu.rank != rank:
                return found

            def record(size, *args, **kwargs):
                calls[(name, size)] += 1
                return found(size, *args, **kwargs)

            return record

    run_inline(config, Topology(config.cluster), program=lambda gpu: program(Recording(gpu)), args={})
    return calls
