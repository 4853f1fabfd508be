"""The tables of a run (links, ranks, message sizes, traffic over time) derived from its raw results.

    from emulator.results.tables import link_rows
    rows = link_rows(result, topo)      # result, topo from emulator.runner.sequence.execute(config)

Every table is a list of flat dicts (one per CSV row), so it needs neither pandas nor numpy; the
column meanings are documented in the README (Results).
"""

from __future__ import annotations

from collections.abc import Iterable

from emulator.engine.result import RunResult
from emulator.errors import ConfigError
from emulator.results.summary import histogram_label
from emulator.workloads.streams import is_bubble_stream, stream_dimension

LINK_COLUMNS = ("link", "name", "tier", "direction", "node", "src", "dst", "bandwidth_GBps", "bytes", "messages",
                "busy_ns", "utilisation", "peak_queue_ns")  # fmt: skip
RANK_COLUMNS = ("rank", "node", "gpu", "stage", "final_time_ns", "ops", "flops", "compute_ns", "compute_slowdown",
                "comm_ns", "exposed_comm_ns", "exposed_tp_ns", "exposed_dp_ns", "overlapped_comm_ns", "bubble_ns",
                "idle_ns", "peak_memory_bytes", "iterations")  # fmt: skip
HISTOGRAM_COLUMNS = ("by", "key", "bucket", "max_bytes", "label", "messages")
TIMELINE_COLUMNS = ("tier", "bucket", "start_s", "end_s", "message_bytes", "link_bytes", "utilisation")


def parse_rank_spec(spec: str | Iterable[int] | None, topo) -> list[int]:
    """Ranks to trace: ``None``/``"default"`` (the first node), ``"all"``, ``"none"`` or ``"0-7,64"``."""
    world = topo.world_size
    if spec is None or spec == "default":
        return list(range(topo.node_first_rank[0], topo.node_first_rank[0] + topo.node_gpus[0]))
    if not isinstance(spec, str):
        ranks = sorted({int(r) for r in spec})
    elif spec.strip() in ("all", "none", ""):
        return list(range(world)) if spec.strip() == "all" else []
    else:
        ranks = set()
        for part in spec.split(","):
            lo, _, hi = part.strip().partition("-")
            try:
                ranks.update(range(int(lo), int(hi or lo) + 1))
            except ValueError:
                raise ConfigError(f"--trace-ranks {spec!r}: expected all, none or ranks like 0-7,64") from None
        ranks = sorted(ranks)
    bad = [r for r in ranks if not 0 <= r < world]
    if bad:
        raise ConfigError(f"--trace-ranks: rank {bad[0]} is not in 0..{world - 1}")
    return ranks


def link_endpoints(topo) -> dict[int, tuple[str, str, str]]:
    """``link -> (direction, src, dst)``; a switch is named ``<tier>#<index of its group of nodes>``."""
    spans = topo.tier_span_nodes
    names = topo.tier_names
    out: dict[int, tuple[str, str, str]] = {}
    for rank, (tx, rx) in enumerate(zip(topo.su_tx, topo.su_rx, strict=True)):
        fabric = f"node{topo.rank_node[rank]}.{names[topo.link_tier[tx]]}"
        out[tx] = ("tx", f"gpu{rank}", fabric)
        out[rx] = ("rx", fabric, f"gpu{rank}")
    for node in range(topo.num_nodes):
        for rail, (tx, rx) in enumerate(zip(topo.nic_tx[node], topo.nic_rx[node], strict=True)):
            # each NIC rail has its own switches below the top tier (rail-optimised fabric)
            first = f"{names[1]}#{node // spans[1]}.rail{rail}" if len(names) > 1 else f"node{node}"
            out[tx] = ("tx", f"node{node}.nic{rail}", first)
            out[rx] = ("rx", first, f"node{node}.nic{rail}")
            for k, (up, down) in enumerate(zip(topo.up[node][rail], topo.down[node][rail], strict=True)):
                lower = f"{names[k + 1]}#{node // spans[k + 1]}.rail{rail}"
                upper = f"{names[k + 2]}#{node // spans[k + 2]}" + (f".rail{rail}" if k + 2 < len(names) - 1 else "")
                out[up] = ("up", lower, upper)
                out[down] = ("down", upper, lower)
    return out


def sim_time_ns(result: RunResult) -> int:
    return max((r.final_time_ns for r in result.ranks), default=0)


