"""Limits instead of hangs, errors instead of wrong answers: bounds, YAML bombs, foreign files,
program checks, the run budget, and the two collective engines at the slowest allowed link."""

import itertools
import json
import re
import time

import pytest

from emulator.cli import main
from emulator.config import limits as lim
from emulator.config.loader import MAX_CONFIG_BYTES, load_run, parse_override
from emulator.errors import ConfigError
from emulator.runner import budget
from emulator.workloads import memory
from emulator.workloads.programs import check_program, load_program
from emulator.workloads.schedules import schedule_for
from tests.conftest import CONFIGS, ROOT

BLOOM = CONFIGS / "runs" / "bloom-560m-zero2.yaml"
PROGRAMS = CONFIGS / "examples" / "programs.py"


def _error(capsys, argv: list[str]) -> str:
    """Run the CLI expecting a user error: exit 2 and exactly one stderr line, returned."""
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("cluster.nodes=100000000", r"cluster\.nodes must be <= 1048576"),
        ("cluster.gpus_per_node=100000", r"cluster\.gpus_per_node must be <= 1024"),
        ("training.global_batch_size=9223372036854775808", r"global_batch_size must be <= 1073741824"),
        ("training.seq_length=10000000000000", r"seq_length must be <= 16777216"),
        ("model.hidden_size=100000000000000", r"hidden_size must be <= 1048576"),
        ("model.num_layers=10000000", r"num_layers must be <= 65536"),
        ("model.vocab_size=10000000000", r"vocab_size must be <= 16777216"),
        ("training.micro_batch_size=10000000", r"micro_batch_size must be <= 65536"),
        ("cluster.nic.count=1000000000000", r"nic\.count must be <= 64"),
        ("parallel.bucket_size_mb=1e300", r"bucket_size_mb must be <= 1048576"),
        ("training.iterations=1e12", r"iterations must be <= 1000000"),
        ("parallel.virtual_stages=100000", r"virtual_stages must be <= 1024"),
        ("engine.max_ops_ahead=1e15", r"max_ops_ahead must be <= 1048576"),
        ("cluster.tiers.0.latency_us=1.0e308", r"tiers\[0\]\.latency_us must be <= 1000000"),
        ("cluster.tiers.0.latency_us=.inf", r"tiers\[0\]\.latency_us: expected a finite number, got inf"),
        ("cluster.scale_up.bandwidth_GBps=.nan", r"scale_up\.bandwidth_GBps: expected a finite number, got nan"),
        ("cluster.nic.bandwidth_Gbps=1.0e-30", r"nic\.bandwidth_Gbps must be >= 0\.1, got 1e-30"),
        ("cluster.nic.efficiency=1e-9", r"nic\.efficiency must be >= 0\.05"),
        ("training.global_batch_size=0", r"global_batch_size must be >= 1, got 0"),
        ("training.global_batch_size=-512", r"global_batch_size must be >= 1, got -512"),
        ("training.global_batch_size=33554432", r"262144 microbatches per iteration.*limit is 65536"),
    ],
)
def test_sizes_beyond_the_limits_are_one_line_errors(capsys, override, message):
    """Every size has an upper bound and floats must be finite; check refuses in one line."""
    assert re.search(message, _error(capsys, ["check", str(BLOOM), "--set", override]))


def test_world_size_limit_names_the_world_size():
    with pytest.raises(ConfigError, match=r"world size 2097152 GPUs; the emulator's limit is 1048576"):
        load_run(BLOOM, ["cluster.nodes=2048", "cluster.gpus_per_node=1024", "parallel.data=null"])


def test_number_strings_parse_as_numbers_for_numeric_fields():
    """YAML 1.1 reads 1e30 as a string; numeric fields take it as the number it spells."""
    config = load_run(BLOOM, ["cluster.nic.bandwidth_Gbps=4e2", "training.iterations=1e0"])
    assert config.cluster.nic.bandwidth_Gbps == 400.0 and config.training.iterations == 1
    with pytest.raises(ConfigError, match=r"training\.iterations: expected an integer, got '1\.5e0'"):
        load_run(BLOOM, ["training.iterations=1.5e0"])
    with pytest.raises(ConfigError, match="expected a number, got 'fast'"):
        load_run(BLOOM, ["cluster.nic.bandwidth_Gbps=fast"])


def test_derived_data_that_does_not_divide_names_the_product():
    with pytest.raises(ConfigError, match=r"world size 32 is not divisible by tensor\(8\) \* context\(1\) \* "
                                          r"pipeline\(3\) = 24"):
        load_run(BLOOM, ["parallel.tensor=8", "parallel.pipeline=3", "parallel.data=null"])


