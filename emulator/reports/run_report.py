"""``emulator report RUN_DIR``: PNG plots of a run and one self-contained HTML page embedding them.

emulator report runs/dp                     # runs/dp/report.html + runs/dp/report-*.png
emulator report runs/dp --out /tmp/dp.html  # /tmp/dp.html + /tmp/dp-*.png

The page is meant to be sent as it is: figures in human units, where the time went (communication
split per parallelism dimension), memory per pipeline stage against the GPUs' capacity, the
published measurement when the run is a validation case, and a link to the trace. A failed or
interrupted run gets a page saying so, with whatever figures and tables it reached.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

import yaml

from emulator.reports import pages
from emulator.reports.published import published_rows
from emulator.results import units
from emulator.results.rundir import RunTables, read_run_dir
from emulator.results.tables import comm_split_rows, stage_memory_rows

# (summary key, label, formatter) of the headline table, in this order; absent figures are left out
HEADLINE = (
    ("name", "run", str),
    ("status", "status", str),
    ("world_size", "GPUs", units.count),
    ("iterations", "iterations", units.count),
    ("iteration_time_s", "iteration time (mean)", units.duration_s),
    ("sim_time_s", "virtual time", units.duration_s),
    ("virtual_time_reached_s", "virtual time reached", units.duration_s),
    ("tokens_per_s", "throughput", lambda v: f"{units.count(v)} tokens/s"),
    ("mfu", "MFU (model FLOPs / peak)", units.percent),
    ("model_tflops_per_gpu", "model TFLOP/s per GPU", lambda v: f"{v:.1f} TFLOP/s"),
    ("hardware_tflops_per_gpu", "hardware TFLOP/s per GPU", lambda v: f"{v:.1f} TFLOP/s"),
    ("bubble_fraction", "pipeline bubble (of the iteration)", units.percent),
    ("exposed_comm_fraction", "exposed communication (of the iteration)", units.percent),
    ("peak_memory_bytes", "peak memory (largest rank)", units.memory),
    ("events", "engine events", units.count),
    ("wall_time_s", "wall time", units.duration_s),
    ("speed_ratio", "speed (virtual s per wall s)", lambda v: f"{v:.3g}x"),
    ("fingerprint", "fingerprint", str),
)

# plots, in page order: (name, the table whose rows it draws; no rows, no plot)
PLOTS = (("breakdown", "ranks"), ("memory", "ranks"), ("link-utilisation", "timeline"),
         ("message-sizes", "histograms"), ("busiest-links", "links"))  # fmt: skip

def render_figures(data: RunTables) -> dict[str, bytes]:
    """PNG bytes of every plot whose table has rows (a failed run may have none), by name."""
    import io

    # plots builds bare Figures, which render through Agg without selecting a GUI backend
    from emulator.results import plots

    makers = {
        "breakdown": plots.plot_breakdown,
        "memory": plots.plot_memory_by_stage,
        "link-utilisation": plots.plot_link_utilisation,
        "message-sizes": plots.plot_message_sizes,
        "busiest-links": plots.plot_busiest_links,
    }
    out = {}
    for name, table in PLOTS:
        if not getattr(data, table) or (name == "busiest-links" and not any(r["bytes"] for r in data.links)):
            continue
        buf = io.BytesIO()
        makers[name](data).savefig(buf, format="png", dpi=100)
        out[name] = buf.getvalue()
    return out


def status_banner(summary: dict, has_tables: bool) -> str:
    """The failure notice of a run that did not complete (empty for a completed one)."""
    status = summary.get("status", "completed")
    if status == "completed":
        return ""
    what = "was interrupted" if status == "interrupted" else "failed"
    reached = summary.get("virtual_time_reached_s")
    text = f"<strong>This run {what}</strong>"
    if summary.get("error"):
        text += f": {html.escape(str(summary['error']))}"
    if reached is not None:
        text += f". It reached {html.escape(units.duration_s(reached))} of virtual time"
    if summary.get("lost_shard") is not None:
        text += f"; shard {summary['lost_shard']} was lost (host {html.escape(str(summary.get('lost_shard_host')))})"
    text += (". The figures below are what it reached." if has_tables
             else ". It wrote no tables, so there are no plots; the figures below are all it recorded.")  # fmt: skip
    return f'<p class="failed">{text}</p>'


def headline_rows(summary: dict) -> list[list[str]]:
    return [[label, fmt(summary[key])] for key, label, fmt in HEADLINE if summary.get(key) is not None]


def published_section(data: RunTables) -> str:
    rows = published_rows(data.config, data.summary)
    if not rows:
        return ""

    def value(v: float, unit: str) -> str:
        return units.percent(v) if unit == "" else f"{v:.4g} {unit}"

    lines = "".join(
        f"<p>{html.escape(r['figure'])}: published {value(r['published'], r['unit'])}, emulated "
        f"{value(r['predicted'], r['unit'])}, error {r['error_pct']:+.1f}%</p>"
        for r in rows
    )
    cells = [[r["figure"], value(r["published"], r["unit"]), value(r["predicted"], r["unit"]),
              f"{r['error_pct']:+.1f}%"] for r in rows]  # fmt: skip
    table = pages.table(cells, ["figure", "published", "emulated", "error"])
    case, source = html.escape(rows[0]["case"]), html.escape(rows[0]["source"])
    source = f'<p class="note">This run is the validation case "{case}" ({source}).</p>'
    return pages.section("Published measurement", lines + table + source)


def _ideal_bubble_note(config: dict) -> str:
    """The schedule's own bubble, (p-1)/(v*m) of the compute time (Narayanan et al. 2021), for reading
    the pipeline waits of a training run."""
    parallel, training = config.get("parallel") or {}, config.get("training") or {}
    p = parallel.get("pipeline") or 1
    if p <= 1 or not config.get("model") or not training.get("micro_batch_size"):
        return ""
    v = parallel.get("virtual_stages") or 1
    m = training["global_batch_size"] // (training["micro_batch_size"] * (parallel.get("data") or 1))
    return (f'<p class="note">The schedule itself idles a stage (p-1)/(v*m) = ({p}-1)/({v}*{m}) = '
            f"{units.percent((p - 1) / (v * m))} of its compute time (Narayanan et al. 2021); pipeline waits beyond "
            "that are transfers between stages and imbalance.</p>")  # fmt: skip


def time_section(data: RunTables, pngs: dict[str, bytes]) -> str:
    ranks = data.ranks
    if not ranks:
        return ""
    n = len(ranks)
    run_ns = sum(r["compute_ns"] + r["exposed_comm_ns"] + r["bubble_ns"] + r["idle_ns"] for r in ranks) / n or 1
    parts = (("compute", "compute_ns"), ("exposed communication", "exposed_comm_ns"),
             ("overlapped communication (hidden by compute)", "overlapped_comm_ns"),
             ("pipeline bubble (waiting on pp.* streams)", "bubble_ns"), ("idle", "idle_ns"))  # fmt: skip
    means = [(label, sum(r[c] for r in ranks) / n) for label, c in parts]
    rows = [[label, units.duration_ns(ns), units.percent(ns / run_ns)] for label, ns in means]
    split = [[r["part"], units.duration_ns(r["mean_ns"]), units.percent(r["fraction"])] for r in comm_split_rows(ranks)]
    body = (pages.table(rows, ["part", "per rank (mean)", "of the run time"])
            + "<h3>Communication the compute stream waited for, per parallelism dimension</h3>"
            + pages.table(split, ["dimension (stream)", "per rank (mean)", "of the run time"])
            + _ideal_bubble_note(data.config) + pages.image("breakdown", pngs))  # fmt: skip
    return pages.section("Where the time went", body)


def memory_section(data: RunTables, pngs: dict[str, bytes]) -> str:
    rows = stage_memory_rows(data.ranks, data.summary)
    if not rows:
        return ""
    cells = [[str(r["stage"]), r["gpu"], units.count(r["ranks"]), units.memory(r["peak_memory_bytes"]),
              units.memory(r["predicted_peak_bytes"]), units.memory(r["capacity_bytes"]),
              units.percent(r["fraction_of_capacity"])] for r in rows]  # fmt: skip
    header = ["stage", "GPU", "ranks", "peak (emulated)", "predicted (emulator check)", "capacity", "of capacity"]
    return pages.section("Memory per pipeline stage", pages.table(cells, header) + pages.image("memory", pngs))


def traffic_section(data: RunTables, pngs: dict[str, bytes]) -> str:
    s = data.summary
    sim_s = s.get("sim_time_s") or 0.0
    rows = [[t, units.traffic(b), units.count(s.get("messages_by_tier", {}).get(t)),
             units.rate_GBps(b / sim_s) if sim_s else units.MISSING,
             units.percent(s.get("utilisation_by_tier", {}).get(t))]
            for t, b in s.get("bytes_by_tier", {}).items()]  # fmt: skip
    if not rows:
        return ""
    header = ["tier", "bytes", "messages", "mean throughput", "link utilisation"]
    body = pages.table(rows, header) + pages.image("link-utilisation", pngs)
    if "message-sizes" in pngs:
        body += "<h3>Message sizes</h3>" + pages.image("message-sizes", pngs)
    return pages.section("Traffic per tier", body)


def links_section(data: RunTables, pngs: dict[str, bytes]) -> str:
    busiest = sorted((r for r in data.links if r["bytes"]), key=lambda r: (-r["utilisation"], r["link"]))[:10]
    if not busiest:
        return ""
    rows = [[r["name"], r["tier"], r["src"], r["dst"], units.rate_GBps(r["bandwidth_GBps"] * 1e9),
             units.traffic(r["bytes"]), units.percent(r["utilisation"]), units.duration_ns(r["peak_queue_ns"])]
            for r in busiest]  # fmt: skip
    header = ["link", "tier", "from", "to", "bandwidth", "bytes", "utilisation", "longest queueing"]
    return pages.section("Busiest links", pages.table(rows, header) + pages.image("busiest-links", pngs))


def faults_section(data: RunTables) -> str:
    """The faults of the run (emulator/engine/faults.py): the slowed ranks with the compute time each lost,
    and the degraded links with their bandwidth and load; empty for a run without faults."""
    faults = data.summary.get("faults")
    if not faults:
        return ""
    body = ""
    if faults.get("jitter"):
        j = faults["jitter"]
        ranks = j["ranks"] if j["ranks"] == "all" else f"ranks {', '.join(map(str, j['ranks'][:16]))}"
        body += f"<p>Kernel jitter: lognormal(0, {j['sigma']:g}) on {html.escape(ranks)}, seed {faults['seed']}.</p>"
    stragglers = data.summary.get("stragglers") or []
    if stragglers:
        rows = [[r["rank"], r["node"], f"{r['slowdown']:.4g}x", units.duration_ns(r["compute_ns"]),
                 units.duration_ns(r["lost_ns"])] for r in stragglers]  # fmt: skip
        header = ["rank", "node", "compute slowdown", "compute", "compute lost"]
        body += "<h3>Stragglers</h3>" + pages.table(rows, header)
        body += ('<p class="note">Compute lost: the rank\'s compute time minus what it would have been '
                 "without faults. In a synchronous job every collective waits for the slowest member, "
                 "so the others lose about as much, as exposed communication.</p>")  # fmt: skip
    degraded = {name: f["factor"] for f in faults.get("slow_link", []) for name in f["links"]}
    if degraded:
        by_name = {r["name"]: r for r in data.links}
        rows = [[name, units.percent(factor, 0), units.rate_GBps(by_name[name]["bandwidth_GBps"] * 1e9),
                 units.traffic(by_name[name]["bytes"]), units.percent(by_name[name]["utilisation"])]
                for name, factor in list(degraded.items())[:20] if name in by_name]  # fmt: skip
        shown = "" if len(degraded) <= 20 else f" (20 of {len(degraded)})"
        body += f"<h3>Degraded links{shown}</h3>" + pages.table(rows, ["link", "bandwidth left", "bandwidth", "bytes",
                                                                  "utilisation"])  # fmt: skip
    return pages.section("Faults", body)


def jobs_section(data: RunTables) -> str:
    """A run with ``jobs`` (emulator/runner/jobs.py): each job's headline figures and where it ran."""
    jobs = data.summary.get("jobs")
    if not jobs:
        return ""

    def where(job: dict) -> str:
        slots = job.get("placement", [])
        shown = [f"node {p['node']} GPUs {p['first_gpu']}-{p['first_gpu'] + p['gpus'] - 1}" for p in slots[:8]]
        return ", ".join(shown) + (" ..." if len(slots) > 8 else "")

    def rate(job: dict) -> str:
        return units.MISSING if job.get("tokens_per_s") is None else f"{units.count(job['tokens_per_s'])} tokens/s"

    rows = [[j["name"], units.count(j.get("world_size")), units.count(j.get("iterations")),
             units.duration_s(j.get("iteration_time_s")), rate(j), units.percent(j.get("mfu")),
             units.percent(j.get("exposed_comm_fraction")), where(j)] for j in jobs]  # fmt: skip
    header = ["job", "GPUs", "iterations", "iteration time (mean)", "throughput", "MFU", "exposed communication",
              "placement"]  # fmt: skip
    note = ('<p class="note">The jobs share this run\'s network: the traffic and link tables below are their '
            "combined traffic. Each job's own figures and ranks are in <code>jobs/&lt;name&gt;/</code>.</p>")
    return pages.section("Jobs", pages.table(rows, header) + note)


