"""opcore._zeros: the op ring's large arrays in small, private pages (no huge-page compaction stalls at
their first touch; a forked process gets its own copy)."""

import sys

import numpy as np
import pytest

from emulator.engine.opcore import _HUGE_BYTES, _zeros


def test_small_arrays_are_numpys_zeros():
    a = _zeros(100, np.int64)
    assert a.dtype == np.int64 and a.shape == (100,) and not a.any() and a.base is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_large_arrays_are_private_zeroed_writable_mappings():
    n = _HUGE_BYTES // 8 + 3
    a = _zeros(n, np.int64)
    assert a.shape == (n,) and not a.any()
    a[-1] = 7  # writable
    address = a.__array_interface__["data"][0]
    for line in open("/proc/self/maps"):
        span, perms = line.split()[:2]
        lo, hi = (int(x, 16) for x in span.split("-"))
        if lo <= address < hi:
            assert perms == "rw-p", line  # private, not shared memory
            break
    else:
        raise AssertionError("the array's mapping not found")