def link_rows(result: RunResult, topo) -> list[dict]:
    """One row per link of the cluster (unused links included, with zeros)."""
    sim_ns = sim_time_ns(result)
    ends = link_endpoints(topo)
    rows = []
    for link, name in enumerate(topo.link_name):
        nbytes, busy, messages, max_wait = result.links.get(link, (0, 0, 0, 0))
        direction, src, dst = ends[link]
        rows.append({
            "link": link, "name": name, "tier": topo.tier_names[topo.link_tier[link]], "direction": direction,
            "node": topo.link_node[link], "src": src, "dst": dst, "bandwidth_GBps": round(topo.link_bw[link], 6),
            "bytes": nbytes, "messages": messages, "busy_ns": busy,
            "utilisation": round(busy / sim_ns, 6) if sim_ns else 0.0, "peak_queue_ns": max_wait,
        })  # fmt: skip
    return rows


def pipeline_stage(rank: int, world_size: int, config) -> int:
    """Pipeline stage of a rank in Megatron order (tensor fastest, pipeline outermost); 0 without pipeline."""
    parallel = getattr(config, "parallel", None)
    stages = getattr(parallel, "pipeline", 1) or 1
    if stages <= 1 or world_size % stages:
        return 0
    return rank // (world_size // stages)


def rank_rows(result: RunResult, topo, config=None) -> list[dict]:
    """Per-rank time breakdown; ``compute + exposed_comm + bubble + idle`` is the run's virtual time."""
    sim_ns = sim_time_ns(result)
    rows = []
    for r in result.ranks:
        waits = r.wait_ns.get("compute", {})
        bubble = sum(ns for stream, ns in waits.items() if is_bubble_stream(stream))
        exposed = sum(ns for stream, ns in waits.items() if not is_bubble_stream(stream) and stream != "compute")
        by_dim: dict[str, int] = {}
        for stream, ns in waits.items():
            by_dim[stream_dimension(stream)] = by_dim.get(stream_dimension(stream), 0) + ns
        rows.append({
            "rank": r.rank, "node": r.node, "gpu": topo.gpu_type(r.rank),
            "stage": pipeline_stage(r.rank, result.world_size, config), "final_time_ns": r.final_time_ns,
            "ops": r.ops, "flops": r.flops, "compute_ns": r.compute_ns,
            # charged over nominal compute: 1.0 unless a fault (slow GPU, jitter) changed its kernels
            "compute_slowdown": round(r.compute_ns / r.nominal_compute_ns, 6) if r.nominal_compute_ns else 1.0,
            "comm_ns": r.comm_ns,
            "exposed_comm_ns": exposed, "exposed_tp_ns": by_dim.get("tensor", 0),
            "exposed_dp_ns": by_dim.get("data", 0),
            # communication running while the compute stream is busy; streams may overlap each other
            "overlapped_comm_ns": max(0, r.comm_ns - exposed), "bubble_ns": bubble,
            # compute on side streams can overlap the compute stream: never report negative idle time
            "idle_ns": max(0, sim_ns - r.compute_ns - exposed - bubble),
            "peak_memory_bytes": r.peak_memory_bytes, "iterations": len(r.marks_ns),
        })  # fmt: skip
    return rows


def histogram_rows(result: RunResult, topo) -> list[dict]:
    """Message counts per size bucket, per tier (``by=tier``) and per operation kind (``by=kind``)."""
    groups = [("tier", topo.tier_names[t], h) for t, h in enumerate(result.size_hist)]
    groups += [("kind", kind, h) for kind, h in result.kind_hist.items()]
    return [
        {
            "by": by,
            "key": key,
            "bucket": b,
            "max_bytes": (1 << b) if b else 0,
            "label": histogram_label(b),
            "messages": count,
        }
        for by, key, hist in groups
        for b, count in sorted(hist.items())
    ]


def sender_capacity_bytes_per_ns(topo) -> list[float]:
    """Per link tier, the bandwidth of its sender-side links (``tx`` and ``up``), which every
    message crossing the tier occupies once (the receiver side mirrors it)."""
    ends = link_endpoints(topo)
    cap = [0.0] * len(topo.tier_names)
    for link, bw in enumerate(topo.link_bw):
        if ends[link][0] in ("tx", "up"):
            cap[topo.link_tier[link]] += bw
    return cap


def csv_plain(texts) -> bool:
    """Whether the csv module writes each of ``texts`` as it is (no quoting: no delimiter, quote or
    line break, not empty)."""
    return all(text and not any(c in text for c in ',"\r\n') for text in texts)


