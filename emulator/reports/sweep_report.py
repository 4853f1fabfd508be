"""The report of a sweep directory (``emulator sweep``, or a plan's ``DIR/emulated``).

    emulator report runs/sweep-bloom          # runs/sweep-bloom/report.html + report-*.png

One page: every point with its knobs, status and headline figures (human units), the throughput of
each point, and peak memory against iteration time with the Pareto front - the points no other
point beats on both (faster and smaller): the ones worth choosing between.
"""

from __future__ import annotations

import io
from pathlib import Path

from emulator.reports import pages
from emulator.results import units
from emulator.results.rundir import read_csv


def _figure(row: dict, key: str) -> float | None:
    from emulator.studies.sweep import number

    return number(row.get(key))


def pareto_front(rows: list[dict]) -> list[dict]:
    """The ok points that no other ok point beats on both iteration time and peak memory (at least
    as good on both, better on one), fastest first."""
    ok = [r for r in rows if r.get("status") == "ok" and _figure(r, "iteration_time_s") is not None
          and _figure(r, "peak_memory_bytes") is not None]  # fmt: skip
    ok.sort(key=lambda r: (_figure(r, "iteration_time_s"), _figure(r, "peak_memory_bytes"), int(r["point"])))
    front, least_memory = [], float("inf")
    for r in ok:  # by time: a point joins the front when it needs less memory than every faster one
        memory = _figure(r, "peak_memory_bytes")
        if memory < least_memory:
            front.append(r)
            least_memory = memory
    return front


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def plot_throughput(rows: list[dict]):
    """Tokens per second of each point (iterations per virtual second for a user program); a
    failed point is an empty slot labelled with its status."""
    from matplotlib.figure import Figure

    tokens = any(_figure(r, "tokens_per_s") for r in rows)
    fig = Figure(figsize=(max(6.0, 0.35 * len(rows)), 4))
    ax = fig.subplots()
    values = []
    for r in rows:
        if r.get("status") != "ok":
            values.append(0.0)
        elif tokens:
            values.append(_figure(r, "tokens_per_s") or 0.0)
        else:
            t = _figure(r, "iteration_time_s")
            values.append(1.0 / t if t else 0.0)
    ax.bar(range(len(rows)), values, color=["#4c72b0" if r.get("status") == "ok" else "#c44e52" for r in rows])
    for i, r in enumerate(rows):
        if r.get("status") != "ok":
            ax.text(i, 0, str(r.get("status")), rotation=90, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), [str(r["point"]) for r in rows], fontsize=8)
    ax.set_xlabel("point")
    ax.set_ylabel("tokens per virtual second" if tokens else "iterations per virtual second")
    ax.set_title("Throughput per point")
    fig.tight_layout()
    return fig


def plot_pareto(rows: list[dict]):
    """Peak memory against iteration time of every ok point, the Pareto front joined and labelled."""
    from matplotlib.figure import Figure

    ok = [r for r in rows if r.get("status") == "ok" and _figure(r, "iteration_time_s") is not None
          and _figure(r, "peak_memory_bytes") is not None]  # fmt: skip
    front = pareto_front(rows)
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    ax.scatter([_figure(r, "iteration_time_s") for r in ok], [_figure(r, "peak_memory_bytes") / 2**30 for r in ok],
               color="#8c8c8c", label="points")  # fmt: skip
    ax.plot([_figure(r, "iteration_time_s") for r in front], [_figure(r, "peak_memory_bytes") / 2**30 for r in front],
            "o-", color="#dd8452", label="Pareto front")  # fmt: skip
    for r in front:
        ax.annotate(str(r["point"]), (_figure(r, "iteration_time_s"), _figure(r, "peak_memory_bytes") / 2**30),
                    textcoords="offset points", xytext=(4, 4), fontsize=8)  # fmt: skip
    ax.set_xlabel("iteration time (virtual s)")
    ax.set_ylabel("peak memory per GPU (GiB)")
    ax.set_title("Memory against iteration time")
    ax.legend()
    fig.tight_layout()
    return fig


def _cell(row: dict, key: str) -> str:
    value = _figure(row, key)
    if value is None:
        return "-"
    formats = {"iteration_time_s": units.duration_s, "tokens_per_s": units.count, "mfu": units.percent,
               "peak_memory_bytes": units.memory, "wall_time_s": units.duration_s}  # fmt: skip
    return formats[key](value)


def render_sweep_html(name: str, rows: list[dict], pngs: dict[str, bytes]) -> str:
    from emulator.studies.sweep import knob_columns

    knobs = knob_columns(rows)
    front = {r["point"] for r in pareto_front(rows)}
    header = ["point", *knobs, "status", "iteration", "tokens/s", "MFU", "peak memory", "Pareto", "wall", "reason"]
    table = [[str(r["point"]), *(str(r.get(k, "")) if r.get(k, "") != "" else "-" for k in knobs),
              str(r.get("status")), _cell(r, "iteration_time_s"), _cell(r, "tokens_per_s"), _cell(r, "mfu"),
              _cell(r, "peak_memory_bytes"), "yes" if r["point"] in front else "", _cell(r, "wall_time_s"),
              str(r.get("reason") or "")] for r in rows]  # fmt: skip
    ok = sum(r.get("status") == "ok" for r in rows)
    body = (
        f"<p>{len(rows)} points, {ok} ok. The Pareto front holds the points no other point beats on both "
        "iteration time and peak memory.</p>"
        + pages.section("Points", pages.table(table, header))
        + pages.section("Throughput", pages.image("throughput", pngs))
        + pages.section("Memory against iteration time", pages.image("pareto", pngs))
    )
    return pages.html_page(f"Sweep report: {name}", body)


def write_sweep_report(sweep_dir: Path, page: Path) -> tuple[Path, list[Path]]:
    """The page and PNGs of a sweep directory (its ``sweep.csv``)."""
    rows = read_csv(sweep_dir / "sweep.csv")
    pngs = {"throughput": _png(plot_throughput(rows)), "pareto": _png(plot_pareto(rows))} if rows else {}
    paths = []
    for name, png in pngs.items():
        path = page.with_name(f"{page.stem}-{name}.png")
        path.write_bytes(png)
        paths.append(path)
    page.write_text(render_sweep_html(sweep_dir.resolve().name, rows, pngs))
    return page, paths
