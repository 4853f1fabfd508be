"""The fingerprint covers every result figure: equal for a rerun and any shard count, different
whenever any recorded figure differs (ZeRO-1 vs ZeRO-2 differ in memory only)."""

from __future__ import annotations

import copy

import pytest

import emulator
from emulator.engine.result import RankResult, RunResult, fingerprint
from tests.conftest import CONFIGS
from tests.emulator.conftest import GPT175B, GPT175B_SMALL

BLOOM = str(CONFIGS / "runs" / "bloom-560m-zero2.yaml")
# one microbatch per data-parallel rank and one iteration: the same traffic in a few seconds
BLOOM_SMALL = {"training.global_batch_size": 128, "training.iterations": 1}


def test_zero1_and_zero2_differ_although_their_traffic_is_the_same():
    """ZeRO-1 and ZeRO-2 run the same collectives at the same times; only memory differs, which the
    fingerprint covers."""
    z1 = emulator.run(BLOOM, overrides={**BLOOM_SMALL, "parallel.zero_stage": 1}, trace_ranks="none")
    z2 = emulator.run(BLOOM, overrides={**BLOOM_SMALL, "parallel.zero_stage": 2}, trace_ranks="none")
    for key in ("iteration_time_s", "sim_time_s", "bytes_by_tier", "messages_by_tier", "message_size_histogram"):
        assert z1.summary[key] == z2.summary[key], key
    assert z1.summary["peak_memory_bytes"] > z2.summary["peak_memory_bytes"]
    assert z1.fingerprint != z2.fingerprint


@pytest.mark.parametrize("run_file, overrides", [(BLOOM, BLOOM_SMALL), (GPT175B, GPT175B_SMALL)], ids=["zero2", "3d"])
def test_rerun_and_shard_counts_agree(run_file, overrides):
    """A run, its rerun and the same run on 2 and 4 in-process shards have one fingerprint."""
    runs = [emulator.run(run_file, overrides=overrides, shards=s, trace_ranks="none") for s in (1, 1, 2, 4)]
    assert len({r.fingerprint for r in runs}) == 1, [r.fingerprint for r in runs]
    assert runs[3].summary["cross_shard_messages"] > 0  # the shards did talk to each other


def _result() -> RunResult:
    ranks = [RankResult(rank=r, node=r // 2, final_time_ns=1000 + r, ops=10, compute_ns=600, comm_ns=300,
                        peak_memory_bytes=1 << 30, marks_ns=[500, 1000], wait_ns={"compute": {"tp": 40, "pp.recv": 7}},
                        flops=1.5e12) for r in range(4)]  # fmt: skip
    return RunResult(world_size=4, ranks=ranks, links={0: (4096, 20, 2, 3), 5: (1024, 8, 1, 0)},
                     tier_bytes=[4096, 1024], tier_messages=[2, 1], size_hist=[{12: 2}, {10: 1}], events=99,
                     rounds=3, cross_shard_messages=1, kind_hist={"all_reduce": {12: 2}, "send": {10: 1}},
                     timeline=[{0: 4096}, {0: 1024}], bucket_ns=1000,
                     traces={0: [("compute", "fwd", "compute", 0, 600)]}, extra={"shard_busy_s": [0.1]})  # fmt: skip


# one change of each recorded figure: (what, how to change the result)
CHANGES = {
    "final time": lambda r: setattr(r.ranks[1], "final_time_ns", 1002),
    "ops": lambda r: setattr(r.ranks[0], "ops", 11),
    "compute time": lambda r: setattr(r.ranks[0], "compute_ns", 601),
    "comm time": lambda r: setattr(r.ranks[0], "comm_ns", 301),
    "peak memory": lambda r: setattr(r.ranks[3], "peak_memory_bytes", (1 << 30) - 1),
    "iteration marks": lambda r: setattr(r.ranks[2], "marks_ns", [501, 1000]),
    "wait time": lambda r: r.ranks[0].wait_ns["compute"].update(tp=41),
    "wait stream": lambda r: r.ranks[0].wait_ns["compute"].update(dp=r.ranks[0].wait_ns["compute"].pop("tp")),
    "flops": lambda r: setattr(r.ranks[0], "flops", 1.5e12 + 1),
    "link bytes": lambda r: r.links.update({0: (4097, 20, 2, 3)}),
    "link busy": lambda r: r.links.update({0: (4096, 21, 2, 3)}),
    "link messages": lambda r: r.links.update({0: (4096, 20, 3, 3)}),
    "link queueing": lambda r: r.links.update({0: (4096, 20, 2, 4)}),
    "tier bytes": lambda r: r.tier_bytes.__setitem__(1, 1025),
    "tier messages": lambda r: r.tier_messages.__setitem__(1, 2),
    "size histogram": lambda r: r.size_hist[0].update({12: 1, 11: 1}),
    "kind histogram": lambda r: r.kind_hist.update({"all_gather": r.kind_hist.pop("all_reduce")}),
    "timeline": lambda r: r.timeline[0].update({0: 2048, 1: 2048}),
    "timeline bucket": lambda r: setattr(r, "bucket_ns", 2000),
}


@pytest.mark.parametrize("what", CHANGES)
def test_every_recorded_figure_changes_the_fingerprint(what):
    """Changing any one result figure changes the fingerprint."""
    changed = _result()
    CHANGES[what](changed)
    assert fingerprint(changed) != fingerprint(_result())


