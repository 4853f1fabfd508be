"""The compiled row formatter (emulator/results/textrows.py) writes what Python's ``str`` and
``repr`` write: ints, floats that are exactly ``k / 10**d``, and the fallback texts, on fuzzed
values and the edges (0, -0.0, below 1e-4, 15 and 16 digits, inf, nan, negative ints)."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

from emulator.results.tables import decimal_cells
from emulator.results.textrows import INT, MAX_DECIMALS, TEXT, RowText, decimal_ok

EDGES = [0.0, -0.0, 1e-4, 9.9e-05, 1e-05, 5e-06, 0.1, 0.5, 1.0, 1.5, 99999.999999, 1e15, 1e16,
         123456789.123456, 0.30000000000000004, 1000.0000000000001, math.inf, -math.inf, math.nan, -1.5, 2.0**53,
         0.001, 0.0001234]  # fmt: skip


def _floats(rng: random.Random, decimals: int, n: int) -> list[float]:
    out = list(EDGES)
    for _ in range(n):
        k = rng.choice([0, 1, rng.randrange(10), rng.randrange(10**4), rng.randrange(10**9), rng.randrange(10**15),
                        10**15 - 1, 10**15, rng.randrange(10**18)])  # fmt: skip
        x = k / 10**decimals
        out.append(rng.choice([x, x * 1e3 / 1e3, x * 1e6, x * 3, -x]))
    return out


@pytest.mark.parametrize("decimals", [1, 3, 6, 9])
def test_decimal_cells_are_repr(decimals):
    rng = random.Random(decimals)
    x = _floats(rng, decimals, 3000)
    values = np.empty(len(x), dtype=np.int64)
    kinds = np.empty(len(x), dtype=np.int8)
    texts = ["unused"]
    decimal_cells(np.array(x), decimals, values, kinds, texts)
    assert (kinds == decimals).sum() > len(x) // 5  # many are written from their integers
    rows = RowText(["", "\n"])
    out = rows.format(values.reshape(-1, 1), kinds.reshape(-1, 1), texts).decode()
    assert out.splitlines() == [repr(v) for v in x]
    # json's texts for the trace (NaN, Infinity) where the value has no decimal form
    texts = []
    decimal_cells(np.array(x), decimals, values, kinds, texts, lambda v: json.dumps(v))
    out = rows.format(values.reshape(-1, 1), kinds.reshape(-1, 1), texts).decode()
    assert out.splitlines() == [json.dumps(v) for v in x]


def test_ints_texts_pieces_and_separator():
    rng = random.Random(1)
    ints = [0, 1, -1, 9, 10, -10, 2**63 - 1, -(2**63) + 1] + [rng.randrange(-(10**18), 10**18) for _ in range(500)]
    names = ["gpu", "", "münchen ✓", '"q"']
    rows = RowText(["<", "|", ">"], sep=";")
    values = np.array([[v, i % len(names)] for i, v in enumerate(ints)], dtype=np.int64)
    kinds = np.array([[INT, TEXT]] * len(ints), dtype=np.int8)
    out = rows.format(values, kinds, names).decode()
    assert out == ";".join(f"<{v}|{names[i % len(names)]}>" for i, v in enumerate(ints))
    assert rows.format(values[:0], kinds[:0], names) == b""


def test_decimal_ok_is_the_range_where_repr_is_the_decimal():
    for d in range(1, MAX_DECIMALS + 1):
        for k in [0, 1, 9, 10**max(d - 4, 0) - 1, 10**max(d - 4, 0), 10**15 - 1, 10**15, 123456789]:
            ok = bool(decimal_ok(np.array([k], dtype=np.int64), d)[0])
            text = repr(k / 10**d)
            assert ok <= ("e" not in text), (k, d, text)  # where ok, the decimal form (checked below)
            if ok:
                whole, frac = divmod(k, 10**d)
                assert text == f"{whole}.{str(frac).rjust(d, '0').rstrip('0') or '0'}"


@pytest.mark.parametrize("seed", range(3))
def test_texts_encoded_once_give_the_rows_of_the_texts_given_each_time(seed):
    """format_encoded with a TextBlob (texts kept from call to call, a prefix of the call's own
    texts before them) writes what format_array writes from the whole list of texts."""
    from emulator.results.textrows import TextBlob

    rng = random.Random(seed)
    words = ["", "a", "é", "{\"name\":\"x\",", "gpu 7", "\u2603" * 3, ",", "wait comm"]
    kept, added = TextBlob(), []
    rows = RowText(["[", "|", "]"], ";")
    for _ in range(30):
        for _ in range(rng.randrange(0, 4)):
            added.append(rng.choice(words) + str(rng.randrange(100)))
            assert kept.append(added[-1]) == len(added) - 1
        prefix = [rng.choice(words) for _ in range(rng.randrange(0, 4))]
        texts = prefix + added
        n = rng.randrange(0, 6)
        kinds = np.array([[rng.choice([TEXT, INT, 3]) for _ in range(2)] for _ in range(n)],
                         dtype=np.int8).reshape(n, 2)  # fmt: skip
        values = np.array([[rng.randrange(len(texts)) if k == TEXT else rng.randrange(10**6) for k in row]
                           for row in kinds.tolist()], dtype=np.int64).reshape(n, 2)  # fmt: skip
        if not texts:
            kinds[kinds == TEXT] = INT
        got = rows.format_encoded(values, kinds, *kept.with_prefix(prefix)).tobytes()
        assert got == rows.format(values, kinds, texts)
