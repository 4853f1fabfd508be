"""emulator/workloads/pipeline.py: microbatches, messages, in-flight activations, the bubble."""

import re

import pytest

from emulator.config.loader import load_run
from emulator.workloads.pipeline import (
    bubble_fraction,
    in_flight,
    layers_of_chunk,
    layers_of_stage,
    layers_on_stage,
    message_bytes,
    microbatches,
    pipeline_ns,
    receive_source,
    schedule_walk_ns,
    send_target,
)
from emulator.workloads.schedules import gpipe, interleaved_one_f_one_b, one_f_one_b
from tests.conftest import CONFIGS

RUN = CONFIGS / "runs" / "megatron-22b-8gpu.yaml"


def test_one_f_one_b_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    """1F1B / GPipe idle (p-1)/(m+p-1) of an iteration; v chunks cut it to (p-1)/(m*v+p-1)."""
    assert bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert bubble_fraction(4, 8, 2) == pytest.approx(3 / 19)
    assert bubble_fraction(1, 8) == 0
    for p, m, v in [(4, 8, 1), (8, 32, 1), (4, 16, 3)]:
        c = 1000  # equal stages: the iteration is (m*v + p - 1) slots, m*v of them busy
        assert 1 - m * v * c / pipeline_ns([c] * p, m, v) == pytest.approx(bubble_fraction(p, m, v))


def test_walked_schedule_idles_the_bubble_fraction():
    """Walking 1F1B with equal stages and free sends, stage 0 is busy m of its (m+p-1) slots."""
    p, m = 4, 8
    ends = schedule_walk_ns([[10]] * p, [[20]] * p, [0] * p, m, one_f_one_b)
    assert 1 - m * 30 / ends[0] == pytest.approx(bubble_fraction(p, m))


def test_pipeline_is_narayanan_for_equal_stages():
    """(m*v + p - 1) chunk slots: a bubble of (p-1)/v stage times (Narayanan et al. 2021)."""
    m, p, v, c = 16, 4, 2, 1000
    assert pipeline_ns([c] * p, m, v) == (m * v + p - 1) * c
    assert pipeline_ns([c], m, 1) == m * c  # no pipeline, no bubble
    assert pipeline_ns([c, 2 * c, c], 10, 1) == 9 * 2 * c + 4 * c  # the slowest stage sets the pace


WALKS = [(4, 8, 1, one_f_one_b), (4, 8, 2, interleaved_one_f_one_b), (4, 8, 1, gpipe),
         (2, 6, 3, interleaved_one_f_one_b)]  # fmt: skip


@pytest.mark.parametrize("stages, micro, chunks, schedule", WALKS)
def test_schedule_walk_of_equal_stages_is_the_closed_form(stages, micro, chunks, schedule):
    """Equal stages, free sends: stage 0 ends at (m*v + p - 1) chunk slots, each later stage one backward earlier."""
    ends = schedule_walk_ns([[10] * chunks] * stages, [[20] * chunks] * stages, [0] * stages, micro, schedule)
    assert ends[0] == pipeline_ns([30] * stages, micro, chunks)
    assert ends == [ends[0] - 20 * s for s in range(stages)]


def test_schedule_walk_of_unequal_stages_by_hand():
    """1F1B, 4 microbatches; stage 1 twice as fast (f 5, b 10) as stage 0 (f 10, b 20). Stage 0:
    F0 0-10, F1 10-20, then each backward waits for stage 1's (B0 25-45, B1 55-75, B2 85-105),
    B3 105-125; stage 1 ends with B3 at 90-100. A hop of 1 delays each exchange."""
    assert schedule_walk_ns([[10], [5]], [[20], [10]], [0, 0], 4, one_f_one_b) == [125, 100]
    assert pipeline_ns([30, 15], 4, 1) == 135  # the closed form overestimates unequal stages
    ends = schedule_walk_ns([[10], [5]], [[20], [10]], [1, 1], 4, one_f_one_b)
    assert ends[0] > 125 and ends[1] > 100


def test_sends_and_receives_pair_up():
    """Whoever a virtual stage sends to receives from it; the last stage's chunk c feeds stage 0's c+1."""
    stages, chunks = 4, 3
    for stage in range(stages):
        for chunk in range(chunks):
            for forward in (True, False):
                target = send_target(stage, chunk, forward, stages, chunks)
                if target is not None:
                    assert receive_source(target[0], forward, stages) == stage
    assert send_target(3, 0, True, 4, 3) == (0, 1)
    assert send_target(0, 1, False, 4, 3) == (3, 0)
    assert send_target(3, 2, True, 4, 3) is None  # the logits
    assert send_target(0, 0, False, 4, 3) is None  # the embedding


