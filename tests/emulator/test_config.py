"""Strict configuration: key paths, nearest keys, every factor printed, overrides, presets."""

from pathlib import Path

import pytest

from emulator.config.loader import load_cluster, load_run, parse_override
from emulator.errors import ConfigError
from tests.conftest import CONFIGS


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def test_unknown_key_names_path_and_closest(tmp_path):
    """A misspelt key fails with its full path and the nearest valid key."""
    path = _write(tmp_path, "cluster: {from: dgx-a100-hdr, scale_up: {bandwith_GBps: 10}}\nprogram: x.py:f\n")
    with pytest.raises(ConfigError, match=r"unknown key 'cluster\.scale_up\.bandwith_GBps'.*'bandwidth_GBps'"):
        load_run(path)


def test_wrong_type_names_path(tmp_path):
    path = _write(tmp_path, "cluster: {from: dgx-a100-hdr, nodes: two}\nprogram: x.py:f\n")
    with pytest.raises(ConfigError, match=r"cluster\.nodes: expected an integer, got 'two'"):
        load_run(path)


def test_inconsistent_parallel_sizes_print_every_factor(tmp_path):
    """tensor * context * pipeline * data != world size prints all factors."""
    text = "cluster: dgx-a100-hdr\nmodel: megatron-22b\nparallel: {tensor: 8, pipeline: 2, data: 3}\n"
    with pytest.raises(ConfigError, match=r"tensor\(8\) \* context\(1\) \* pipeline\(2\) \* data\(3\) = 48 "
                       r"!= world size 32"):
        load_run(_write(tmp_path, text))
    text = ("cluster: {from: dgx-h100-ndr, nodes: 32}\nmodel: llama3-70b\n"
            "parallel: {tensor: 8, context: 2, pipeline: 4, data: 3}\n")
    with pytest.raises(ConfigError, match=r"^parallel: tensor\(8\) \* context\(2\) \* pipeline\(4\) \* data\(3\) = 192 "
                       r"!= world size 256$"):
        load_run(_write(tmp_path, text))


def test_set_overrides_resize_a_preset():
    """--set cluster.nodes=2 resizes a homogeneous preset."""
    config = load_run(CONFIGS / "examples" / "data-parallel.yaml", ["cluster.nodes=2", "program_args.iterations=1"])
    assert config.cluster.world_size == 16
    assert config.program_args["iterations"] == 1


def test_override_of_unknown_key_fails_with_path():
    with pytest.raises(ConfigError, match=r"unknown key 'training\.micro_batch'.*micro_batch_size"):
        load_run(CONFIGS / "runs" / "megatron-22b-8gpu.yaml", ["training.micro_batch=2"])


def test_interleaving_without_a_pipeline_is_a_config_error():
    """Found by fuzzing: virtual stages on pipeline 1 used to pass the config, and the run then
    failed with a program error (a rank sending its activations to itself)."""
    with pytest.raises(ConfigError, match=r"parallel\.virtual_stages \(2\).*parallel\.pipeline > 1"):
        load_run(CONFIGS / "runs" / "megatron-22b-8gpu.yaml",
                 ["parallel.virtual_stages=2", "training.global_batch_size=8", "training.micro_batch_size=1"])


def test_parse_override_values_are_yaml():
    assert parse_override("a.b=3") == (["a", "b"], 3)
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a=[1, 2]") == (["a"], [1, 2])
    with pytest.raises(ConfigError):
        parse_override("novalue")


def test_unknown_preset_lists_presets(tmp_path):
    with pytest.raises(ConfigError, match="presets: .*dgx-a100-hdr"):
        load_run(_write(tmp_path, "cluster: dgx-z100\nprogram: x.py:f\n"))


def test_heterogeneous_cluster_groups():
    cluster = load_cluster("hetero-a100-h100")
    assert [g.gpu for g in cluster.groups()] == ["a100-sxm-80gb", "h100-sxm-80gb"]
    assert cluster.world_size == 32


def test_both_homogeneous_and_groups_is_an_error(tmp_path):
    text = "cluster: {nodes: 2, node_groups: [{name: a}], tiers: [{name: x, latency_us: 1}]}\nprogram: x.py:f\n"
    with pytest.raises(ConfigError, match="either node_groups or nodes"):
        load_run(_write(tmp_path, text))


SHIPPED_RUNS = sorted((CONFIGS / "runs").glob("*.yaml")) + sorted((CONFIGS / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED_RUNS, ids=lambda p: p.name)
def test_every_shipped_run_validates(path):
    """Every shipped run file loads and validates."""
    config = load_run(path)
    assert config.cluster.world_size >= 1


@pytest.mark.parametrize("path", sorted((CONFIGS / "clusters").glob("*.yaml")), ids=lambda p: p.name)
def test_every_cluster_preset_validates(path):
    assert load_cluster(str(path)).world_size >= 8


def test_zero_nodes_is_rejected():
    with pytest.raises(ConfigError, match=r"cluster\.nodes must be >= 1, got 0"):
        load_run(CONFIGS / "examples" / "data-parallel.yaml", ["cluster.nodes=0"])