def trace_section(trace: Path | None, page: Path | None) -> str:
    if trace is None or not trace.is_file():
        return ""
    href = os.path.relpath(trace, page.parent) if page is not None else str(trace)
    size = units.traffic(trace.stat().st_size)
    return pages.section("Trace", (
        f'<p><a href="{html.escape(Path(href).as_posix())}">{html.escape(trace.name)}</a> ({size}): the traced '
        "ranks' operations, one track per GPU stream, with waits and link utilisation. Open it in "
        '<a href="https://ui.perfetto.dev">ui.perfetto.dev</a> ("Open trace file", or drop the file on the page) '
        "or in chrome://tracing (Load); both read the file locally, nothing is uploaded.</p>"))  # fmt: skip


def render_html(data: RunTables, pngs: dict[str, bytes], trace: Path | None = None, page: Path | None = None) -> str:
    s = data.summary
    has_tables = bool(data.ranks or data.links)
    sections = [
        status_banner(s, has_tables),
        pages.section("Summary", pages.table(headline_rows(s), ["figure", "value"])),
        published_section(data),
        jobs_section(data),
        faults_section(data),
        time_section(data, pngs),
        memory_section(data, pngs),
        traffic_section(data, pngs),
        links_section(data, pngs),
        trace_section(trace, page),
        pages.section("Resolved config", f"<pre>{html.escape(yaml.safe_dump(data.config, sort_keys=False))}</pre>"),
    ]
    return pages.html_page(f"Run report: {s.get('name', '')}", "".join(part for part in sections if part))


def write_report(run_dir: str | Path, out: str | Path | None = None) -> tuple[Path, list[Path]]:
    """Write the PNGs and the HTML page; returns the page and the PNG paths. A sweep directory
    (``sweep.csv``, no ``summary.json``) gets the sweep's page (emulator/reports/sweep_report.py)."""
    page = Path(out) if out else Path(run_dir) / "report.html"
    if (Path(run_dir) / "sweep.csv").is_file() and not (Path(run_dir) / "summary.json").is_file():
        from emulator.reports.sweep_report import write_sweep_report

        page.parent.mkdir(parents=True, exist_ok=True)
        return write_sweep_report(Path(run_dir), page)
    data = read_run_dir(run_dir)
    page.parent.mkdir(parents=True, exist_ok=True)
    pngs = render_figures(data)
    paths = []
    for name, png in pngs.items():
        path = page.with_name(f"{page.stem}-{name}.png")
        path.write_bytes(png)
        paths.append(path)
    page.write_text(render_html(data, pngs, Path(run_dir) / "trace.json", page))
    return page, paths
