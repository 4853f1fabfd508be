"""The identity stand-ins of emulator/capture/recorder.py on their own: what each use records.

    python -m pytest -q tests/emulator/capture/test_recorder.py
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from emulator.capture.identity import Identity, same_stream  # noqa: E402
from emulator.capture.recorder import EnvText, RankValue, Recorder, ScriptInt  # noqa: E402


@pytest.fixture
def rec(tmp_path):
    return Recorder(str(tmp_path / "train.py"), rank=5, world=16, capacity_bytes=1 << 30)


def test_the_scripts_int_of_local_rank_is_the_identity_and_records_nothing(rec):
    local = ScriptInt(EnvText("LOCAL_RANK", "5", rec))
    assert isinstance(local, RankValue) and local.expr == ["local"] and local.value == 5
    assert isinstance(local, ScriptInt)  # the script's isinstance(x, int)
    assert ScriptInt(EnvText("RANK", "13", rec)).expr == ["rank"]
    assert ScriptInt(EnvText("NODE_RANK", "1", rec)).expr == ["node"]
    assert rec.predicates == []
    # the script's int of a stand-in stays one: int(rank / 2)
    half = ScriptInt(local / 2)
    assert half.expr == ["int", ["truediv", ["local"], ["const", 2]]] and half.value == 2
    assert rec.predicates == []


@pytest.mark.parametrize("use", [str, repr, hash, len, lambda t: t.isdigit(), lambda t: t == "5",
                                 lambda t: t + "", lambda t: "cuda:" + t, int, float, lambda t: f"{t}"])  # fmt: skip
def test_any_other_use_of_the_environment_text_records_it_exactly(rec, use):
    use(EnvText("LOCAL_RANK", "5", rec))
    assert rec.predicates == [[["env", "LOCAL_RANK"], "5"]]
    # ranks of the same local rank answer alike, the others do not
    assert same_stream(rec.predicates, Identity(13, 8)) and not same_stream(rec.predicates, Identity(6, 8))


def test_a_truth_test_of_the_text_records_its_answer(rec):
    assert EnvText("LOCAL_RANK", "5", rec)
    assert rec.predicates == [[["bool", ["env", "LOCAL_RANK"]], True]]
    assert same_stream(rec.predicates, Identity(6, 8))  # any rank's text is non-empty


def test_the_scripts_int_is_the_builtin_otherwise():
    assert ScriptInt("7") == 7 and type(ScriptInt("7")) is int
    assert ScriptInt("ff", 16) == 255 and ScriptInt() == 0 and ScriptInt(3.9) == 3
    assert isinstance(3, ScriptInt) and not isinstance("3", ScriptInt) and issubclass(bool, ScriptInt)
