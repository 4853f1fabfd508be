"""Which stream carries which parallelism dimension: the training workload's naming, read by the
per-rank tables, the trace and the workload's figures.

    from emulator.workloads.streams import stream_dimension
    stream_dimension("tp")    # 'tensor'
"""

from __future__ import annotations

# Streams whose work the compute stream waits for as pipeline bubble (the pipeline send/recv stream
# of the training workloads); waiting on any other stream is exposed communication.
BUBBLE_STREAM_PREFIX = "pp"


def is_bubble_stream(stream: str) -> bool:
    return stream.startswith(BUBBLE_STREAM_PREFIX)


def stream_dimension(stream: str) -> str:
    """The parallelism dimension whose communication runs on ``stream``: the training workloads
    (emulator/workloads/training.py) issue tensor-parallel collectives on ``tp``, data-parallel ones
    (gradient buckets, weight gathers, tied embeddings) on ``dp``, context parallelism's K/V on
    ``cp``, the experts' all-to-alls on ``ep`` and their tensor group's on ``etp``, and pipeline sends
    and receives on ``pp.*``; any other stream (a user program's) is ``other``."""
    if stream == "tp":
        return "tensor"
    if stream == "dp":
        return "data"
    if stream == "cp":
        return "context"
    if stream in ("ep", "etp"):
        return "expert"
    if is_bubble_stream(stream):
        return "pipeline"
    return "other"
