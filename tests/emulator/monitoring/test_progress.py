"""Terminal progress: the line it shows, and which display a run gets."""

from __future__ import annotations

import io
import math

from emulator.monitoring.live import Snapshot
from emulator.monitoring.progress import ProgressDisplay, describe, format_duration


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_describe_shows_virtual_time_iterations_speed_and_eta():
    """One line with every figure; unknown ones shown as '-'."""
    snap = Snapshot(virtual_time_s=1.2345, iterations_done=3, iterations_expected=200.0, speed_ratio=0.1034, eta_s=192)
    assert describe(snap) == "virtual 1.234 s | iteration 3/200 | speed 0.103x | ETA 3m12s"
    assert describe(Snapshot()) == "virtual 0.000 s | iteration 0 | speed - | ETA -"


def test_format_duration():
    """Seconds, minutes, hours; NaN is unknown."""
    assert [format_duration(s) for s in (5, 65, 3725, math.nan)] == ["5s", "1m05s", "1h02m", "-"]


def test_mode_follows_quiet_and_terminal():
    """--quiet: nothing; a terminal: the bar; a pipe or file: plain lines."""
    assert ProgressDisplay.choose_mode(quiet=True, stream=Terminal()) == "off"
    assert ProgressDisplay.choose_mode(quiet=False, stream=Terminal()) == "bar"
    assert ProgressDisplay.choose_mode(quiet=False, stream=io.StringIO()) == "plain"


def test_plain_lines_are_spaced_in_wall_time():
    """Plain mode writes one line per period, none before the first period has passed."""
    out = io.StringIO()
    display = ProgressDisplay("plain", out, plain_every_s=10)
    for wall in (0.5, 5, 10.5, 12, 21):
        display.show(Snapshot(wall_s=wall, virtual_time_s=wall / 10))
    assert [line.split("]")[0] for line in out.getvalue().splitlines()] == ["[10s", "[21s"]


def test_bar_renders_and_clears():
    """The bar shows the figures on a terminal and is removed when the run ends."""
    term = Terminal()
    display = ProgressDisplay("bar", term)
    display.show(Snapshot(wall_s=1, virtual_time_s=0.5, iterations_done=1, iterations_expected=4.0, speed_ratio=0.5))
    display.close()
    assert "iteration 1/4" in term.getvalue()
