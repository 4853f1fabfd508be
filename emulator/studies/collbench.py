"""nccl-tests on the emulator: time one collective over the first N GPUs of a cluster.

    emulator collbench --cluster dgx-a100-hdr --op all_reduce --gpus 16 --min-bytes 1M --max-bytes 1G

Every size is a fresh emulation starting at t=0, so the time is the collective alone. ``algbw`` is
S/t and ``busbw`` is algbw times the nccl-tests factor (NVIDIA/nccl-tests doc/PERFORMANCE.md).

``--slow-link NAME=FACTOR`` (repeatable) degrades links as a run file's ``faults.slow_link`` does:
NAME is a link of ``links.csv`` (``node1.nic0.rx``), a NIC (``node1.nic0``: both directions) or a
tier (``ib-spine``), FACTOR the fraction of its bandwidth left (0.01 to 1).
"""

from __future__ import annotations

import copy
import re

from emulator.backends.inline import run_inline
from emulator.config.schema import FaultsConfig, NicRef, RunConfig, SlowLinkFault
from emulator.config.typed import shown
from emulator.errors import ConfigError
from netmodel.collectives import get_algorithm
from netmodel.collectives.base import OPS
from netmodel.topology import Topology

BUSBW_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "barrier": lambda n: 0.0,
}
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``8``, ``64K``, ``1M``, ``8G`` (powers of 1024, as nccl-tests reads them)."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGTB]?)B?\s*", str(text).upper())
    if not match:
        raise ConfigError(f"size {text!r}: expected a number with an optional K, M, G suffix")
    return int(match.group(1)) * _UNITS[match.group(2)]


def sizes_between(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    if min_bytes < 0 or max_bytes < min_bytes:
        raise ConfigError(f"--min-bytes {min_bytes} and --max-bytes {max_bytes}: need 0 <= min <= max")
    sizes, size = [], max(min_bytes, 1) if min_bytes else 0
    while size <= max_bytes:
        sizes.append(size)
        size = size * factor if size else 1
    return sizes


def _bench_program(gpu) -> None:
    args = gpu.args
    if gpu.rank >= args["n"]:
        return
    group = gpu.new_group(range(args["n"]))
    op = args["op"]
    kw = {"algo": args["algo"]} if args["algo"] else {}
    if op == "barrier":
        gpu.barrier(group, **kw)
    elif op in ("broadcast", "reduce"):
        getattr(gpu, op)(args["size"], 0, group, **kw)  # rooted at rank 0
    else:
        getattr(gpu, op)(args["size"], group, **kw)


_NIC = re.compile(r"node(\d+)\.nic(\d+)")


def parse_slow_links(specs: list[str], cluster) -> FaultsConfig:
    """``--slow-link NAME=FACTOR`` options as the faults of a run file (checked against ``cluster``)."""
    faults = []
    for spec in specs:
        name, sep, value = spec.rpartition("=")
        try:
            factor = float(value)
        except ValueError:
            factor = None
        if not sep or not name or factor is None:
            raise ConfigError(f"--slow-link {shown(spec)}: expected NAME=FACTOR, e.g. node1.nic0.rx=0.25")
        tiers = {g.scale_up.name for g in cluster.groups()} | {t.name for t in cluster.tiers}
        nic = _NIC.fullmatch(name)
        if nic:
            fault = SlowLinkFault(factor, nic=NicRef(int(nic.group(1)), int(nic.group(2))))
        elif name in tiers:
            fault = SlowLinkFault(factor, tier=name)
        else:
            fault = SlowLinkFault(factor, links=[name])
        fault.validate(f"--slow-link {name}")
        faults.append(fault)
    config = FaultsConfig(slow_link=faults)
    config.check_cluster(cluster, "--slow-link")
    return config


def collbench(cluster, op: str, gpus: int, algo: str | None, sizes: list[int],
              slow_links: list[str] = ()) -> list[dict]:  # fmt: skip
    """One row per size: ``size_bytes, time_us, algbw_GBps, busbw_GBps``; ``slow_links``: the
    ``--slow-link NAME=FACTOR`` options (:func:`parse_slow_links`)."""
    if op not in OPS:
        raise ConfigError(f"--op {op!r}: choose one of {', '.join(OPS)}")
    if algo is not None:
        get_algorithm(algo, op)
    world = cluster.world_size
    if not 1 <= gpus <= world:
        raise ConfigError(f"--gpus {gpus}: the cluster has {world} GPUs")
    if slow_links:
        cluster = copy.copy(cluster)  # the caller's cluster keeps its own faults
        cluster.faults = parse_slow_links(list(slow_links), cluster)  # netmodel/topology.py applies them
    config = RunConfig(name="collbench", cluster=cluster, program="collbench:_bench_program")
    topo = Topology(cluster)
    rows = []
    for size in sizes:
        args = {"n": gpus, "op": op, "algo": algo, "size": size}
        result = run_inline(config, topo, program=_bench_program, args=args)
        t_ns = max(r.final_time_ns for r in result.ranks[:gpus])
        algbw = size / t_ns if t_ns else 0.0  # bytes per ns == GB/s
        rows.append(
            {
                "size_bytes": size,
                "time_us": t_ns / 1e3,
                "algbw_GBps": algbw,
                "busbw_GBps": algbw * BUSBW_FACTOR[op](gpus),
                "events": result.events,
            }
        )
    return rows


def format_table(rows: list[dict], op: str, gpus: int, algo: str | None) -> str:
    lines = [f"# {op} on {gpus} GPUs, algorithm {algo or 'default'}",
             f"#{'size (B)':>14} {'time (us)':>12} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}"]  # fmt: skip
    for r in rows:
        lines.append(f"{r['size_bytes']:>15} {r['time_us']:>12.2f} {r['algbw_GBps']:>13.2f} {r['busbw_GBps']:>13.2f}")
    return "\n".join(lines)
