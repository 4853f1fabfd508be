"""The notebook API: ``emulator.run`` equals ``emulator run``, tables with or without pandas, plots."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import emulator
from emulator.cli import main
from emulator.errors import ConfigError
from tests.conftest import ROOT
from tests.emulator.conftest import PP

SMALL = {"cluster.nodes": 4, "program_args.iterations": 2}


def test_api_run_equals_cli_run(tmp_path):
    """Same config and overrides: the API and the command line give the same fingerprint and files."""
    assert main(["run", PP, "--set", "cluster.nodes=4", "--set", "program_args.iterations=2",
                 "--out", str(tmp_path / "cli")]) == 0  # fmt: skip
    r = emulator.run(PP, overrides=SMALL, out=tmp_path / "api")
    cli = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert r.fingerprint == cli["fingerprint"] == r.summary["fingerprint"]
    for name in ("links.csv", "ranks.csv", "histograms.csv", "config.yaml"):
        assert (tmp_path / "api" / name).read_text() == (tmp_path / "cli" / name).read_text(), name


def test_overrides_as_dict_or_set_strings_agree():
    """A dict of key paths and a list of --set strings are the same overrides."""
    a = emulator.run(PP, overrides=SMALL, trace_ranks="none")
    b = emulator.run(PP, overrides=["cluster.nodes=4", "program_args.iterations=2"], trace_ranks="none")
    assert a.fingerprint == b.fingerprint and a.summary["world_size"] == 32
    with pytest.raises(ConfigError, match="cluster.gpus_per_node: expected an integer"):
        emulator.run(PP, overrides={"cluster.gpus_per_node": "eight"})


def test_tables_without_pandas(monkeypatch):
    """Without pandas the tables are lists of dicts with the CSV columns."""
    monkeypatch.setitem(sys.modules, "pandas", None)  # makes `import pandas` fail
    r = emulator.run(PP, overrides=SMALL)
    assert isinstance(r.links, list) and isinstance(r.ranks, list)
    assert len(r.ranks) == 32 and r.ranks[0]["rank"] == 0 and "exposed_comm_ns" in r.ranks[0]
    assert sum(row["bytes"] for row in r.links if row["direction"] == "tx") == sum(r.summary["bytes_by_tier"].values())


def test_tables_with_pandas():
    """With pandas the tables are DataFrames."""
    pandas = pytest.importorskip("pandas")
    r = emulator.run(PP, overrides=SMALL)
    assert isinstance(r.links, pandas.DataFrame) and list(r.ranks["rank"]) == list(range(32))
    assert r.links["bytes"].sum() == 2 * sum(r.summary["bytes_by_tier"].values())  # one tier: tx and rx


def test_plot_helpers_return_figures():
    """Each plotting helper returns a matplotlib Figure with axes."""
    from matplotlib.figure import Figure

    r = emulator.run(PP, overrides=SMALL)
    for fig in (r.plot_message_sizes(), r.plot_link_utilisation(), r.plot_breakdown(), r.plot_busiest_links()):
        assert isinstance(fig, Figure) and fig.axes


def test_load_a_run_directory(pp_dir):
    """emulator.load reads a run directory back: same summary, tables, fingerprint."""
    r = emulator.load(pp_dir)
    assert r.fingerprint == json.loads((pp_dir / "summary.json").read_text())["fingerprint"]
    assert len(r.tables.ranks) == 32
    with pytest.raises(ConfigError):
        r.write(pp_dir / "again")


def test_import_emulator_is_cheap_and_run_stays_callable():
    """`import emulator` imports neither matplotlib nor pandas; emulator.run stays the notebook
    function after the run sequence (emulator.runner.sequence) is imported."""
    code = ("import sys, emulator; assert 'matplotlib' not in sys.modules and 'pandas' not in sys.modules; "
            "from emulator.runner.sequence import execute; from emulator.api import run, load; "
            "assert emulator.run is run and emulator.load is load; print('ok')")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"


def test_wandb_flag_without_wandb_is_one_line_error(monkeypatch, capsys, tmp_path):
    """--wandb without wandb installed: exit 2 before running, with the install command."""
    monkeypatch.setitem(sys.modules, "wandb", None)
    assert main(["run", PP, "--wandb", "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == "error: --wandb: wandb is not installed (pip install wandb)"
    assert not (tmp_path / "x").exists()


def test_wandb_that_cannot_start_is_one_line_error(monkeypatch, capsys, tmp_path):
    """wandb installed but unable to start (no API key, no network): exit 2 after the run, one
    line naming wandb's reason, where the run is saved and the offline way out."""
    import types

    class UsageError(Exception):
        pass

    def init(**_):
        raise UsageError("No API key configured. Use `wandb login` to log in.\nmore detail")

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    out = tmp_path / "x"
    assert main(["run", PP, "--set", "cluster.nodes=2", "--wandb", "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip() == (
        "error: --wandb: wandb could not start a run: No API key configured. Use `wandb login` to log in. "
        f"(the run is saved in {out}; WANDB_MODE=offline logs without an account)"
    )
    assert (out / "summary.json").is_file()


def test_wandb_logging_offline(monkeypatch, tmp_path, capsys):
    """With wandb installed, --wandb logs the run (offline mode: files under WANDB_DIR)."""
    pytest.importorskip("wandb")
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(key, value)
    assert main(["run", PP, "--set", "cluster.nodes=2", "--wandb", "--out", str(tmp_path / "x")]) == 0
    assert "wandb: logged (offline)" in capsys.readouterr().out
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
