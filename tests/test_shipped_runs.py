"""Every shipped run file gives the fingerprint it gave before: the results of the presets and
examples change only when a change means them to (then update the row here and say why in the
commit). Fingerprints recorded on b6dd35e, the layout before emulator/ was split into packages;
the five ZeRO 1-2 runs since ``parallel.overlap_param_gather`` (on by default, as Megatron-Core's
recipes run) gathers the updated weights beside the next forward (with it off they give their
b6dd35e fingerprints: tests/emulator/workloads/test_recipes.py); and the runs on H100s since the
GH100's sustained fraction is calibrated on H100 runs (emulator/hardware/gpus.py), then refitted
(0.72 -> 0.68) when the Megatron H100 rows took their micro-batching from the recipes; the Llama,
Mixtral and DeepSeek runs also since their models train without dropout (``model.dropout: false``)
and their activations follow their own layers (GQA, SwiGLU), and the context-parallel run since
its tensor-parallel collectives, pipeline messages and logits carry a rank's own s/c tokens; the
ZeRO-3 run (llama3-70b-zero3-64gpu) since ZeRO-3 has FSDP2's root unit (the embedding, output layer
and final norm gathered before the first forward and reduce-scattered after the backward, one each
per microbatch, as issue 23's capture of fully_shard shows) and each unit's reduce-scatter copy-in
(10.654 -> 11.081 s an iteration).

    python -m pytest -q tests/test_shipped_runs.py            # the quick ones
    python -m pytest -q tests/test_shipped_runs.py -m slow    # the 1024- and 3072-GPU runs too

Failing examples (deadlock, mismatch, OOM, a node failure) stop with exit 2 and still write a
summary.json whose fingerprint covers what they reached.
"""

from __future__ import annotations

import json

import pytest

from emulator.cli import main
from tests.conftest import CONFIGS

# run file -> (exit code, fingerprint); one row per file in configs/examples and configs/runs
SHIPPED = {
    "examples/data-parallel.yaml": (0, "e2026588abdbdf73e34d8c0e341a64cc"),
    "examples/deadlock.yaml": (2, "95a7d35433cb0ad7d1f944742268ffb2"),
    "examples/mismatch.yaml": (2, "2b8dc552de4146786d5e33ddd859fdec"),
    "examples/node-failure.yaml": (2, "c150b89f27d5bb42ccc24b5946018ab3"),
    "examples/oom.yaml": (2, "b95966e5ae2bf6e31cce5bccf99ca328"),
    "examples/ping-pong.yaml": (0, "c43206c990114e789c6956d44810c0f4"),
    "runs/bloom-560m-straggler.yaml": (0, "7bede3fe563c7ef0ef548286a4612e61"),
    "runs/bloom-560m-zero2.yaml": (0, "d8ec67bd9e2cdde4822fbba3770a0644"),
    "runs/deepseek-v3-like-256gpu.yaml": (0, "133b941276e3afe564effc7cfe0f9984"),
    "runs/gpt3-175b-1024gpu.yaml": (0, "fcca0e49fabb57b33390edc058cfdab9"),
    "runs/gpt3-175b-nvidia-128gpu.yaml": (0, "64af77e29aeba2940a27807bd47bd9ec"),
    "runs/hetero-uneven-pipeline-planned.yaml": (0, "d89ef51cca79b6d3a940466dd7407473"),
    "runs/hetero-uneven-pipeline.yaml": (0, "5791cd6ae677eb7b54a170667a7cd14c"),
    "runs/llama3-70b-zero3-64gpu.yaml": (0, "ed0b541263121415b1c5f45d920d9a37"),
    "runs/llama31-70b-cp-64gpu.yaml": (0, "115dc628fb44a328008cb2f3df790e9d"),
    "runs/llama3-8b-64gpu.yaml": (0, "a807035d7433a42627978dba23071a84"),
    "runs/mixtral-8x7b-ep8-64gpu.yaml": (0, "65cb730c1407af7a076f94f193570625"),
    "runs/megatron-175b-64gpu.yaml": (0, "f22ed71d66a1d7b1c9f75f8c25fe4477"),
    "runs/megatron-1t-3072gpu.yaml": (0, "f671615fdce7f3a0329c5aef0a0d1598"),
    "runs/megatron-22b-8gpu.yaml": (0, "96d492118d276a3bc05bc81fc69c6d93"),
    "runs/two-jobs-shared-nics.yaml": (0, "61bef5bca65d770acfe143cc72fd67e3"),
}
SLOW = {"runs/gpt3-175b-1024gpu.yaml", "runs/megatron-1t-3072gpu.yaml",  # 37 s and 150 s here
        "runs/gpt3-175b-nvidia-128gpu.yaml", "runs/deepseek-v3-like-256gpu.yaml"}  # 20 s, 10 s


def test_every_shipped_run_file_is_listed():
    """A new run file gets its row (and so its fingerprint is kept from then on)."""
    shipped = sorted(str(p.relative_to(CONFIGS)) for d in ("examples", "runs") for p in (CONFIGS / d).glob("*.yaml"))
    assert shipped == sorted(SHIPPED)


@pytest.mark.parametrize("run_file", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW else f for f in SHIPPED])
def test_shipped_run_keeps_its_fingerprint(run_file, tmp_path, capsys):
    code, fingerprint = SHIPPED[run_file]
    out = tmp_path / "run"
    assert main(["run", str(CONFIGS / run_file), "--quiet", "--trace-ranks", "none", "--out", str(out)]) == code
    capsys.readouterr()
    assert json.loads((out / "summary.json").read_text())["fingerprint"] == fingerprint
