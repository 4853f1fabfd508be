"""benchmarks/event_kinds.py (the per-event-kind profile the issue figures are measured with): its
wrappers must see every event the engine runs, whatever the loop calls inline, and change nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import CONFIGS, ROOT

SCRIPT = ROOT / "benchmarks" / "event_kinds.py"
RUN = CONFIGS / "runs" / "megatron-175b-64gpu.yaml"  # pipeline 8, tensor 8: blocks, tapes, messages


@pytest.mark.parametrize("engine", ["compiled", "python"])
def test_every_event_is_counted_and_the_run_unchanged(engine, tmp_path):
    out = tmp_path / "kinds.json"
    sets = ["--set", "training.global_batch_size=16", "--set", f"engine.op_engine={engine}"]
    subprocess.run([sys.executable, str(SCRIPT), str(RUN), *sets, "--plain", "--json", str(out)],
                   check=True, cwd=ROOT, capture_output=True, timeout=600)  # fmt: skip
    figures = json.loads(out.read_text())
    rows = {r["kind"]: r for r in figures["rows"]}
    assert sum(r["events"] for r in rows.values()) == figures["summary"]["events"]
    assert figures["summary"]["fingerprint"] == figures["plain"]["fingerprint"]
    assert 0 < sum(r["s"] for r in rows.values()) <= figures["loop_s"] * 1.000001
    if engine == "compiled":
        assert rows["layer blocks (compiled op engine)"]["events"] > 0
