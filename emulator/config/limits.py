"""Upper and lower bounds on every size in a run file, and why each is where it is (the cluster's
and the network's are defined in netmodel/limits.py and re-exported here).

A value outside these bounds is a :class:`~emulator.errors.ConfigError` naming its key path, raised
while the config is loaded: before anything allocates per rank, builds a schedule, or turns a
duration into integer nanoseconds. Without them a typo (``nodes: 100000000``) hangs ``check``, runs
out of host memory, or overflows int64 nanoseconds in the compiled engine, which then answers wrong.

The bounds are generous for real clusters and models (the largest published training runs use
~100k GPUs, 128k-token sequences, 16k hidden size, 126 layers, a 256k vocabulary) yet keep every
derived figure small: sizes stay far below 2**63 bytes, and the slowest allowed uplink share
(100 Mb/s NIC x 0.05 efficiency / 64 total oversubscription, ~10 kB/s) moves the largest message a
GPU can hold (~2**38 bytes) in ~2**55 ns, so int64 virtual time has room for hundreds of them.

The world size (MAX_WORLD_SIZE, 2**20 GPUs: bounded as a whole, although MAX_NODES nodes of
MAX_GPUS_PER_NODE GPUs would be 2**30) also keeps the compiled op engine's packed event keys valid:
they hold a rank in 23 bits (``rank << 40 | seq``, opkernels.RANK_BITS), so no run a user can
configure reaches that bound and OpCore checks it only as an invariant (an ``assert``);
tests/emulator/engine/test_engine_limits.py holds the two bounds together.

The bandwidth floors are also about wall time: the traffic timeline has an entry per
``timeline_bucket_us`` of every message's serialisation, so a 1 GiB all-reduce at 1 Mb/s (hours
of virtual time) means millions of entries and gigabytes of host memory. 100 Mb/s Ethernet and
10 MB/s scale-up are slower than anything a model is trained on.
"""

from __future__ import annotations

# the cluster's and the network's bounds live with the network model (which must not import the
# engine); the run file's other bounds follow
from netmodel.limits import (
    MAX_BANDWIDTH_GBITPS,
    MAX_BANDWIDTH_GBPS,
    MAX_GPUS_PER_NODE,
    MAX_LATENCY_US,
    MAX_NICS_PER_NODE,
    MAX_NODES,
    MAX_TIERS,
    MAX_TOTAL_OVERSUBSCRIPTION,
    MAX_WORLD_SIZE,
    MIN_BANDWIDTH_GBITPS,
    MIN_BANDWIDTH_GBPS,
    MIN_EFFICIENCY,
)

MAX_JOBS = 1024  # jobs sharing one cluster (jobs:); each is validated as a run of its own

__all__ = [
    "MAX_BANDWIDTH_GBITPS",
    "MAX_BANDWIDTH_GBPS",
    "MAX_GPUS_PER_NODE",
    "MAX_LATENCY_US",
    "MAX_NICS_PER_NODE",
    "MAX_NODES",
    "MAX_TIERS",
    "MAX_TOTAL_OVERSUBSCRIPTION",
    "MAX_WORLD_SIZE",
    "MIN_BANDWIDTH_GBITPS",
    "MIN_BANDWIDTH_GBPS",
    "MIN_EFFICIENCY",
]

MAX_EXPERTS = 4096  # routed experts per layer (DeepSeek-V3: 256)
MIN_CAPACITY_FACTOR = 0.01
MAX_CAPACITY_FACTOR = 1024.0
MAX_MOE_IMBALANCE = 4.0  # lognormal sigma of the tokens per expert-parallel rank
MAX_SEQ_LENGTH = 2**24
MAX_HIDDEN_SIZE = 2**20
MAX_FFN_HIDDEN_SIZE = 2**22
MAX_NUM_LAYERS = 2**16
MAX_ATTENTION_HEADS = 2**16
MAX_VOCAB_SIZE = 2**24
MAX_MICRO_BATCH_SIZE = 2**16
MAX_GLOBAL_BATCH_SIZE = 2**30  # sequences per iteration
MAX_MICROBATCHES = 2**16  # per iteration and pipeline: bounds the schedule a rank builds
MAX_ITERATIONS = 10**6
MAX_VIRTUAL_STAGES = 1024
MAX_BUCKET_SIZE_MB = 2**20  # 1 TiB: larger than any gradient, i.e. "one bucket"
MAX_OPS_AHEAD = 2**20
MIN_TIMELINE_BUCKET_US = 1.0  # a finer timeline has an entry per microsecond of every message
MAX_TIMELINE_BUCKET_US = 1e12

# faults (emulator/engine/faults.py): a GPU or link slowed below 1% of its speed is as good as failed, and
# the factors multiply durations, so the bound keeps them within 100x of the ones above
MIN_FAULT_FACTOR = 0.01
MAX_JITTER_SIGMA = 1.0  # lognormal(0, 1): a kernel 10x slower than nominal about once in 100
MAX_FAULT_TIME_S = 1e9  # a fault window's bounds in virtual seconds (10^18 ns fits int64)
MAX_FAULT_SEED = 2**63 - 1
# faults.collective_timeout_s: from a microsecond (the engine's nanoseconds resolve it) to the fault
# window bound, so that a failure time plus the timeout stays below 2e18 ns (int64 holds 9.2e18)
MIN_COLLECTIVE_TIMEOUT_S = 1e-6
MAX_COLLECTIVE_TIMEOUT_S = 1e9
