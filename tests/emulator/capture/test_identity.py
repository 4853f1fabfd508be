"""Which ranks provably run a captured stream: the expressions of emulator/capture/identity.py."""

from __future__ import annotations

import json

from emulator.capture.identity import Identity, evaluate, same_stream


def _ranks(predicates, world=16, nproc=8) -> list[int]:
    predicates = json.loads(json.dumps(predicates))  # as they come back from the capture's file
    return [r for r in range(world) if same_stream(predicates, Identity(r, nproc))]


def test_expressions_evaluate_for_another_rank():
    who = Identity(13, 8)  # node 1, local rank 5
    assert evaluate(["rank"], who) == 13 and evaluate(["local"], who) == 5 and evaluate(["node"], who) == 1
    assert evaluate(["env", "LOCAL_RANK"], who) == "5" and evaluate(["env", "GROUP_RANK"], who) == "1"
    assert evaluate(["grank", [12, 13, 14]], who) == 1 and evaluate(["grank", [0, 1]], who) == -1
    # a 2 x 8 mesh of ranks 0..15: rank 13 is at (1, 5)
    mesh = list(range(16))
    assert [evaluate(["coord", mesh, [2, 8], d], who) for d in (0, 1)] == [1, 5]
    assert evaluate(["mod", ["add", ["rank"], ["const", 3]], ["const", 4]], who) == 0
    assert evaluate(["item", ["divmod", ["rank"], ["const", 8]], ["const", 1]], who) == 5


def test_ranks_sharing_a_stream_answer_every_predicate_alike():
    assert _ranks([]) == list(range(16))  # no use of the identity: every rank
    assert _ranks([[["eq", ["rank"], ["const", 7]], False]]) == [r for r in range(16) if r != 7]
    assert _ranks([[["env", "LOCAL_RANK"], "3"]]) == [3, 11]
    assert _ranks([[["eq", ["mod", ["rank"], ["const", 4]], ["const", 0]], True], [["rank"], 8]]) == [8]
    # an expression that fails for a rank (a division by zero) is an answer that differs
    assert _ranks([[["floordiv", ["const", 8], ["local"]], 8]]) == [1, 9]
