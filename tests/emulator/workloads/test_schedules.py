"""Pipeline schedules: every microbatch once forward then backward; memory in flight; bubble."""

import pytest

from emulator.workloads.schedules import SCHEDULES, peak_in_flight


@pytest.mark.parametrize("name,chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2), ("interleaved-1f1b", 3)])
@pytest.mark.parametrize("stages,micro", [(1, 4), (4, 8), (8, 16)])
def test_every_microbatch_forward_then_backward(name, chunks, stages, micro):
    for stage in range(stages):
        actions = SCHEDULES[name](stage, stages, micro, chunks)
        assert len(actions) == 2 * micro * chunks
        done = set()
        for is_forward, mb, chunk in actions:
            if is_forward:
                done.add((mb, chunk))
            else:
                assert (mb, chunk) in done


def test_in_flight_microbatches():
    """GPipe keeps m microbatches, 1F1B at most p - stage (Narayanan et al. 2021)."""
    assert peak_in_flight(SCHEDULES["gpipe"](0, 4, 8, 1)) == 8
    assert [peak_in_flight(SCHEDULES["1f1b"](s, 4, 8, 1)) for s in range(4)] == [4, 3, 2, 1]