def test_how_the_run_was_emulated_is_not_a_result():
    """Events, rounds, cross-shard messages, traces, wall-clock extras and dict order leave it as is."""
    other = _result()
    other.events, other.rounds, other.cross_shard_messages = 5, 40, 17
    other.traces, other.extra = {}, {"shard_busy_s": [9.0, 9.0]}
    other.links = dict(reversed(list(other.links.items())))  # shards merge in any order
    other.kind_hist = dict(reversed(list(other.kind_hist.items())))
    assert fingerprint(other) == fingerprint(_result())
    assert fingerprint(copy.deepcopy(other)) == fingerprint(other)


def _reference_encoding(value) -> bytes:
    """The fingerprint's encoding as documented in emulator/engine/result.py (_encode), written
    plainly over bytes: the fast text-building version must give these bytes exactly."""
    import struct

    if isinstance(value, bool) or value is None:
        return b"b" + repr(value).encode()
    if isinstance(value, int):
        return b"i" + repr(value).encode() + b";"
    if isinstance(value, float):
        return b"f" + struct.pack("<d", value)
    if isinstance(value, str):
        raw = value.encode()
        return b"s" + repr(len(raw)).encode() + b":" + raw
    if isinstance(value, (list, tuple)):
        return b"l" + repr(len(value)).encode() + b":" + b"".join(_reference_encoding(v) for v in value)
    keys = sorted(value, key=lambda k: (type(k).__name__, k))
    return (
        b"d"
        + repr(len(value)).encode()
        + b":"
        + b"".join(_reference_encoding(k) + _reference_encoding(value[k]) for k in keys)
    )


def _fuzz_value(rng, depth: int = 0):
    import enum

    class Level(enum.IntEnum):
        LOW = 3

    kinds = ["int", "big", "neg", "float", "str", "bool", "none", "enum"] + (["list", "tuple", "dict"] * 2 if depth < 3
                                                                             else [])  # fmt: skip
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randrange(0, 1 << 40)
    if kind == "big":
        return rng.randrange(1 << 64, 1 << 90)
    if kind == "neg":
        return -rng.randrange(1, 1000)
    if kind == "float":
        return rng.choice([0.0, -0.0, 1.5e12, rng.random(), float("inf"), float("nan")])
    if kind == "str":
        return rng.choice(["", "tp", "pp.recv.fwd0", "münchen", "a\u2713b", "x" * 40])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "enum":
        return Level.LOW
    n = rng.randrange(0, 5)
    if kind == "list":
        return [_fuzz_value(rng, depth + 1) for _ in range(n)] if rng.random() < 0.7 else \
            [rng.randrange(100) for _ in range(n)]  # fmt: skip
    if kind == "tuple":
        return tuple(_fuzz_value(rng, depth + 1) for _ in range(n))
    if rng.random() < 0.25:  # int keys, values all tuples of one length (links) or all ints (timeline)
        m = rng.randrange(0, 5)
        odd = rng.choice([None, True, Level.LOW, 1 << 70, -3, 2.0])  # a value the one-fragment path must handle
        values = [tuple(rng.randrange(1 << 40) for _ in range(m)) if rng.random() < 0.8 else rng.randrange(9)
                  for _ in range(n)]  # fmt: skip
        if values and rng.random() < 0.3 and isinstance(values[0], tuple) and m:
            values[0] = (odd, *values[0][1:])
        return dict(zip(rng.sample(range(1000), n), values, strict=True))
    key_kind = rng.choice(["int", "str", "mixed"])
    keys = {rng.randrange(50) if key_kind == "int" or (key_kind == "mixed" and rng.random() < 0.5)
            else rng.choice(["a", "b", "tp", "dp", "ü"]) for _ in range(n)}  # fmt: skip
    return {k: _fuzz_value(rng, depth + 1) if rng.random() < 0.5 else rng.randrange(1 << 30) for k in keys}


def test_encoding_is_the_documented_bytes_on_fuzzed_values():
    """_encode builds Latin-1 text for speed; its bytes are the documented encoding's, on fuzzed
    nested values (ints of any size, int subclasses, floats, non-ASCII strings, mixed dict keys)."""
    import random

    from emulator.engine.result import _encode

    rng = random.Random(24)
    for _ in range(1000):
        value = _fuzz_value(rng)
        out: list[str] = []
        _encode(value, out)
        assert "".join(out).encode("latin-1") == _reference_encoding(value), value


def test_fingerprint_of_a_known_result_is_pinned():
    """The digest of a fixed result: a change to the encoding shows here before the shipped runs."""
    assert fingerprint(_result()) == hashlib_reference(_result())


def hashlib_reference(result: RunResult) -> str:
    import hashlib

    parts = [_reference_encoding([r.rank, r.node, r.final_time_ns, r.ops, r.compute_ns, r.comm_ns,
                                  r.peak_memory_bytes, r.marks_ns, r.wait_ns, float(r.flops)])
             for r in result.ranks]  # fmt: skip
    parts.append(_reference_encoding(result.links))
    parts.append(_reference_encoding([result.world_size, result.tier_bytes, result.tier_messages, result.size_hist,
                                      result.kind_hist, result.bucket_ns, result.timeline]))  # fmt: skip
    return hashlib.sha256(b"".join(parts)).hexdigest()[:32]
