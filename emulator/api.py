"""The notebook API: run a config from Python and study its results.

    import emulator
    r = emulator.run("configs/examples/data-parallel.yaml", overrides={"program_args.iterations": 2})
    r.summary["iteration_time_s"], r.fingerprint
    r.links.sort_values("utilisation").tail()     # pandas DataFrames when pandas is installed
    r.plot_breakdown()                             # matplotlib figures

``emulator.load("runs/dp")`` gives the same object for a run directory written earlier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from emulator.config.loader import load_config
from emulator.errors import ConfigError
from emulator.results.rundir import RunTables, read_run_dir


def _frame(rows: list[dict], columns: tuple[str, ...] = ()) -> Any:
    """A pandas DataFrame when pandas is importable, else the rows themselves (a list of dicts)."""
    try:
        import pandas
    except ImportError:
        return [dict(r) for r in rows]
    return pandas.DataFrame(rows, columns=list(columns) or None)


class RunResults:
    """A finished run: ``summary`` (dict), ``links``/``ranks``/``histograms``/``timeline`` tables,
    ``fingerprint``, plotting helpers; ``result``/``topo``/``config`` are the raw objects of a fresh run."""

    def __init__(self, data: RunTables, config=None, result=None, topo=None, run_dir: Path | None = None):
        self.tables = data
        self.config = config
        self.result = result
        self.topo = topo
        self.run_dir = run_dir

    @property
    def summary(self) -> dict:
        return self.tables.summary

    @property
    def fingerprint(self) -> str:
        return self.tables.summary["fingerprint"]

    @property
    def links(self) -> Any:
        from emulator.results.tables import LINK_COLUMNS

        return _frame(self.tables.links, LINK_COLUMNS)

    @property
    def ranks(self) -> Any:
        from emulator.results.tables import RANK_COLUMNS

        return _frame(self.tables.ranks, RANK_COLUMNS)

    @property
    def histograms(self) -> Any:
        from emulator.results.tables import HISTOGRAM_COLUMNS

        return _frame(self.tables.histograms, HISTOGRAM_COLUMNS)

    @property
    def timeline(self) -> Any:
        from emulator.results.tables import TIMELINE_COLUMNS

        return _frame(self.tables.timeline, TIMELINE_COLUMNS)

    def plot_message_sizes(self):
        from emulator.results.plots import plot_message_sizes

        return plot_message_sizes(self.tables)

    def plot_link_utilisation(self):
        from emulator.results.plots import plot_link_utilisation

        return plot_link_utilisation(self.tables)

    def plot_breakdown(self):
        from emulator.results.plots import plot_breakdown

        return plot_breakdown(self.tables)

    def plot_busiest_links(self, count: int = 20):
        from emulator.results.plots import plot_busiest_links

        return plot_busiest_links(self.tables, count)

    def write(self, out: str | Path) -> Path:
        """Write the run directory (a fresh run only: it needs the raw results)."""
        if self.result is None:
            raise ConfigError("write(): this RunResults was loaded from a directory; it has no raw results")
        from emulator.runner.sequence import write_outputs

        self.run_dir, _ = write_outputs(out, self.config, self.summary, self.result, self.topo)
        return self.run_dir

    def __repr__(self) -> str:
        s = self.summary
        it = s.get("iteration_time_s")
        return (f"<RunResults {s.get('name', '')!r}: {s.get('world_size')} GPUs, virtual {s.get('sim_time_s', 0):.6f} s"
                + (f", iteration {it:.6f} s" if it else "") + f", fingerprint {s.get('fingerprint')}>")  # fmt: skip


def run(path_or_config, overrides: dict | list | None = None, backend: str = "inline", shards: int = 1,
        out: str | Path | None = None, trace_ranks: str | list[int] | None = "default", address: str | None = None,
        wandb: bool = False) -> RunResults:  # fmt: skip
    """Run a config as ``emulator run`` does; writes the run directory only when ``out`` is given.

    ``trace_ranks``: ``"default"`` (the first node), ``"all"``, ``"none"``, ``"0-7,64"`` or a list.
    Raises the project's errors (ConfigError, DeadlockError, ...) like the command line.
    """
    from emulator.runner.sequence import run_job

    config = load_config(path_or_config, overrides)
    if wandb:
        from emulator.results.wandb_log import require_wandb

        require_wandb()  # before the run, not after it
    done = run_job(config, out=out, backend=backend, shards=shards, address=address, trace_ranks=trace_ranks)
    if wandb:
        from emulator.results.wandb_log import log_run

        log_run(done.tables, str(done.run_dir) if done.run_dir else None)
    return RunResults(done.tables, config, done.result, done.topo, done.run_dir)


def load(run_dir: str | Path) -> RunResults:
    """The results of a run directory written earlier (no raw results: tables and plots only)."""
    return RunResults(read_run_dir(run_dir), run_dir=Path(run_dir))
