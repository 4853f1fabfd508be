"""Terminal progress of a long run: a rich progress bar on a terminal, plain lines otherwise.

    emulator run configs/examples/data-parallel.yaml --set program_args.iterations=50

Progress goes to stderr so that stdout keeps only the summary line. On a terminal a bar shows
virtual time, iterations, emulation speed and the ETA; when stderr is not a terminal (a log file,
CI) one plain line is written every ``plain_every_s`` seconds; ``--quiet`` shows nothing.
"""

from __future__ import annotations

import math
import sys
from typing import TextIO

from emulator.monitoring.live import Snapshot


def describe(snap: Snapshot) -> str:
    """One line: ``virtual 1.234 s | iteration 3/200 (1.6%) | speed 0.103x | ETA 3m12s``.

    While the compiled collective kernels load or compile, the speed says so: the emulation may be
    waiting for them (the first run after installing or editing a file of emulator/engine/kernel_cache.SOURCES)."""
    expected = snap.iterations_expected
    total = f"/{int(expected)}" if not math.isnan(expected) else ""
    progress = f" ({snap.run_progress:.1%})" if not math.isnan(snap.run_progress) else ""
    speed = f"speed {snap.speed_ratio:.3g}x" if not math.isnan(snap.speed_ratio) else "speed -"
    parts = [
        f"virtual {snap.virtual_time_s:.3f} s",
        f"iteration {snap.iterations_done}{total}{progress}",
        f"{speed} (compiling kernels)" if snap.compiling else speed,
        f"ETA {format_duration(snap.eta_s)}",
    ]
    return " | ".join(parts)


def format_duration(seconds: float) -> str:
    """``3m12s``; ``-`` when unknown."""
    if math.isnan(seconds) or math.isinf(seconds):
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class ProgressDisplay:
    """Shows snapshots as a bar (``mode="bar"``), plain lines (``"plain"``) or not at all (``"off"``)."""

    def __init__(self, mode: str, stream: TextIO | None = None, plain_every_s: float = 10.0) -> None:
        assert mode in ("bar", "plain", "off"), mode
        self.mode = mode
        self.stream = stream if stream is not None else sys.stderr
        self.plain_every_s = plain_every_s
        self._next_plain_s = plain_every_s
        self._progress = None
        self._task = None

    @staticmethod
    def choose_mode(quiet: bool, stream: TextIO | None = None) -> str:
        stream = stream if stream is not None else sys.stderr
        if quiet:
            return "off"
        return "bar" if stream.isatty() else "plain"

    def show(self, snap: Snapshot) -> None:
        if self.mode == "plain":
            if snap.wall_s >= self._next_plain_s:
                self._next_plain_s = snap.wall_s + self.plain_every_s
                print(f"[{format_duration(snap.wall_s)}] {describe(snap)}", file=self.stream, flush=True)
        elif self.mode == "bar":
            self._bar(snap)

    def _bar(self, snap: Snapshot) -> None:
        expected = None if math.isnan(snap.iterations_expected) else snap.iterations_expected
        done = snap.iterations_done + snap.iteration_progress
        if expected and not math.isnan(snap.run_progress):  # within-iteration progress of a model run
            done = snap.run_progress * expected
        if self._progress is None:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, TextColumn

            self._progress = Progress(
                TextColumn("[bold]emulating"),
                BarColumn(),
                TextColumn("{task.fields[line]}"),
                console=Console(file=self.stream),
                transient=True,  # the summary line replaces the bar
            )
            self._progress.start()
            self._task = self._progress.add_task("run", total=expected, line="")
        self._progress.update(self._task, completed=done, total=expected, line=describe(snap))

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
