"""``emulator goodput``: closed form, Monte Carlo, the interval search against Young and Daly, the CLI."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest

from emulator.api import load_config
from emulator.errors import ConfigError
from emulator.runner.sequence import run_job
from emulator.studies.goodput import (
    add_goodput_parser,
    analyse,
    best_checkpoint_every,
    closed_form,
    cmd_goodput,
    daly_interval_s,
    make_scenario,
    monte_carlo,
    optimal_work_s,
    simulate,
    young_interval_s,
)

ROOT = Path(__file__).resolve().parents[3]
RUN_22B = ROOT / "configs" / "runs" / "megatron-22b-8gpu.yaml"
LN2 = math.log(2.0)


def scenario(iteration_s=1.0, nodes=1, mtbf_hours=10.0, every=2000, checkpoint_s=60.0, restart_s=300.0, days=30.0):
    return make_scenario(iteration_s, nodes, mtbf_hours, every, checkpoint_s, restart_s, days)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="emulator")
    add_goodput_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["goodput", *argv])


# -- closed form ------------------------------------------------------------------------------------


def test_closed_form_without_failures_is_work_over_work_and_checkpoint():
    """A node that fails once in 1000 years: goodput is W / (W + C), nothing lost to failures."""
    cf = closed_form(scenario(every=9, checkpoint_s=1.0, mtbf_hours=1e7, days=1))
    assert cf["goodput"] == pytest.approx(0.9, rel=1e-6)
    assert cf["checkpoint"] == pytest.approx(0.1, rel=1e-5)
    assert cf["rework"] < 1e-6 and cf["restart"] < 1e-6


def test_closed_form_where_the_exponentials_are_two():
    """M = 1000 s and W + C = R = M ln 2, so e^(X/M) = e^(R/M) = 2: E = M * 2 * 1 = 2000 s per segment."""
    c = 1000 * LN2 - 600
    s = scenario(every=600, checkpoint_s=c, restart_s=1000 * LN2, mtbf_hours=1000 / 3600, days=1)
    cf = closed_form(s)
    assert cf["goodput"] == pytest.approx(600 / 2000, rel=1e-12)
    assert cf["restart"] == pytest.approx(0.5, rel=1e-12)  # (e^(R/M) - 1) / e^(R/M)
    assert cf["checkpoint"] == pytest.approx(1000 * math.expm1(c / 1000) / 2000, rel=1e-12)
    assert cf["failures"] == pytest.approx(86.4)  # a day over M
    assert sum(cf[k] for k in ("goodput", "checkpoint", "rework", "restart")) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("every,checkpoint_s,restart_s,mtbf_hours", [
    (1, 1.0, 0.0, 0.5), (50, 600.0, 3600.0, 2.0), (10**6, 5.0, 30.0, 100.0), (3, 1e5, 1e5, 1.0)])  # fmt: skip
def test_closed_form_fractions_add_up_and_never_overflow(every, checkpoint_s, restart_s, mtbf_hours):
    """The causes and goodput share the wall time, also for segments many MTBFs long (goodput ~ 0)."""
    cf = closed_form(scenario(every=every, checkpoint_s=checkpoint_s, restart_s=restart_s, mtbf_hours=mtbf_hours))
    assert all(0.0 <= cf[k] <= 1.0 for k in ("goodput", "checkpoint", "rework", "restart"))
    assert sum(cf[k] for k in ("goodput", "checkpoint", "rework", "restart")) == pytest.approx(1.0, abs=1e-9)


# -- Monte Carlo ------------------------------------------------------------------------------------


def test_monte_carlo_books_a_failure_mid_checkpoint_and_during_a_restart():
    """Hand-placed failures: W = 100 s, C = 10 s, R = 50 s over one day.

    Failure at 1095 s: 9 segments saved (990 s), then 100 s of work and 5 s of a checkpoint lost.
    Failure at 1115 s, 20 s into the restart: 20 s of restart, then a full 50 s restart; the job runs
    from 1165 s to the horizon: 85235 s, 774 segments (85140 s), then 95 s of work unsaved.
    """
    s = scenario(every=100, checkpoint_s=10.0, restart_s=50.0, days=1)
    times = np.array([[1095.0, 1115.0]])
    got = {k: float(v[0]) for k, v in monte_carlo(s, times, np.array([2])).items()}
    assert got == {"useful": (9 + 774) * 100.0, "checkpoint": (9 + 774) * 10.0 + 5.0, "rework": 100.0,
                   "restart": 70.0, "in_progress": 95.0, "failures": 2.0}  # fmt: skip
    assert sum(got[k] for k in ("useful", "checkpoint", "rework", "restart", "in_progress")) == 86400.0


def test_monte_carlo_agrees_with_the_closed_form_within_its_standard_error():
    """Ten years, job MTBF 10 h (~8760 failures a trial): mean within 4 standard errors of the steady state.

    The Monte Carlo starts without a restart and leaves the last interval unsaved; both edges are far
    below the standard error here, which is why the test may compare with the steady state at all.
    """
    s = scenario(days=3650)
    mc, cf = simulate(s, trials=200, seed=7), closed_form(s)
    edge = (s.work_s + s.checkpoint_s + s.restart_s) / s.horizon_s
    assert edge < 0.5 * mc["goodput"]["se"]
    for key in ("goodput", "checkpoint", "rework", "restart"):
        assert abs(mc[key]["mean"] - cf[key]) <= 4 * mc[key]["se"] + edge, key
    assert abs(mc["failures"]["mean"] - cf["failures"]) <= 4 * mc["failures"]["se"]


def test_monte_carlo_is_deterministic_for_a_seed():
    s = scenario(days=60)
    assert simulate(s, 50, seed=3) == simulate(s, 50, seed=3)
    assert simulate(s, 50, seed=3)["goodput"] != simulate(s, 50, seed=4)["goodput"]
    assert analyse(s, 20, 1) == analyse(s, 20, 1)


# -- the optimum against Young and Daly -------------------------------------------------------------


def test_search_reproduces_young_and_daly_where_their_assumptions_hold():
    """C = 60 s, M = 10 h, R = 5 min, one-second iterations: C, R << M and failures exponential."""
    s = scenario(mtbf_hours=10.0, checkpoint_s=60.0, restart_s=300.0, iteration_s=1.0)
    best_s = best_checkpoint_every(s) * s.iteration_s
    m = s.job_mtbf_s
    assert best_s == pytest.approx(daly_interval_s(m, 60.0), rel=0.10)
    assert best_s == pytest.approx(young_interval_s(m, 60.0), rel=0.10)
    # Daly's series is the same model to higher order: far closer than the 10% asked
    assert best_s == pytest.approx(daly_interval_s(m, 60.0), rel=1e-3)


def test_monte_carlo_confirms_the_optimum_on_shared_failures():
    """Ten years at M = 10 h: the search's interval beats half and double of it in the Monte Carlo too."""
    result = analyse(scenario(days=3650), trials=50, seed=11)
    mc = {c["name"]: c["monte_carlo"]["mean"] for c in result["candidates"]}
    assert mc["optimum"] > mc["optimum / 2"] and mc["optimum"] > mc["optimum x 2"]


