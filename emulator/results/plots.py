"""Matplotlib figures of a run's tables (used by ``emulator report`` and the notebook API).

    from emulator.results.rundir import read_run_dir
    from emulator.results.plots import plot_breakdown
    plot_breakdown(read_run_dir("runs/dp")).savefig("breakdown.png")

Figures are built with ``matplotlib.figure.Figure`` (no pyplot state, no GUI backend needed);
Jupyter displays them when a cell returns one.
"""

from __future__ import annotations

from matplotlib.figure import Figure

from emulator.results.rundir import RunTables
from emulator.results.tables import stage_memory_rows

BREAKDOWN = (("compute_ns", "compute", "#4c72b0"), ("exposed_comm_ns", "exposed communication", "#dd8452"),
             ("bubble_ns", "pipeline bubble", "#c44e52"), ("idle_ns", "idle", "#bbbbbb"))  # fmt: skip
# the right-hand panel of the breakdown: exposed communication per dimension, then the hidden part
COMM_PARTS = (("exposed_tp_ns", "exposed: tensor parallel", "#ccb974"),
              ("exposed_dp_ns", "exposed: data parallel", "#8172b3"),
              ("other", "exposed: other streams", "#937860"),
              ("overlapped_comm_ns", "overlapped with compute", "#55a868"))  # fmt: skip
SPLIT_COLUMNS = ("exposed_tp_ns", "exposed_dp_ns")
MAX_GROUPS = 32  # bars in the breakdown; more nodes are binned into consecutive ranges
MAX_POINTS = 600  # time windows in the utilisation plot; finer buckets are averaged


def _bar_groups(ax, series: dict[str, dict[int, int]], title: str) -> None:
    """Grouped bars of message counts per size bucket, one colour per series."""
    used = {b for counts in series.values() for b in counts}
    if not used:
        ax.text(0.5, 0.5, "no messages", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title)
        return
    # every bucket between the smallest and the largest, so that gaps in the distribution show
    buckets = list(range(min(used), max(used) + 1))
    width = 0.8 / len(series)
    for i, (name, counts) in enumerate(series.items()):
        xs = [b - buckets[0] + (i - (len(series) - 1) / 2) * width for b in counts]
        bars = ax.bar(xs, list(counts.values()), width=width, label=name)
        if len(used) * len(series) <= 16:
            ax.bar_label(bars, labels=[_count(c) for c in counts.values()], fontsize="small")
    ax.set_xlim(-0.5 - max(0, (5 - len(buckets)) / 2), len(buckets) - 0.5 + max(0, (5 - len(buckets)) / 2))
    ax.set_xticks(range(len(buckets)))
    ax.set_xticklabels([_size_label(b) for b in buckets], rotation=45, ha="right")
    ax.set_xlabel("message size (bucket upper bound)")
    ax.set_ylabel("messages")
    ax.set_yscale("log")
    top = max(c for counts in series.values() for c in counts.values())
    ax.set_ylim(0.5, top * 4)  # a bucket of one message still shows; room for the count labels
    ax.set_title(title)
    ax.legend(fontsize="small")


