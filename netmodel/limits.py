"""Bounds on the cluster and its network, and why each is where it is (the rest of the run file's
bounds are in emulator/config/limits.py, which re-exports these).

A value outside them is a :class:`~netmodel.errors.ConfigError` naming its key path, raised while
the config is loaded, before anything allocates per rank or link. The bounds are generous for real
clusters (the largest published training runs use ~100k GPUs) yet keep every derived figure small:
the slowest allowed uplink share (100 Mb/s NIC x 0.05 efficiency / 64 total oversubscription,
~10 kB/s) moves the largest message a GPU can hold (~2**38 bytes) in ~2**55 ns, so int64 virtual
time has room for hundreds of them.

The bandwidth floors are also about wall time: the traffic timeline has an entry per time bucket of
every message's serialisation, so a 1 GiB all-reduce at 1 Mb/s (hours of virtual time) means
millions of entries. 100 Mb/s Ethernet and 10 MB/s scale-up are slower than anything a model is
trained on.
"""

from __future__ import annotations

MAX_WORLD_SIZE = 2**20  # GPUs in the cluster: 1,048,576 (10x the largest clusters built)
MAX_NODES = 2**20
MAX_GPUS_PER_NODE = 1024  # NVL576-class racks count as one scale-up node
MAX_NICS_PER_NODE = 64
MAX_TIERS = 8  # switch tiers above the scale-up fabric
MAX_TOTAL_OVERSUBSCRIPTION = 64.0  # product of the tiers' oversubscription (3:1 over three tiers is 27)

MIN_BANDWIDTH_GBPS = 0.01  # scale-up, 10^9 bytes/s: 10 MB/s
MIN_BANDWIDTH_GBITPS = 0.1  # NIC, 10^9 bits/s: 100 Mb/s Ethernet
MAX_BANDWIDTH_GBPS = 1e6  # 1 PB/s per port: beyond any fabric, keeps bytes/ns finite and sane
MAX_BANDWIDTH_GBITPS = 8e6
MIN_EFFICIENCY = 0.05
MAX_LATENCY_US = 1e6  # one second per message

# the slowest link any valid cluster has: a 100 Mb/s NIC at the least efficiency, shared by the
# largest oversubscription (bytes per ns); a degraded link must not go below it, so that the int64
# headroom argued above still holds
MIN_LINK_BYTES_PER_NS = MIN_BANDWIDTH_GBITPS / 8 * MIN_EFFICIENCY / MAX_TOTAL_OVERSUBSCRIPTION
