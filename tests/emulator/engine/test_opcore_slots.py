"""The op kernels' slot and view arithmetic (opheap._new_op, oplayout._table): what the per-event code
replaced a division and fifteen array arguments with must address the same memory."""

from __future__ import annotations

import numpy as np
import pytest

from emulator.engine import opkernels as k


@pytest.mark.parametrize("ring", [64, 512, 48, 100])
def test_a_new_op_takes_the_rank_s_next_slot_of_its_ring(ring):
    """Slot ``ri * ring + n % ring`` for the rank's n-th op: by a mask where OpCore's ring is a
    power of two, by the division otherwise; the ring check (G_ERR 1) sees a slot still in use."""
    ranks = 3
    rs = np.zeros((ranks, k.R_FIELDS), np.int64)
    ops = np.zeros((ranks * ring + 4, k.O_FIELDS), np.int64)  # (+4: the rows _new_op prefetches past the end)
    g = np.zeros(k.G_FIELDS, np.int64)
    g[k.G_RING] = ring
    for n in range(3 * ring + 5):
        for ri in range(ranks):
            op = k._new_op(rs, ops, g, ri, k.K_C, n)
            assert op == ri * ring + n % ring
            assert ops[op, k.O_VAL] == n and ops[op, k.O_STATE] == k.S_LAUNCHED and ops[op, k.O_RI] == ri
            ops[op, k.O_STATE] = k.S_DONE
    assert g[k.G_ERR] == 0 and rs[:, k.R_RING].tolist() == [3 * ring + 5] * ranks
    k._new_op(rs, ops, g, 1, k.K_C, 0)  # slot still launched a ring later: an engine bug, reported
    k._new_op(rs, ops, g, 1, k.K_C, 0)
    assert g[k.G_ERR] == 0
    ops[1 * ring + (3 * ring + 7) % ring, k.O_STATE] = k.S_LAUNCHED
    rs[1, k.R_RING] = 3 * ring + 7 + ring
    k._new_op(rs, ops, g, 1, k.K_C, 0)
    assert g[k.G_ERR] == 1


def test_the_helpers_table_addresses_the_arrays():
    """_table (the addresses the helpers view their arrays through) names each array at its data,
    in the A_* order, with the two lengths the kernels read."""
    arrays = [np.zeros((2, k.R_FIELDS), np.int64), np.zeros((8, k.O_FIELDS), np.int64), np.zeros(8), np.zeros(2),
              np.zeros((4, 3), np.int64), np.zeros(4), np.zeros((2, 2), np.int64), np.zeros((1, k.P_FIELDS), np.int64),
              np.zeros(3, np.int64), np.zeros(5, np.int64), np.zeros(5, np.int64), np.zeros(5, np.int64),
              np.zeros(7, np.int64), np.zeros((6, 4), np.int64), np.zeros((4, 3), np.int64),
              np.zeros(k.G_FIELDS, np.int64), np.zeros((1, k.GR_FIELDS), np.int64)]  # fmt: skip
    table = k._table(*arrays)
    assert len(table) == k.A_NOVF + 1
    assert list(table[: k.A_GR + 1]) == [a.ctypes.data for a in arrays]
    assert (table[k.A_NTL], table[k.A_NOVF]) == (7, 6)
