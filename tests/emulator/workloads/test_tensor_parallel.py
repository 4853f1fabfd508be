"""emulator/workloads/tensor_parallel.py: the tensor group's collectives, launched and timed alike."""

from emulator.api import load_config
from emulator.backends.inline import run_inline
from emulator.hardware.gpus import get_gpu
from emulator.studies.estimate import ring_collective_ns
from emulator.workloads import layer_costs as lc
from emulator.workloads.segments import layer_shape, model_segments
from emulator.workloads.tensor_parallel import (
    boundary_collective,
    collective_lead_ns,
    launch_segments,
    repeat_prepared,
    segments_time_ns,
    vocab_rows,
)
from netmodel.topology import Topology
from tests.conftest import CONFIGS

RUN = CONFIGS / "runs" / "megatron-22b-8gpu.yaml"


def test_segments_time_mirrors_launch_order():
    """Blocking collectives add; an overlapped one runs beside the next compute, waited at "w"."""
    segments = [("c", "a", 100, 0.0), ("m", "x", "all_reduce", 10, False, "tp"), ("c", "b", 50, 0.0),
                ("m", "y", "reduce_scatter", 20, True, "tp"), ("c", "wgrad", 30, 0.0), ("w",)]  # fmt: skip
    times = {("all_reduce", 10): 7, ("reduce_scatter", 20): 45}
    elapsed, compute = segments_time_ns(segments, lambda op, size: times[(op, size)])
    assert compute == 180
    assert elapsed == 100 + 7 + 50 + 45  # the overlapped 45 outlasts the 30 of wgrad
    times[("reduce_scatter", 20)] = 10
    assert segments_time_ns(segments, lambda op, size: times[(op, size)])[0] == 100 + 7 + 50 + 30
    assert collective_lead_ns(segments, lambda op, size: times[(op, size)]) == (100, 17)
    # a context exchange first: the lead ends there, and its time counts with the named groups only
    with_cp = [("c", "qkv", 40, 0.0), ("m", "attention.cp_kv", "all_gather", 5, False, "cp"), *segments]
    assert collective_lead_ns(with_cp, lambda op, size: times[(op, size)]) == (140, 17)
    assert collective_lead_ns(with_cp, lambda op, size: times[(op, size)], {"cp": lambda op, size: 3}) == (40, 20)


def test_boundary_collective_all_reduce_or_split_in_two():
    """Without sequence parallelism a boundary all-reduces b*s*h elements; with it the same buffer is
    reduce-scattered or all-gathered (Korthikanti et al. 2022); nothing to send for t = 1."""
    shape = lc.LayerShape(1024, 16, 2048, 2, tensor_parallel=4, bytes_per_element=2)
    size = 2 * 2048 * 1024 * 2
    assert boundary_collective(shape, "reduce_scatter") == ("all_reduce", size)
    sp = lc.LayerShape(1024, 16, 2048, 2, tensor_parallel=4, sequence_parallel=True, bytes_per_element=2)
    assert boundary_collective(sp, "reduce_scatter") == ("reduce_scatter", size)
    assert boundary_collective(sp, "all_gather") == ("all_gather", size)
    assert boundary_collective(lc.LayerShape(1024, 16, 2048, 2), "all_gather") is None
    # a layer's forward: two all-reduces, or two reduce-scatters and two all-gathers of one size
    kinds = sorted((op.collective, op.size_bytes) for op in lc.forward_ops(shape) if op.kind == "comm")
    assert kinds == [("all_reduce", size)] * 2
    kinds = sorted((op.collective, op.size_bytes) for op in lc.forward_ops(sp) if op.kind == "comm")
    assert kinds == [("all_gather", size)] * 2 + [("reduce_scatter", size)] * 2


def test_vocab_rows_pad_up_to_the_tensor_size():
    assert vocab_rows(50257, 8) == 6283
    assert vocab_rows(51200, 8) == 6400
    assert vocab_rows(51200, 1) == 51200


def test_launched_segments_take_the_closed_form_time():
    """A layer's forward and backward, launched on a tensor group of 8 in one node, take in the
    emulation what segments_time_ns says with the engine's closed-form collectives."""
    config = load_config(RUN)
    topo = Topology(config.cluster)
    group = tuple(range(8))
    ends: dict[int, list[int]] = {}

    def program(gpu) -> None:
        segs = model_segments(config, gpu.spec)
        tp_group = gpu.new_group(range(8))
        marks = [gpu.synchronize()]
        for part in (segs.layer_forward, segs.layer_backward):
            launch_segments(gpu, part, tp_group)
            marks.append(gpu.synchronize())
        ends[gpu.rank] = marks

    run_inline(config, topo, program=program, args={})
    segs = model_segments(config, get_gpu(config.cluster.groups()[0].gpu))
    for i, part in enumerate((segs.layer_forward, segs.layer_backward)):
        expected = segments_time_ns(part, lambda op, size: ring_collective_ns(topo, op, size, group))[0]
        assert ends[0][i + 1] - ends[0][i] == expected, i
    assert layer_shape(config).sequence_parallel  # the shipped run: the split collectives are the ones timed


def test_repeat_prepared_only_where_the_copies_launch_alike():
    """repeat_prepared concatenates a prepared block's copies unless one ends with an overlapped
    collective not waited for: launch_prepared forgets it at a block's end, where the concatenation
    would wait for it at the next copy's "w" (a different op sequence)."""
    compute, wait = ("c", "gemm", 5, 1.0), ("w", None, None, None)
    waited, overlapped = ("m", "call", "tp", False), ("m", "call", "tp", True)
    block = [compute, overlapped, compute, wait, waited, compute]
    assert repeat_prepared(block, 3) == block * 3
    assert repeat_prepared([compute, waited, compute], 2) == [compute, waited, compute] * 2
    assert repeat_prepared([compute, overlapped, compute], 2) is None
    assert repeat_prepared([compute, overlapped, waited, compute], 2) is None  # a waited one clears nothing
    assert repeat_prepared([compute, overlapped, compute, wait], 2) is not None