def test_microbatches_messages_and_in_flight():
    config = load_run(RUN, ["parallel.pipeline=4", "parallel.tensor=2", "cluster.nodes=1",
                            "training.global_batch_size=32", "model.num_layers=8"])  # fmt: skip
    assert config.parallel.data == 1 and microbatches(config) == 32 // 4
    # b*s*h 16-bit elements over the tensor group of 2 (Megatron's scatter-gather)
    assert message_bytes(config) == 4 * 2048 * 6144 * 2 // 2
    # 1F1B holds p - stage microbatches (Narayanan et al. 2021), the last stage with its logits
    assert [in_flight(config, s) for s in range(4)] == [(4, 1), (3, 1), (2, 1), (1, 1)]
    config.parallel.schedule = "gpipe"
    assert [in_flight(config, s) for s in range(4)] == [(8, 8)] * 4


SPLIT = ["parallel.pipeline=2", "parallel.virtual_stages=2", "parallel.tensor=2", "cluster.nodes=1",
         "parallel.data=2", "training.global_batch_size=8", "training.micro_batch_size=1", "model.num_layers=6",
         "parallel.embedding_in_split=true", "parallel.loss_in_split=true"]  # fmt: skip


def test_embedding_and_loss_in_split_take_a_layer_slot_each():
    """(6 + 2) slots over 2 stages x 2 chunks: 2 each, less one on the first chunk of stage 0 (the
    embedding) and on the last chunk of the last stage (the loss), as Llama 3's 405B split."""
    config = load_run(RUN, SPLIT)
    assert [[layers_of_chunk(config, s, c) for c in range(2)] for s in range(2)] == [[1, 2], [2, 1]]
    assert [layers_on_stage(config, s) for s in range(2)] == [3, 3]
    assert [layers_of_stage(config, s) for s in range(2)] == [2, 2]  # the largest chunk sizes the peak
    only_embedding = load_run(RUN, [*SPLIT[:-1], "parallel.loss_in_split=false", "model.num_layers=7"])
    assert [[layers_of_chunk(only_embedding, s, c) for c in range(2)] for s in range(2)] == [[1, 2], [2, 2]]


def test_split_layers_reach_the_program_memory_and_estimate():
    """The emulated program runs each chunk's own layers: stage 0's weights are 3 layers' (not 4),
    and the closed-form estimate follows the emulated iteration."""
    from emulator.backends.inline import run_inline
    from emulator.engine.result import iteration_times_ns
    from emulator.studies.estimate import estimate
    from emulator.workloads.memory import params_on_rank
    from netmodel.topology import Topology

    config = load_run(RUN, SPLIT)
    even = load_run(RUN, [*SPLIT[:-2], "model.num_layers=8"])  # 8 layers: 2 in every chunk
    assert params_on_rank(even, 0) - params_on_rank(config, 0) == params_on_rank(even, 1) - params_on_rank(config, 1)
    assert params_on_rank(even, 0) > params_on_rank(config, 0)
    (iteration_ns,) = iteration_times_ns(run_inline(config, Topology(config.cluster)))
    (even_ns,) = iteration_times_ns(run_inline(even, Topology(even.cluster)))
    assert iteration_ns < even_ns  # 6 layers where the even split runs 8
    assert estimate(config).iteration_time_s == pytest.approx(iteration_ns / 1e9, rel=0.05)


@pytest.mark.parametrize("overrides, message", [
    (["model.num_layers=7"], "model.num_layers (7) + 2 (embedding_in_split, loss_in_split) must be divisible"),
    (["parallel.pipeline_layers=[3,3]"], "apply to the even split"),
])  # fmt: skip
def test_split_errors_name_the_keys(overrides, message):
    from emulator.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_run(RUN, [*SPLIT, *overrides])


@pytest.mark.parametrize("shards", [2, 4])
def test_split_identical_on_any_shard_count(shards):
    from emulator.backends.inline import run_inline
    from emulator.engine.result import fingerprint
    from netmodel.topology import Topology

    config = load_run(RUN, [*SPLIT[:3], "cluster.nodes=2", "parallel.data=4", *SPLIT[5:]])
    topo = Topology(config.cluster)
    assert fingerprint(run_inline(config, topo, shards)) == fingerprint(run_inline(config, topo, 1))