def test_empty_and_non_mapping_run_files(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(ConfigError, match=f"^{empty} is empty$"):
        load_run(empty)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping.*got a list"):
        load_run(listing)


def test_alias_bomb_is_refused(tmp_path):
    """A "billion laughs" document: a few hundred bytes, ~10^9 values once expanded."""
    lines = ["name: bomb", "cluster: dgx-a100-hdr", "program: programs.py:ping_pong", "x0: &x0 [lol, lol]"]
    lines += [f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9)}]" for i in range(1, 10)]
    lines.append("program_args: {bomb: *x9}")
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=r"bomb\.yaml: more than 1000000 values once aliases are expanded"):
        load_run(path)
    with pytest.raises(ConfigError, match="alias bomb"):
        parse_override("program_args.x=[" + ", ".join(["&a [1, 2, 3, 4, 5, 6, 7, 8, 9]"] + ["*a"] * 110_000) + "]")


def test_recursive_alias_and_deep_nesting_are_refused(tmp_path):
    path = tmp_path / "rec.yaml"
    path.write_text("cluster: dgx-a100-hdr\nprogram_args: &a {x: *a}\n")
    with pytest.raises(ConfigError, match="recursive alias"):
        load_run(path)
    path.write_text("cluster: dgx-a100-hdr\nprogram_args: {x: " + "[" * 100 + "]" * 100 + "}\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_run(path)
    path.write_text("cluster: dgx-a100-hdr\nprogram_args: {x: " + "[" * 100_000 + "]" * 100_000 + "}\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_run(path)


def test_oversized_file_is_refused_without_parsing(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("cluster: dgx-a100-hdr\n" + "# padding\n" * (MAX_CONFIG_BYTES // 10 + 1))
    with pytest.raises(ConfigError, match=r"big\.yaml: larger than 1 MiB; not a config file"):
        load_run(path)


def test_foreign_file_as_reference_is_not_echoed(tmp_path):
    """A reference to a file that is not a cluster file says so, never printing its content."""
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$verysecrethash:20228:0:99999:7:::\ndaemon:*:20228:0:99999:7:::\n")
    run = tmp_path / "run.yaml"
    run.write_text(f"cluster: {secret}\nprogram: x.py:f\n")
    with pytest.raises(ConfigError) as info:
        load_run(run)
    assert str(info.value) == f"cluster: {secret} is not a cluster file (none of its keys is a cluster key)"
    secret.write_text("just a line of text\n")
    with pytest.raises(ConfigError, match=r"is not a cluster file \(expected a YAML mapping\)$"):
        load_run(run)


def test_unknown_keys_and_values_are_cut_in_messages():
    long_key = "k" * 500
    with pytest.raises(ConfigError) as info:
        load_run(BLOOM, [f"training.{long_key}=1"])
    # the key is cut (the valid keys of the section follow it, a list that grows with the schema)
    assert long_key not in str(info.value) and "k" * 41 not in str(info.value) and "..." in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_run(BLOOM, ["cluster.nodes=" + "x" * 5000])
    assert len(str(info.value)) < 120


def test_program_that_is_not_python(tmp_path):
    """program: /etc/passwd:x (any file not Python) is a one-line error in check and in run."""
    text_file = tmp_path / "passwd"
    text_file.write_text("root:x:0:0:root:/root:/bin/bash\n")
    for call in (check_program, load_program):
        with pytest.raises(ConfigError, match=r"passwd is not a Python program \(line 1: SyntaxError\)"):
            call(f"{text_file}:x")
        with pytest.raises(ConfigError, match=r"has no function 'nope'; it defines data_parallel_step, deadlock"):
            call(f"{PROGRAMS}:nope")


def test_check_program_never_executes_the_file(tmp_path, capsys):
    marker = tmp_path / "ran"
    program = tmp_path / "prog.py"
    program.write_text(f"open({str(marker)!r}, 'w').close()\n\ndef step(gpu):\n    pass\n")
    check_program(f"{program}:step")
    assert not marker.exists()
    run = tmp_path / "run.yaml"
    run.write_text(f"cluster: dgx-a100-hdr\nprogram: {program}:missing\n")
    assert "has no function 'missing'" in _error(capsys, ["check", str(run)])
    assert not marker.exists()


def _walked_in_flight(config, stage: int) -> tuple[int, int]:
    """The oracle for memory.in_flight: walk the schedule, counting live chunks and logits."""
    p = config.parallel
    micro = config.training.global_batch_size // (config.training.micro_batch_size * p.data)
    live = logits = peak = peak_logits = 0
    for is_forward, _, chunk in schedule_for(config)(stage, p.pipeline, micro, p.virtual_stages):
        with_logits = chunk == p.virtual_stages - 1
        live += 1 if is_forward else -1
        logits += with_logits if is_forward else -with_logits
        # the peak bytes: most chunks, and of those times the most holding logits
        if (live, logits) > (peak, peak_logits):
            peak, peak_logits = live, logits
    return peak, peak_logits


def test_closed_form_in_flight_matches_walking_the_schedules():
    base = load_run(CONFIGS / "runs" / "megatron-22b-8gpu.yaml")
    for stages, chunks, per_stage, schedule in itertools.product(
        [1, 2, 3, 4], [1, 2, 3], [1, 2, 5], ["1f1b", "gpipe", "interleaved-1f1b"]
    ):
        if schedule == "gpipe" and chunks > 1:
            continue
        base.parallel.pipeline, base.parallel.virtual_stages, base.parallel.schedule = stages, chunks, schedule
        base.training.global_batch_size = base.training.micro_batch_size * per_stage * stages
        for stage in range(stages):
            walked = _walked_in_flight(base, stage)
            assert memory.in_flight(base, stage)[0] == walked[0], (stages, chunks, per_stage, schedule, stage)
            if stage == stages - 1:
                assert memory.in_flight(base, stage) == walked, (stages, chunks, per_stage, schedule)


def test_check_is_fast_at_the_microbatch_limit(capsys):
    """65,536 microbatches on 8 pipeline stages: check answers from closed forms, not schedules."""
    start = time.perf_counter()
    argv = ["check", str(CONFIGS / "runs" / "megatron-22b-8gpu.yaml"), "--set", "parallel.tensor=1",
            "--set", "parallel.pipeline=8", "--set", "training.micro_batch_size=1", "--set", "parallel.schedule=gpipe",
            "--set", f"training.global_batch_size={lim.MAX_MICROBATCHES}"]  # fmt: skip
    assert main(argv) == 0
    assert time.perf_counter() - start < 5
    assert "65536" in capsys.readouterr().out


def test_budget_estimate_and_check_prints_it(capsys):
    config = load_run(BLOOM)
    estimate = budget.estimate(config)
    assert estimate.world_size == 32 and estimate.virtual_gpus == 32
    # measured: 0.8 M events, ~160 MB RSS (see the calibration in emulator/runner/budget.py)
    assert 806_976 <= estimate.events <= 10 * 806_976
    assert 160e6 <= estimate.host_memory_bytes <= 1e9
    folded = budget.estimate(load_run(CONFIGS / "runs" / "gpt3-175b-1024gpu.yaml"))
    assert folded.virtual_gpus == 1024 // 8
    assert budget.estimate(load_run(CONFIGS / "examples" / "ping-pong.yaml")).events is None
    assert main(["check", str(BLOOM)]) == 0
    assert "estimate: ~" in capsys.readouterr().out


def test_require_fits_refuses_with_the_figures():
    big = load_run(BLOOM, ["cluster.nodes=131072", "parallel.data=null", "training.global_batch_size=null"])
    needs = r"the run needs ~\d+\.\d [GT]B of host memory \(1048576 GPUs.*this machine has 23\.0 GB available"
    with pytest.raises(ConfigError, match=needs):
        budget.require_fits(big, available_bytes=23 * 10**9)
    assert budget.require_fits(load_run(BLOOM), available_bytes=64 * 10**9).world_size == 32
    assert budget.available_memory_bytes() > 0


def test_engines_agree_at_the_slowest_allowed_links(tmp_path):
    """At the minimum bandwidths the compiled and the Python collective engines give the same
    results bit for bit (durations fit int64 nanoseconds with room to spare)."""
    fingerprints = []
    for engine in ("python", "compiled"):
        out = tmp_path / engine
        argv = ["run", str(CONFIGS / "examples" / "data-parallel.yaml"), "--out", str(out), "--quiet",
                "--set", "cluster.nodes=2", "--set", "program_args.iterations=1",
                "--set", "program_args.grad_bytes=1048576",
                "--set", f"cluster.nic.bandwidth_Gbps={lim.MIN_BANDWIDTH_GBITPS}",
                "--set", f"cluster.scale_up.bandwidth_GBps={lim.MIN_BANDWIDTH_GBPS}",
                "--set", f"cluster.nic.efficiency={lim.MIN_EFFICIENCY}",
                "--set", f"engine.collective_engine={engine}"]  # fmt: skip
        assert main(argv) == 0
        summary = json.loads((out / "summary.json").read_text())
        fingerprints.append((summary["fingerprint"], summary["sim_time_s"]))
    assert fingerprints[0] == fingerprints[1]
    assert fingerprints[0][1] > 0.4  # really slow: the MiB all-reduce takes ~1,000x longer than at 200 Gb/s


def test_config_limits_are_documented():
    """Every bound in emulator/config/limits.py is used by the schema or the cluster spec (no dead limit)."""
    used = (ROOT / "emulator" / "config" / "schema.py").read_text() + (ROOT / "netmodel" / "spec.py").read_text()
    names = [n for n in vars(lim) if n.isupper()]
    assert [n for n in names if f"lim.{n}" not in used] == []
