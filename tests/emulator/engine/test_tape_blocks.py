"""A tape's blocks chained in the kernels (EMULATOR_TAPE=blocks, opstreams._chain and _instant's
ST_ICHAIN, OpCore.settle): a block queued behind another starts where that one ends, its proxy's
completion counted there, both where the block ends with a compute op and where it ends with a free
or alloc; the results are those of ``steps`` (one stop per block end) and of the program launching
every step itself (``0``), bit for bit, with few or many ops ahead (the program's suspensions and
resumptions at other block ends) and with a straggler (its rank keeps the Python path)."""

from __future__ import annotations

import collections

import pytest

from emulator.engine import opcore as engine_opcore
from emulator.engine.opkernels import R_ADONE, ST_IBLOCK
from emulator.engine.ops import BLOCK
from tests.emulator.engine.test_tape_steps import _run


@pytest.fixture
def stops(monkeypatch):
    """Block ends Python handled (``block_done``: last op a compute op; ``iblock``: a free or alloc)
    and proxies the kernels completed themselves (``chained``, what OpCore.settle found)."""
    seen: collections.Counter = collections.Counter()
    block_done, instant_stop, settle = (engine_opcore.OpCore.block_done, engine_opcore.OpCore.instant_stop,
                                        engine_opcore.OpCore.settle)  # fmt: skip

    def noting_done(self):
        seen["block_done"] += 1
        return block_done(self)

    def noting_stop(self, gpu, status, t):
        seen["iblock"] += status == ST_IBLOCK
        return instant_stop(self, gpu, status, t)

    def noting_settle(self, gpu):
        n = int(gpu._mv[R_ADONE])
        seen["chained"] += n
        # what the kernels' chain conditions guarantee and settle no longer asserts per proxy
        for proxy in list(gpu.streams["compute"].ops)[:n] if n else ():
            assert proxy.kind == BLOCK and proxy.dependents is None and not proxy.done, proxy
        return settle(self, gpu)

    monkeypatch.setattr(engine_opcore.OpCore, "block_done", noting_done)
    monkeypatch.setattr(engine_opcore.OpCore, "instant_stop", noting_stop)
    monkeypatch.setattr(engine_opcore.OpCore, "settle", noting_settle)
    return seen


@pytest.mark.parametrize(
    "extra, chains",
    [
        # 3 ahead: the program suspended before the next block's launch, nothing queued to chain
        (["engine.max_ops_ahead=3"], False),
        (["engine.max_ops_ahead=16"], True),  # resumptions at block ends
        ([], True),  # 256 ahead: long chains
        (["faults.slow_gpu=[{ranks: [17], factor: 0.5}]", "engine.fold_tensor_groups=false"], True),
    ],
)  # fmt: skip
def test_chained_blocks_match(extra, chains, stops, monkeypatch):
    args = ["training.global_batch_size=16", *extra]
    steps = _run(args, "steps", monkeypatch)
    before = dict(stops)
    assert not before.get("chained"), before
    stops.clear()
    blocks = _run(args, "blocks", monkeypatch)
    assert blocks == steps
    # both ends chained: fewer stops of either kind, every missing one a proxy the kernels completed
    if chains:
        assert stops["chained"] > 0 and stops["block_done"] < before["block_done"], (before, dict(stops))
        assert stops["iblock"] < before["iblock"], (before, dict(stops))
    assert stops["chained"] == before["block_done"] + before["iblock"] - stops["block_done"] - stops["iblock"]
    assert steps == _run(args, "0", monkeypatch)
    assert steps == _run(args, "arrays", monkeypatch)  # (settle's checks above on its chains too)