def _count(n: int) -> str:
    """1234567 -> 1.2M: bar labels stay short."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _size_label(bucket: int) -> str:
    from emulator.results.summary import histogram_label

    return histogram_label(bucket).removeprefix("<=")


def plot_message_sizes(data: RunTables) -> Figure:
    """Message-size distribution per tier (left) and per operation kind (right)."""
    fig = Figure(figsize=(12, 4.5), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, by, title in ((axes[0], "tier", "per tier"), (axes[1], "kind", "per operation kind")):
        series: dict[str, dict[int, int]] = {}
        for row in data.histograms:
            if row["by"] == by:
                series.setdefault(str(row["key"]), {})[int(row["bucket"])] = int(row["messages"])
        _bar_groups(ax, series, f"Message sizes {title}")
    return fig


def plot_link_utilisation(data: RunTables) -> Figure:
    """Utilisation of each tier's links over virtual time (buckets without traffic are zero)."""
    fig = Figure(figsize=(12, 4), layout="constrained")
    ax = fig.subplots()
    by_tier: dict[str, dict[int, dict]] = {}
    for row in data.timeline:
        by_tier.setdefault(str(row["tier"]), {})[int(row["bucket"])] = row
    last = max((b for rows in by_tier.values() for b in rows), default=-1)
    sim_s = float(data.summary.get("sim_time_s") or 0.0)
    # a long run has thousands of buckets: average them into at most MAX_POINTS windows
    per = -(-(last + 1) // MAX_POINTS) if last >= 0 else 1
    bucket_s = 0.0
    for tier, rows in by_tier.items():
        first = next(iter(rows.values()))
        bucket_s = first["end_s"] - first["start_s"]
        windows = range(0, last + 1, per)
        xs = [w * bucket_s * 1e3 for w in windows] + [(last + 1) * bucket_s * 1e3]
        ys = [100 * sum(rows[b]["utilisation"] for b in range(w, w + per) if b in rows) / per for w in windows]
        ax.step(xs, [*ys, 0.0], where="post", label=tier)
    if not by_tier:
        ax.text(0.5, 0.5, "no traffic", ha="center", va="center", transform=ax.transAxes)
    if sim_s:
        ax.axvline(sim_s * 1e3, color="grey", linestyle=":", label="end of run")
    ax.set_xlabel("virtual time (ms)")
    ax.set_ylabel("utilisation of the tier's links (%)")
    window = f"{per * bucket_s * 1e3:.3g} ms windows" if bucket_s else "no traffic"
    ax.set_title(f"Link utilisation per tier over virtual time ({window})")
    ax.set_ylim(bottom=0)
    if by_tier or sim_s:  # an empty legend is a matplotlib warning
        ax.legend(fontsize="small")
    return fig


def breakdown_groups(ranks: list[dict]) -> list[tuple[str, list[dict]]]:
    """Pipeline stages when there are several, else nodes (binned to at most MAX_GROUPS bars)."""
    stages = sorted({r["stage"] for r in ranks})
    key, label = ("stage", "stage") if len(stages) > 1 else ("node", "node")
    values = stages if key == "stage" else sorted({r["node"] for r in ranks})
    per = -(-len(values) // MAX_GROUPS) if values else 1
    groups = []
    for i in range(0, len(values), per):
        chunk = set(values[i : i + per])
        name = f"{label} {values[i]}" if per == 1 else f"{label}s {values[i]}-{values[min(i + per, len(values)) - 1]}"
        groups.append((name, [r for r in ranks if r[key] in chunk]))
    return groups


def plot_breakdown(data: RunTables) -> Figure:
    """Mean per-rank time breakdown per pipeline stage (or node), and communication exposed vs overlapped."""
    groups = breakdown_groups(data.ranks)
    fig = Figure(figsize=(12, 1.6 + 0.3 * max(len(groups), 2)), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(3, 2), sharey=True)
    names = [name for name, _ in groups]
    ys = list(range(len(groups)))

    def mean_ms(rows: list[dict], col: str) -> float:
        return sum(r.get(col, 0) for r in rows) / len(rows) / 1e6

    offset = [0.0] * len(groups)
    for col, label, colour in BREAKDOWN:
        widths = [mean_ms(rows, col) for _, rows in groups]
        left.barh(ys, widths, left=offset, color=colour, label=label)
        offset = [a + b for a, b in zip(offset, widths, strict=True)]
    left.set_yticks(ys)
    left.set_yticklabels(names)
    left.invert_yaxis()
    left.set_xlabel("virtual time per rank (ms, mean over the group)")
    left.set_title("Where the time went")

    # exposed communication per parallelism dimension (run directories from before the split have
    # no exposed_tp_ns / exposed_dp_ns: all of it is then "other")
    offset = [0.0] * len(groups)
    for col, label, colour in COMM_PARTS:
        if col == "other":
            widths = [mean_ms(rows, "exposed_comm_ns") - sum(mean_ms(rows, c) for c in SPLIT_COLUMNS)
                      for _, rows in groups]  # fmt: skip
        else:
            widths = [mean_ms(rows, col) for _, rows in groups]
        if any(widths) or col == "overlapped_comm_ns":
            right.barh(ys, widths, left=offset, color=colour, label=label)
        offset = [a + b for a, b in zip(offset, widths, strict=True)]
    right.set_xlabel("communication time per rank (ms)")
    right.set_title("Communication: exposed vs overlapped")
    fig.legend(loc="outside lower center", ncol=5, fontsize="small")
    return fig


def plot_busiest_links(data: RunTables, count: int = 20) -> Figure:
    """The ``count`` links with the highest utilisation over the run."""
    rows = sorted((r for r in data.links if r["bytes"]), key=lambda r: (-r["utilisation"], r["link"]))[:count]
    fig = Figure(figsize=(12, 1.2 + 0.3 * max(len(rows), 2)), layout="constrained")
    ax = fig.subplots()
    ax.barh(range(len(rows)), [100 * r["utilisation"] for r in rows], color="#4c72b0")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r['name']} ({r['tier']})" for r in rows], fontsize="small")
    ax.invert_yaxis()
    ax.set_xlabel("busy time / run time (%)")
    ax.set_title(f"Busiest {len(rows)} links")
    return fig


def plot_memory_by_stage(data: RunTables) -> Figure:
    """Peak memory per pipeline stage (largest over its ranks) against the GPU's HBM capacity, with
    the workload's prediction (``emulator check``) where the run has one."""
    rows = stage_memory_rows(data.ranks, data.summary)
    gib = float(1 << 30)
    fig = Figure(figsize=(12, 4), layout="constrained")
    ax = fig.subplots()
    xs = list(range(len(rows)))
    ax.bar(xs, [r["peak_memory_bytes"] / gib for r in rows], color="#4c72b0", label="peak (emulated)")
    predicted = [(x, r["predicted_peak_bytes"] / gib) for x, r in zip(xs, rows, strict=True)
                 if r["predicted_peak_bytes"] is not None]  # fmt: skip
    if predicted:
        ax.scatter(*zip(*predicted, strict=True), marker="_", s=300, color="black", label="predicted (emulator check)")
    capacity = [(x, r["capacity_bytes"] / gib) for x, r in zip(xs, rows, strict=True) if r["capacity_bytes"]]
    if capacity:
        cx, cy = zip(*capacity, strict=True)
        # a step per stage spanning its bar (stages of a heterogeneous cluster may differ)
        ax.step([x - 0.5 for x in cx] + [cx[-1] + 0.5], [*cy, cy[-1]], where="post", color="#c44e52",
                label="GPU capacity")  # fmt: skip
    every = -(-len(rows) // MAX_GROUPS) if rows else 1  # at most MAX_GROUPS labels stay legible
    ax.set_xticks(xs[::every])
    ax.set_xticklabels([str(r["stage"]) for r in rows[::every]])
    ax.set_xlim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per GPU")
    ax.set_ylim(bottom=0)
    ax.set_title("Peak memory per pipeline stage against GPU capacity")
    if rows:
        ax.legend(fontsize="small", loc="lower right")
    return fig
