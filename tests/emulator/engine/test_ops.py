"""ops.BlockProxy sets Op's fields itself (one frame per proxy, the tape's hot path): held equal here."""

from emulator.engine.ops import BLOCK, BlockProxy, Op


def _slots(cls) -> list[str]:
    return [name for klass in cls.__mro__ for name in getattr(klass, "__slots__", ())]


def test_block_proxy_sets_the_fields_op_init_sets_as_it_does():
    figures = (1_500, 2.5e12, 1_400, 7)
    proxy = BlockProxy(figures, known=("entry",), suffix=" L3")
    op = Op(BLOCK, None, *figures)
    # every field Op.__init__ sets (the others are set where an op needs them: a send's gpu, the
    # lookahead's cum / cdep / dl / ds) - a field added there but not to BlockProxy.__init__ fails here
    set_by_op = [name for name in _slots(Op) if hasattr(op, name)]
    assert {"kind", "stream", "dependents", "done", "t_start", "a", "d", "cross"} <= set(set_by_op)
    for name in set_by_op:
        assert getattr(proxy, name) == getattr(op, name), name
    assert (proxy.mem, proxy.known, proxy.suffix) == (None, ("entry",), " L3")
