"""`emulator report`: PNG plots and one self-contained HTML page embedding them."""

from __future__ import annotations

import base64
import re

from emulator.cli import main
from emulator.results.plots import breakdown_groups

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PLOTS = ("message-sizes", "link-utilisation", "breakdown", "busiest-links")


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
