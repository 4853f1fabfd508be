"""Fuzzing the run files: every mutation of a shipped run file ends in success or one error line.

Seeded random mutations of configs/runs and configs/examples (values replaced by huge, negative,
zero, fractional, infinite, NaN, string, list, null or mapping values; keys deleted or added; deep
nesting; alias bombs) go through ``emulator check`` in-process (fast, many cases) and through
``emulator run`` in a subprocess under a wall-time and an address-space limit (fewer cases, on
configs shrunk to one node first). Each case must exit 0, or exit 2 with exactly one stderr line
``error: ...``: never a traceback, a hang or an out-of-memory kill. More cases run with ``-m slow``.
"""

from __future__ import annotations

import contextlib
import io
import math
import random
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from emulator.cli import main
from emulator.config.loader import load_run_dict
from tests.conftest import CONFIGS, ROOT

RUN_FILES = sorted((CONFIGS / "runs").glob("*.yaml")) + sorted((CONFIGS / "examples").glob("*.yaml"))
# small enough to run in a couple of seconds once shrunk (see _shrunk)
SMALL_RUN_FILES = [CONFIGS / "runs" / "megatron-22b-8gpu.yaml", CONFIGS / "runs" / "bloom-560m-zero2.yaml"] + sorted(
    (CONFIGS / "examples").glob("*.yaml")
)
CHECK_TIME_LIMIT_S = 10
RUN_TIME_LIMIT_S = 20
RUN_MEMORY_LIMIT_BYTES = 3 << 30

# replacement values; for run cases only values that a valid config cannot hold in quantity
# (a huge but allowed value such as iterations: 1000000 is a legitimately long run, not a bug)
CHECK_VALUES = [10**30, 2**63, 2**63 - 1, 10**6, -1, 0, 0.5, -0.0, 1e308, 1e-308, math.inf, -math.inf, math.nan,
                "x", "1e30", "", [1, 2], [], None, {"a": 1}, True, "dgx-a100-hdr", "../../../etc/passwd"]  # fmt: skip
RUN_VALUES = [10**30, 2**63, -1, 0, 1e308, math.inf, math.nan, "x", "1e30", [1, 2], None, {"a": 1}, True]


def _leaves(node, path=()):
    """Every (path, value) of nested data, mappings and lists included as values themselves."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))


def _set(data, path, value=..., delete=False):
    node = data
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value


def _mutate(rng: random.Random, data: dict, values: list) -> tuple[dict | str, str]:
    """One random mutation of ``data``: the new data (or raw YAML text) and what was done."""
    paths = [p for p, _ in _leaves(data) if p]
    path = rng.choice(paths)
    kind = rng.choice(["value"] * 6 + ["delete", "add", "nest", "bomb", "wrong-root"])
    where = ".".join(map(str, path))
    if kind == "value":
        value = rng.choice(values)
        _set(data, path, value)
        return data, f"{where} = {value!r}"
    if kind == "delete":
        _set(data, path, delete=True)
        return data, f"del {where}"
    if kind == "add":
        parent = path[:-1]
        node = data
        for key in parent:
            node = node[key]
        if isinstance(node, dict):
            node["no_such_key_" + "x" * rng.choice([1, 100])] = 1
        else:
            node.append({"unexpected": 1})
        return data, f"add key under {'.'.join(map(str, parent)) or 'root'}"
    if kind == "nest":  # as text: the dumper itself cannot write 5,000 levels
        depth = rng.choice([10, 70, 5000])
        _set(data, path, "NESTED_HERE")
        text = yaml.safe_dump(data, sort_keys=False, width=10**9)
        return text.replace("NESTED_HERE", "[" * depth + "1" + "]" * depth), f"{where} = nested {depth} deep"
    if kind == "bomb":
        text = yaml.safe_dump(data, sort_keys=False)
        bomb = "bomb0: &b0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
        bomb += "".join(f"bomb{i}: &b{i} [{', '.join([f'*b{i - 1}'] * 9)}]\n" for i in range(1, 9))
        return bomb + text + "program_args: {x: *b8}\n", "alias bomb"
    return rng.choice([[data], "just text", 42, None]), "root replaced"


def _write(tmp: Path, case: int, mutated) -> Path:
    path = tmp / f"case{case}.yaml"
    path.write_text(mutated if isinstance(mutated, str) else yaml.safe_dump(mutated, sort_keys=False))
    return path


@contextlib.contextmanager
def _time_limit(seconds: int):
    """Raise TimeoutError in this (main) thread after ``seconds``: a hang fails the case."""

    def expire(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _assert_one_line_outcome(rc: int, stderr: str, what: str) -> None:
    lines = stderr.strip().splitlines()
    if rc == 0:
        return
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("error: "), f"{what}: rc {rc}, stderr {stderr[-2000:]}"


def _check_cases(tmp_path: Path, seed: int, count: int) -> None:
    rng = random.Random(seed)
    for case in range(count):
        source = rng.choice(RUN_FILES)
        data, _ = load_run_dict(source)
        mutated, what = _mutate(rng, data, CHECK_VALUES)
        path = _write(tmp_path, case, mutated)
        err, out = io.StringIO(), io.StringIO()
        with _time_limit(CHECK_TIME_LIMIT_S), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(["check", str(path)])
        _assert_one_line_outcome(rc, err.getvalue(), f"check {source.name} [{what}] (seed {seed}, case {case})")


def _shrunk(source: Path) -> dict:
    """The run file resolved and shrunk to one node and one iteration: valid cases finish fast."""
    data, _ = load_run_dict(source)
    cluster = data["cluster"]
    if isinstance(cluster, dict) and "nodes" in cluster:
        cluster["nodes"] = 1
    if "model" in data:
        data.setdefault("parallel", {})["data"] = None
        data.setdefault("training", {}).update(global_batch_size=None, iterations=1)
    if "program_args" in data:
        data["program_args"].update(iterations=1)
        if "grad_bytes" in data["program_args"]:
            data["program_args"]["grad_bytes"] = 1 << 20
    return data


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (RUN_MEMORY_LIMIT_BYTES, RUN_MEMORY_LIMIT_BYTES))


def _run_cases(tmp_path: Path, seed: int, count: int) -> None:
    rng = random.Random(seed)
    for case in range(count):
        source = rng.choice(SMALL_RUN_FILES)
        mutated, what = _mutate(rng, _shrunk(source), RUN_VALUES)
        path = _write(tmp_path, case, mutated)
        argv = [sys.executable, "-m", "emulator", "run", str(path), "--out", str(tmp_path / f"out{case}"), "--quiet"]
        label = f"run {source.name} [{what}] (seed {seed}, case {case})"
        try:
            proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIME_LIMIT_S,
                                  preexec_fn=_limit_memory)  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.fail(f"{label}: no answer within {RUN_TIME_LIMIT_S} s")
        _assert_one_line_outcome(proc.returncode, proc.stderr, label)


def test_check_survives_mutated_run_files(tmp_path):
    """400 mutations through ``emulator check``: success or one error line, each within 10 s."""
    _check_cases(tmp_path, seed=1, count=400)


def test_run_survives_mutated_run_files(tmp_path):
    """10 mutations through ``emulator run`` in a subprocess (20 s, 3 GiB address space each)."""
    _run_cases(tmp_path, seed=1, count=10)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 12))
def test_check_survives_mutated_run_files_more(tmp_path, seed):
    _check_cases(tmp_path, seed=seed, count=300)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 6))
def test_run_survives_mutated_run_files_more(tmp_path, seed):
    _run_cases(tmp_path, seed=seed, count=10)
