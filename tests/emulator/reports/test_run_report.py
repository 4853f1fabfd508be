"""`emulator report`: PNG plots and one self-contained HTML page embedding them, in human units,
with the communication split per parallelism dimension, memory per stage, the published figure of
a validation case, the trace link, and a page for failed runs."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from emulator.cli import main
from emulator.reports.published import published_rows
from emulator.results.plots import breakdown_groups
from emulator.results.rundir import read_run_dir
from emulator.results.tables import comm_split_rows, stage_memory_rows
from tests.conftest import CONFIGS

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("message-sizes", "link-utilisation", "breakdown", "busiest-links", "memory")
GiB = 1 << 30


def report(run_dir: Path, out: Path | None = None) -> str:
    """The page `emulator report` writes for ``run_dir``."""
    assert main(["report", str(run_dir), *(["--out", str(out)] if out else [])]) == 0
    return (out or run_dir / "report.html").read_text()


def headings(page: str) -> list[str]:
    return re.findall(r"<h[1-6][^>]*>(.*?)</h[1-6]>", page)


def cells(page: str) -> list[str]:
    return re.findall(r"<td[^>]*>(.*?)</td>", page)


def test_report_renders_its_images(dp_dir, tmp_path, capsys):
    """The report writes four PNGs and an HTML page holding the same four images inline."""
    page = tmp_path / "out" / "dp.html"
    assert main(["report", str(dp_dir), "--out", str(page)]) == 0
    assert str(page) in capsys.readouterr().out
    for name in PLOTS:
        png = (tmp_path / "out" / f"dp-{name}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 10_000
    html = page.read_text()
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == len(PLOTS)
    assert all(base64.b64decode(i).startswith(PNG_MAGIC) for i in images)
    assert 'src="http' not in html and "<script" not in html  # self-contained
    assert "ib-spine" in html and "fingerprint" in html


def test_report_default_location(pp_dir):
    """Without --out the page goes into the run directory."""
    assert main(["report", str(pp_dir)]) == 0
    assert (pp_dir / "report.html").is_file() and (pp_dir / "report-breakdown.png").is_file()


def test_report_of_a_missing_run_is_a_user_error(tmp_path, capsys):
    """A directory without summary.json exits 2 with one line."""
    assert main(["report", str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_breakdown_groups_by_stage_or_binned_nodes():
    """Stages when there are several; else nodes, binned to at most 32 bars."""
    ranks = [{"rank": r, "node": r // 8, "stage": r // 1536} for r in range(3072)]
    assert [name for name, _ in breakdown_groups(ranks)] == ["stage 0", "stage 1"]
    flat = [dict(r, stage=0) for r in ranks]
    groups = breakdown_groups(flat)
    assert len(groups) == 32 and groups[0][0] == "nodes 0-11" and sum(len(g) for _, g in groups) == 3072


@pytest.mark.parametrize("fixture", ["dp_dir", "gpt_dir", "validation_case_dir"])
def test_figures_are_in_human_units(fixture, request, tmp_path):
    """No table cell is a raw byte count or nanosecond figure; sizes, times and rates carry units."""
    page = report(request.getfixturevalue(fixture), tmp_path / "r.html")
    raw = [c for c in cells(page) if re.fullmatch(r"-?\d{5,}(\.\d+)?", c)]
    assert raw == []
    for unit in ("GiB", "GB/s", " s<", "%"):
        assert unit in page, unit
    assert re.search(r"<td[^>]*>[\d.]+ (TB|GB|MB)</td>", page)  # traffic per tier


@pytest.mark.parametrize("fixture", ["dp_dir", "gpt_dir", "validation_case_dir"])
def test_no_duplicate_headings(fixture, request, tmp_path):
    """Every heading of the page is there once (plots sit in their sections, not under own titles)."""
    titles = headings(report(request.getfixturevalue(fixture), tmp_path / "r.html"))
    assert len(titles) == len(set(titles)), titles
    assert {"Summary", "Where the time went", "Memory per pipeline stage", "Traffic per tier", "Trace"} <= set(titles)


def test_communication_split_per_dimension(gpt_dir):
    """Tensor (tp), data (dp) and pipeline (pp.*) waits: tp + dp is the exposed communication of the
    training workload, pipeline waits are its bubble; the summary's fractions agree."""
    data = read_run_dir(gpt_dir)
    for r in data.ranks:
        assert r["exposed_tp_ns"] + r["exposed_dp_ns"] == r["exposed_comm_ns"]
    assert all(sum(r[c] for r in data.ranks) > 0 for c in ("exposed_tp_ns", "exposed_dp_ns", "bubble_ns"))
    rows = {row["part"]: row for row in comm_split_rows(data.ranks)}
    assert rows["other streams"]["mean_ns"] == 0
    mean_tp = sum(r["exposed_tp_ns"] for r in data.ranks) / len(data.ranks)
    assert rows["tensor parallel (tp)"]["mean_ns"] == mean_tp
    s = data.summary
    by_dim = s["wait_fraction_by_dimension"]
    assert by_dim["tensor"] + by_dim["data"] == pytest.approx(s["exposed_comm_fraction"])
    assert 0 < by_dim["pipeline"] <= s["bubble_fraction"]
    page = report(gpt_dir)
    assert "tensor parallel (tp)" in page and "data parallel (dp)" in page and "(p-1)/(v*m) = (8-1)/(3*8)" in page


