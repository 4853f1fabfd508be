"""Writing and reading a run directory.

    emulator run configs/examples/ping-pong.yaml --out runs/pp    # writes every file below
    python -c "from emulator.results.rundir import read_run_dir; print(read_run_dir('runs/pp').summary)"

Files: ``config.yaml`` (the resolved config: rerunning it reproduces the run), ``summary.json``,
``links.csv``, ``ranks.csv``, ``histograms.csv``, ``timeline.csv`` and ``trace.json``; their columns
are documented in docs/outputs.md. A run with ``jobs`` adds ``jobs/<name>/`` per job, written by
the run sequence (emulator/runner/jobs.py) with the writers here.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path

import yaml

from emulator.engine.result import RunResult
from emulator.errors import ConfigError
from emulator.results import tables
from emulator.results.trace import write_trace

CSV_TABLES = {
    "links": tables.LINK_COLUMNS,
    "ranks": tables.RANK_COLUMNS,
    "histograms": tables.HISTOGRAM_COLUMNS,
    "timeline": tables.TIMELINE_COLUMNS,
}


class _Rows:
    """A table field given as rows (dicts) or as :class:`emulator.results.tables.TimelineColumns`
    or :class:`emulator.results.tables.TableColumns`, read as rows: the reference run's 217,000
    timeline dicts and 16,000 link dicts are built only when something reads them (the run
    directory is written from the columns; ``emulator run`` reads no rows)."""

    def __set_name__(self, owner, name: str) -> None:
        self.slot = f"_{name}"

    def __get__(self, obj, owner=None):
        if obj is None:
            return ()  # the dataclass default (immutable): no rows
        rows = obj.__dict__[self.slot]
        if not isinstance(rows, list):
            columns = isinstance(rows, (tables.TimelineColumns, tables.TableColumns))
            rows = obj.__dict__[self.slot] = rows.rows() if columns else list(rows)
        return rows

    def __set__(self, obj, rows) -> None:
        obj.__dict__[self.slot] = rows


@dataclass
class RunTables:
    """A run's summary, resolved config and tables (lists of flat dicts, one per CSV row)."""

    summary: dict
    config: dict
    links: list[dict] = _Rows()
    ranks: list[dict] = field(default_factory=list)
    histograms: list[dict] = field(default_factory=list)
    timeline: list[dict] = _Rows()


def write_config(out_dir: Path, config) -> Path:
    """Write the resolved config (before the run starts, so that it survives a failed run)."""
    from emulator.config.typed import to_dict

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "config.yaml"
    path.write_text(yaml.safe_dump(to_dict(config), sort_keys=False))
    return path


def write_run_dir(out_dir: Path, config, summary: dict) -> Path:
    """Write the resolved config and ``summary.json``; returns the directory."""
    write_config(out_dir, config)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return out_dir


def build_tables(config, summary: dict, result: RunResult, topo, timeline: tables.TimelineColumns | None = None,
                 ends: dict | None = None, links: tables.TableColumns | None = None) -> RunTables:  # fmt: skip
    """Derive every table of a finished run (``timeline``, ``links``: their columns, ``ends``: the
    links' endpoints, when already derived)."""
    from emulator.config.typed import to_dict

    ends = tables.link_endpoints(topo) if ends is None else ends
    if timeline is None:
        timeline = tables.timeline_columns(result, topo, ends)
    return RunTables(
        summary=summary,
        config=to_dict(config),
        links=tables.link_columns(result, topo, ends) if links is None else links,  # its rows built when read
        ranks=tables.rank_rows(result, topo, config),
        histograms=tables.histogram_rows(result, topo),
        timeline=timeline,  # its rows built when read
    )


