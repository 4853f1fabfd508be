"""Run directories shared by the results and reports tests: each example is run once per session (small sizes)."""

from __future__ import annotations

import pytest

from emulator.cli import main
from tests.conftest import CONFIGS

DP = str(CONFIGS / "examples" / "data-parallel.yaml")
GPT175B = str(CONFIGS / "runs" / "megatron-175b-64gpu.yaml")
# tensor, interleaved pipeline and data parallelism (2) together in under a second: 8 microbatches
GPT175B_SMALL = ["cluster.nodes=16", "training.global_batch_size=16"]  # --set values
MEGATRON22B = str(CONFIGS / "runs" / "megatron-22b-8gpu.yaml")  # a validation case as it is
PP = str(CONFIGS / "examples" / "ping-pong.yaml")
# 4 nodes, leaf switches of 2 nodes: traffic on every tier (NVSwitch, leaf, spine); 64 MiB of gradients;
# 100 us time buckets: finer than the all-reduce messages, so the timeline must spread them
DP_SMALL = ["--set", "program_args.iterations=2", "--set", "program_args.grad_bytes=67108864",
            "--set", "cluster.tiers.0.span_nodes=2", "--set", "engine.timeline_bucket_us=100"]  # fmt: skip


def cli_run(out, run_file: str, *args: str) -> None:
    assert main(["run", run_file, "--out", str(out), *args]) == 0


@pytest.fixture(scope="session")
def dp_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "dp"
    cli_run(out, DP, *DP_SMALL)
    return out


@pytest.fixture(scope="session")
def pp_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "pp"
    cli_run(out, PP, "--set", "cluster.nodes=4", "--trace-ranks", "0-3,17")
    return out


@pytest.fixture(scope="session")
def gpt_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "gpt"
    cli_run(out, GPT175B, *(arg for value in GPT175B_SMALL for arg in ("--set", value)))
    return out


@pytest.fixture(scope="session")
def validation_case_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "22b"
    cli_run(out, MEGATRON22B)
    return out