def timeline_rows(result: RunResult, topo) -> list[dict]:
    """Traffic per tier per time bucket (only buckets with traffic); see the README (Results).

    ``message_bytes``: messages whose highest tier is this one, by the bucket they start in;
    ``link_bytes``: what this tier's links carry (a message crossing the spine also crosses the NICs);
    ``utilisation``: link_bytes / (tier sender-side capacity * bucket).
    """
    tiers = len(topo.tier_names)
    cap = sender_capacity_bytes_per_ns(topo)
    bucket_ns = result.bucket_ns
    rows = []
    for tier in range(tiers):
        # the scale-up tier carries only its own messages; switch tier k carries those of tiers >= k
        own = result.timeline[tier]
        carried = dict(own)
        for t in range(tier + 1, tiers) if tier else ():
            for slot, nbytes in result.timeline[t].items():
                carried[slot] = carried.get(slot, 0) + nbytes
        name = topo.tier_names[tier]
        capacity = cap[tier] * bucket_ns  # bytes the tier's sender side can carry in a bucket
        rows += [{
            "tier": name, "bucket": slot, "start_s": slot * bucket_ns / 1e9, "end_s": (slot + 1) * bucket_ns / 1e9,
            "message_bytes": own.get(slot, 0), "link_bytes": link_bytes,
            "utilisation": round(link_bytes / capacity, 6) if capacity else 0.0,
        } for slot, link_bytes in sorted(carried.items())]  # fmt: skip
    return rows


# The compute stream's waits per rank, by what it waited for: rows of (part, ranks.csv column).
# Pipeline waits (bubble_ns) hold both the schedule's bubble and pipeline transfers that were not
# hidden: the engine records which stream released a wait, not why that stream was late.
COMM_SPLIT = (("tensor parallel (tp)", "exposed_tp_ns"), ("data parallel (dp)", "exposed_dp_ns"),
              ("pipeline parallel (pp.*): bubble and transfers", "bubble_ns"))  # fmt: skip


def comm_split_rows(ranks: list[dict]) -> list[dict]:
    """Mean per rank of the compute stream's waits per parallelism dimension, in ns and as a fraction
    of the rank's run time; ``other`` is exposed communication on any other stream (a user program's).
    A ranks.csv written before ``exposed_tp_ns``/``exposed_dp_ns`` existed has no split: those rows
    are None and the whole exposed communication is one row, marked as not split."""
    if not ranks:
        return []
    n = len(ranks)
    split = all("exposed_tp_ns" in r and "exposed_dp_ns" in r for r in ranks)
    run_ns = sum(r["compute_ns"] + r["exposed_comm_ns"] + r["bubble_ns"] + r["idle_ns"] for r in ranks) / n
    rows = [{"part": part, "column": col, "mean_ns": sum(r[col] for r in ranks) / n if split or col == "bubble_ns"
             else None} for part, col in COMM_SPLIT]  # fmt: skip
    other = sum(r["exposed_comm_ns"] - r.get("exposed_tp_ns", 0) - r.get("exposed_dp_ns", 0) for r in ranks) / n
    part = "other streams" if split else "exposed communication, not split (ranks.csv predates the split)"
    rows.insert(2, {"part": part, "column": None, "mean_ns": other})
    for row in rows:
        row["fraction"] = None if row["mean_ns"] is None else row["mean_ns"] / run_ns if run_ns else 0.0
    return rows


def _capacity_bytes(gpu: str) -> int | None:
    from emulator.hardware.gpus import get_gpu

    try:
        return get_gpu(gpu).hbm_bytes
    except ConfigError:  # a GPU type registered by the program that wrote the run, not known here
        return None


def stage_memory_rows(ranks: list[dict], summary: dict) -> list[dict]:
    """Per pipeline stage: the largest peak over its ranks, the workload's prediction (when the run
    has one, ``emulator check``'s figure) and the HBM capacity of its smallest GPU."""
    stages: dict[int, list[dict]] = {}
    for r in ranks:
        stages.setdefault(int(r["stage"]), []).append(r)
    predicted = summary.get("predicted_peak_memory_bytes_by_stage") or {}
    rows = []
    for stage, members in sorted(stages.items()):
        gpus = sorted({str(r["gpu"]) for r in members})
        capacities = [c for c in map(_capacity_bytes, gpus) if c is not None]
        capacity = min(capacities) if capacities else None
        peak = max(r["peak_memory_bytes"] for r in members)
        rows.append({
            "stage": stage, "gpu": ", ".join(gpus), "ranks": len(members), "peak_memory_bytes": peak,
            "predicted_peak_bytes": predicted.get(str(stage)), "capacity_bytes": capacity,
            "fraction_of_capacity": peak / capacity if capacity else None,
        })  # fmt: skip
    return rows