def write_results(out_dir: str | Path, config, summary: dict, result: RunResult, topo) -> tuple[Path, RunTables]:
    """Write the whole run directory; returns it and the tables written."""
    out = write_run_dir(Path(out_dir), config, summary)
    ends = tables.link_endpoints(topo)
    timeline = tables.timeline_columns(result, topo, ends)
    links = tables.link_columns(result, topo, ends)
    data = build_tables(config, summary, result, topo, timeline, ends, links)
    for name, columns in CSV_TABLES.items():
        if name == "links" and links.plain():  # written from the columns: no row dicts
            write_lines(out / "links.csv", links.columns, columns)
            continue
        if name == "timeline" and tables.csv_plain(topo.tier_names):
            # timeline.csv, the long one: its values are ints, floats and the tier names, which the
            # csv module writes as str does; formatted from the columns (tables.TimelineColumns)
            lines = timeline.csv_bytes() if all(map(str.isascii, topo.tier_names)) else None
            if lines is not None:  # ASCII: the bytes any ASCII-compatible encoding of the text would have
                with (out / "timeline.csv").open("wb") as f:
                    f.write(",".join(columns).encode() + b"\r\n")
                    f.write(lines)
                del lines  # 13 MB for the reference run: not kept while the trace is written
                continue
            with (out / "timeline.csv").open("w", newline="") as f:
                f.write(",".join(columns) + "\r\n")
                f.write(timeline.csv_lines())
        else:  # ranks.csv, histograms.csv: formatted directly where the csv module would write str's text
            rows = getattr(data, name)
            write_csv(out / f"{name}.csv", rows, columns, plain=tables.rows_plain(rows))
    # compact JSON, streamed: a traced node of 8 GPUs over many iterations is easily 10^6 events
    write_trace(out / "trace.json", result, topo, timeline,
                {"name": summary.get("name", ""), "fingerprint": summary.get("fingerprint", "")})  # fmt: skip
    return out, data


def write_csv(path: Path, rows: list[dict], columns: tuple[str, ...], plain: bool = False) -> None:
    """One line per row, the columns in order (what ``csv.DictWriter`` writes: the same writer,
    given tuples; a row missing a column is a KeyError, as a row with an extra one is for DictWriter).

    ``plain``: the caller vouches that every value is an int, a float or a string that needs no
    quoting (:func:`emulator.results.tables.csv_plain`), which ``str`` writes as the csv module does
    (Python's ``str`` of a float is its ``repr``): the lines are then formatted directly, about
    twice as fast (timeline.csv of the reference run has 250,000 rows)."""
    extra = {key for row in rows[:1] for key in row} - set(columns)
    assert not extra, f"{path.name}: rows have columns not in the table: {sorted(extra)}"
    get = itemgetter(*columns) if len(columns) > 1 else (lambda row: (row[columns[0]],))
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        if plain:
            f.write("".join(map((",".join(["%s"] * len(columns)) + "\r\n").__mod__, map(get, rows))))
        else:
            writer.writerows(map(get, rows))


def write_lines(path: Path, columns: list[list], names: tuple[str, ...]) -> None:
    """:func:`write_csv` with ``plain`` of a table given by columns (:class:`emulator.results.tables.TableColumns`,
    whose :meth:`~emulator.results.tables.TableColumns.plain` the caller checked): the same bytes."""
    assert len(columns) == len(names), (len(columns), names)
    with path.open("w", newline="") as f:
        csv.writer(f).writerow(names)
        f.write("".join(map((",".join(["%s"] * len(names)) + "\r\n").__mod__, zip(*columns, strict=True))))


def _number(text: str):
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def read_csv(path: Path) -> list[dict]:
    """Rows of a CSV written by :func:`write_csv`, numbers parsed back."""
    with path.open(newline="") as f:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(f)]


def read_run_dir(run_dir: str | Path) -> RunTables:
    """Load a run directory; a missing directory or summary is a ConfigError, missing tables are empty."""
    root = Path(run_dir)
    summary_path = root / "summary.json"
    if not summary_path.is_file():
        raise ConfigError(f"{root}: not a run directory (no summary.json)")
    config_path = root / "config.yaml"
    data = RunTables(
        summary=json.loads(summary_path.read_text()),
        config=yaml.safe_load(config_path.read_text()) if config_path.is_file() else {},
    )
    for name in CSV_TABLES:
        path = root / f"{name}.csv"
        if path.is_file():
            setattr(data, name, read_csv(path))
    return data