def test_communication_split_arithmetic():
    """Means per rank and fractions of the run time; waits on other streams are 'other'."""
    ranks = [{"compute_ns": 600, "exposed_comm_ns": 300, "exposed_tp_ns": 200, "exposed_dp_ns": 50, "bubble_ns": 100,
              "idle_ns": 0}, {"compute_ns": 800, "exposed_comm_ns": 100, "exposed_tp_ns": 100, "exposed_dp_ns": 0,
              "bubble_ns": 100, "idle_ns": 0}]  # fmt: skip
    rows = {row["part"]: (row["mean_ns"], row["fraction"]) for row in comm_split_rows(ranks)}
    assert rows["tensor parallel (tp)"] == (150, 0.15) and rows["data parallel (dp)"] == (25, 0.025)
    assert rows["other streams"] == (25, 0.025) and rows["pipeline parallel (pp.*): bubble and transfers"] == (100, 0.1)
    old = [{k: v for k, v in r.items() if k not in ("exposed_tp_ns", "exposed_dp_ns")} for r in ranks]
    unsplit = {row["part"]: row["mean_ns"] for row in comm_split_rows(old)}  # a run directory from before
    assert unsplit["tensor parallel (tp)"] is None and unsplit["data parallel (dp)"] is None
    assert unsplit["exposed communication, not split (ranks.csv predates the split)"] == 200


def test_memory_per_stage_against_capacity(gpt_dir):
    """One row per pipeline stage: the largest peak of its ranks (= the summary's), the prediction of
    `emulator check` and the A100's 80 GiB."""
    data = read_run_dir(gpt_dir)
    rows = stage_memory_rows(data.ranks, data.summary)
    assert [r["stage"] for r in rows] == list(range(8)) and all(r["ranks"] == 16 for r in rows)
    by_stage = data.summary["peak_memory_bytes_by_stage"]
    assert {str(r["stage"]): r["peak_memory_bytes"] for r in rows} == by_stage
    predicted = data.summary["predicted_peak_memory_bytes_by_stage"]
    assert [r["predicted_peak_bytes"] for r in rows] == list(predicted.values())
    assert all(r["capacity_bytes"] == 80 * GiB and 0 < r["fraction_of_capacity"] < 1 for r in rows)
    page = report(gpt_dir)
    assert page.count("80.00 GiB") >= 8 and f"{by_stage['0'] / GiB:.2f} GiB" in page


def test_published_figure_of_a_validation_case(validation_case_dir):
    """megatron-22b-8gpu is Table 5's 22B selective + SP case: the page shows published, emulated, error."""
    data = read_run_dir(validation_case_dir)
    rows = published_rows(data.config, data.summary)
    assert [(r["figure"], r["published"]) for r in rows] == [("iteration time", 1.10), ("MFU", 0.415)]
    emulated = data.summary["iteration_time_s"]
    assert rows[0]["error_pct"] == pytest.approx(100 * (emulated - 1.10) / 1.10)
    page = report(validation_case_dir)
    assert f"iteration time: published 1.1 s, emulated {emulated:.4g} s, error {rows[0]['error_pct']:+.1f}%" in page
    assert "Table 5" in page


def test_no_published_figure_for_another_job(validation_case_dir, gpt_dir):
    """A different batch size is a different job; a run that is no case has no such section."""
    data = read_run_dir(validation_case_dir)
    bigger = json.loads(json.dumps(data.config))
    bigger["training"]["global_batch_size"] = 8
    assert published_rows(bigger, data.summary) == []
    assert published_rows(read_run_dir(gpt_dir).config, {"iteration_time_s": 1.0}) == []
    assert "Published measurement" not in report(gpt_dir)


def test_trace_link_resolves_from_the_page(pp_dir, tmp_path):
    """The trace link is relative to wherever the page is written, and says how to open the file."""
    page = report(pp_dir, tmp_path / "elsewhere" / "pp.html")
    (href,) = re.findall(r'<a href="([^"]+)">trace.json</a>', page)
    assert (tmp_path / "elsewhere" / href).resolve() == (pp_dir / "trace.json").resolve()
    assert "ui.perfetto.dev" in page and "chrome://tracing" in page


def test_report_of_a_failed_run_says_so(tmp_path, capsys):
    """A deadlocked run's directory (status failed, tables so far) gets a page naming the failure."""
    out = tmp_path / "deadlock"
    assert main(["run", str(CONFIGS / "examples" / "deadlock.yaml"), "--out", str(out)]) == 2
    page = report(out)
    assert "This run failed</strong>: deadlock: 32 rank(s) blocked forever" in page
    titles = headings(page)
    assert len(titles) == len(set(titles)) and "Summary" in titles


def test_report_of_a_run_without_tables(tmp_path, capsys):
    """An interrupted run that wrote only summary.json and config.yaml: a page, no plots, no traceback."""
    run_dir = tmp_path / "interrupted"
    run_dir.mkdir()
    summary = {"status": "interrupted", "error": "interrupted", "name": "big", "world_size": 3072,
               "virtual_time_reached_s": 41.5, "wall_time_s": 60.0}  # fmt: skip
    (run_dir / "summary.json").write_text(json.dumps(summary))
    (run_dir / "config.yaml").write_text("name: big\n")
    page = report(run_dir)
    assert "(0 plots" in capsys.readouterr().out and "<img" not in page
    assert "This run was interrupted" in page and "41.5 s of virtual time" in page and "no tables" in page
