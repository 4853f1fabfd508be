"""``emulator report RUN_DIR``: PNG plots of a run and one self-contained HTML page embedding them.

emulator report runs/dp                     # runs/dp/report.html + runs/dp/report-*.png
emulator report runs/dp --out /tmp/dp.html  # /tmp/dp.html + /tmp/dp-*.png
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

import yaml

from emulator.results.rundir import RunTables, read_run_dir

HEADLINE = ("name", "world_size", "iterations", "iteration_time_s", "sim_time_s", "tokens_per_s", "mfu",
            "model_tflops_per_gpu", "bubble_fraction", "exposed_comm_fraction", "peak_memory_bytes", "events",
            "wall_time_s", "speed_ratio", "fingerprint")  # fmt: skip

STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1250px} table{border-collapse:collapse;margin:1em 0} "
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left} img{max-width:100%} "
    "pre{background:#f6f6f6;padding:1em}"
)


def render_figures(data: RunTables) -> dict[str, bytes]:
    """PNG bytes of every plot, by name."""
    import io

    # plots builds bare Figures, which render through Agg without selecting a GUI backend
    from emulator.results import plots

    figures = {
        "message-sizes": plots.plot_message_sizes(data),
        "link-utilisation": plots.plot_link_utilisation(data),
        "breakdown": plots.plot_breakdown(data),
        "busiest-links": plots.plot_busiest_links(data),
    }
    out = {}
    for name, fig in figures.items():
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        out[name] = buf.getvalue()
    return out


def _table(rows: list[list], header: list[str]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v))}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _breakdown_rows(data: RunTables) -> list[list]:
    ranks = data.ranks
    if not ranks:
        return []
    total = sum(r["compute_ns"] + r["exposed_comm_ns"] + r["bubble_ns"] + r["idle_ns"] for r in ranks) or 1
    cols = ("compute_ns", "exposed_comm_ns", "overlapped_comm_ns", "bubble_ns", "idle_ns")
    return [[c.removesuffix("_ns"), sum(r[c] for r in ranks) / len(ranks) / 1e6,
             sum(r[c] for r in ranks) / total] for c in cols]  # fmt: skip


def render_html(data: RunTables, pngs: dict[str, bytes]) -> str:
    s = data.summary
    headline = [[k, s[k]] for k in HEADLINE if s.get(k) is not None]
    tiers = [[t, b, s.get("messages_by_tier", {}).get(t), s.get("utilisation_by_tier", {}).get(t)]
             for t, b in s.get("bytes_by_tier", {}).items()]  # fmt: skip
    busiest = sorted((r for r in data.links if r["bytes"]), key=lambda r: (-r["utilisation"], r["link"]))[:10]
    images = "".join(
        f"<h2>{html.escape(name.replace('-', ' '))}</h2>"
        f'<img alt="{name}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        for name, png in pngs.items()
    )
    title = html.escape(f"Run report: {s.get('name', '')}")
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>{STYLE}</style>
</head><body><h1>{title}</h1>
{_table(headline, ["figure", "value"])}
<h2>Traffic per tier</h2>{_table(tiers, ["tier", "bytes", "messages", "utilisation"])}
<h2>Time per rank (mean)</h2>{_table(_breakdown_rows(data), ["part", "ms per rank", "fraction of run time"])}
{images}
<h2>Busiest links</h2>{
        _table(
            [
                [r["name"], r["tier"], r["src"], r["dst"], r["bytes"], r["utilisation"], r["peak_queue_ns"]]
                for r in busiest
            ],
            ["link", "tier", "from", "to", "bytes", "utilisation", "peak queue (ns)"],
        )
    }
<h2>Resolved config</h2><pre>{html.escape(yaml.safe_dump(data.config, sort_keys=False))}</pre>
</body></html>
"""


def write_report(run_dir: str | Path, out: str | Path | None = None) -> tuple[Path, list[Path]]:
    """Write the PNGs and the HTML page; returns the page and the PNG paths."""
    data = read_run_dir(run_dir)
    page = Path(out) if out else Path(run_dir) / "report.html"
    page.parent.mkdir(parents=True, exist_ok=True)
    pngs = render_figures(data)
    paths = []
    for name, png in pngs.items():
        path = page.with_name(f"{page.stem}-{name}.png")
        path.write_bytes(png)
        paths.append(path)
    page.write_text(render_html(data, pngs))
    return page, paths