def test_young_overshoots_when_the_checkpoint_is_not_small_against_the_mtbf():
    """C = M / 2: Young's sqrt(2CM) = M is 43% above the optimum (0.698 M); Daly's 0.694 M is within 1%."""
    m, c = 36000.0, 18000.0
    exact = optimal_work_s(m, c)
    assert exact / m == pytest.approx(0.6983, abs=1e-3)
    assert young_interval_s(m, c) / exact - 1 > 0.4
    assert daly_interval_s(m, c) == pytest.approx(exact, rel=0.01)
    assert daly_interval_s(m, 3 * m) == m  # C >= 2M: Daly's answer is M


def test_restart_cost_scales_goodput_but_does_not_move_the_optimum():
    short, long = scenario(restart_s=0.0), scenario(restart_s=36000.0)
    assert best_checkpoint_every(short) == best_checkpoint_every(long)
    assert closed_form(long)["goodput"] == pytest.approx(closed_form(short)["goodput"] * math.exp(-1), rel=1e-9)


@pytest.mark.parametrize("iteration_s", [1.0, 97.0, 700.0, 5000.0])
def test_search_is_the_best_whole_number_of_iterations(iteration_s):
    """Against brute force over N: with iterations of 700 s the optimum (~2040 s) is quantised to 3."""
    s = scenario(iteration_s=iteration_s)
    brute = max(range(1, 3000), key=lambda n: closed_form(s.with_every(n))["goodput"])
    assert best_checkpoint_every(s) == brute


# -- validation and the command line ---------------------------------------------------------------

BASE = ["--days", "30", "--mtbf-hours", "1000", "--checkpoint-every", "100", "--checkpoint-s", "60",
        "--restart-s", "300", "--iteration-s", "10"]  # fmt: skip


def with_flag(flag: str, value: str) -> list[str]:
    argv = list(BASE)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv


@pytest.mark.parametrize("flag,value", [
    ("--days", "0"), ("--days", "-1"), ("--days", "nan"), ("--days", "inf"), ("--days", "4000"),
    ("--mtbf-hours", "0"), ("--mtbf-hours", "1e9"), ("--checkpoint-every", "0"), ("--checkpoint-s", "0"),
    ("--checkpoint-s", "-5"), ("--restart-s", "-1"), ("--restart-s", "1e7"), ("--iteration-s", "0"),
    ("--iteration-s", "nan"), ("--trials", "0"), ("--trials", "100000"), ("--seed", "-1")])  # fmt: skip
def test_invalid_flags_are_one_line_errors_naming_the_flag(flag, value):
    with pytest.raises(ConfigError) as err:
        cmd_goodput(parse(str(RUN_22B), *with_flag(flag, value)))
    assert flag in str(err.value) and "\n" not in str(err.value)


def test_too_many_failures_are_refused():
    """A job MTBF of 3.6 s over 30 days: 720,000 failures a trial, past the modelled bound."""
    with pytest.raises(ConfigError, match="--mtbf-hours"):
        cmd_goodput(parse(str(RUN_22B), *with_flag("--mtbf-hours", "0.001")))


def test_cli_with_a_given_iteration_time(capsys):
    """No emulation: the run file gives the node count (1), --iteration-s the iteration."""
    assert cmd_goodput(parse(str(RUN_22B), *BASE, "--trials", "20")) == 0
    text = capsys.readouterr().out
    assert text.startswith("megatron-22b-8gpu: 1 nodes, iteration 10.0000 s (given), 30 days")
    for label in ("goodput", "checkpoint writing", "rework after failures", "restarts", "Young", "Daly", "optimum"):
        assert label in text
    assert cmd_goodput(parse(str(RUN_22B), *BASE, "--trials", "20", "--json")) == 0
    result = json.loads(capsys.readouterr().out)
    best = next(c for c in result["candidates"] if c["name"] == "optimum")
    # M = 1000 h, C = 60 s: sqrt(2CM) ~ 20.8 ks; Daly's order-(C/M) terms move it by < 1%
    assert best["checkpoint_every"] * 10 == pytest.approx(daly_interval_s(3.6e6, 60.0), rel=0.01)
    assert result["scenario"]["nodes"] == 1 and result["monte_carlo"]["failures"]["mean"] >= 0


@pytest.fixture(scope="module")
def run_dir_22b(tmp_path_factory):
    out = tmp_path_factory.mktemp("run22b")
    done = run_job(load_config(RUN_22B), out=out, trace_ranks="none")
    return out, done.summary["iteration_time_s"]


def test_cli_emulates_the_run_file_once(capsys, run_dir_22b):
    """Without --iteration-s the run file is emulated: the same iteration time as ``emulator run``."""
    _, iteration_s = run_dir_22b
    argv = [a for a in BASE if a not in ("--iteration-s", "10")]
    assert cmd_goodput(parse(str(RUN_22B), *argv, "--trials", "10", "--json")) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["iteration_source"] == "emulated"
    assert result["scenario"]["iteration_s"] == iteration_s > 0


def test_cli_reads_a_run_directory(capsys, run_dir_22b):
    out, iteration_s = run_dir_22b
    argv = [a for a in BASE if a not in ("--iteration-s", "10")]
    assert cmd_goodput(parse(str(out), *argv, "--trials", "10", "--json")) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["scenario"]["iteration_s"] == iteration_s
    assert result["iteration_source"].endswith("summary.json")
