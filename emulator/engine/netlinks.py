"""The link model in the message core (compiled; netkernels.py): when a message's bytes have left
its links, the links' reservations and their statistics (bytes, busy time, waits, queueing)."""

from __future__ import annotations

import numpy as np
from numba import njit

from emulator.engine import kernel_cache  # noqa: F401 - kernel_cache: before any kernel (its module doc)
from emulator.engine.netlayout import NO_LIMIT


# -- the link model (netmodel/links.py, LinkModel: the same rules, in the same order of operations,
# so that both engines give the same figures bit for bit) ----------------------------------------
@njit(cache=True, inline="always")
def _finish(lbw, lwp, lwns, lwf, links, size, start):
    """LinkModel.finish_ns: when ``size`` bytes put on ``links`` at ``start`` have left the slowest
    of them, the pace piecewise constant between the edges of the links' slow-link windows."""
    t = start
    left = np.float64(size)
    while True:
        rate = np.inf
        edge = NO_LIMIT
        for link in links:
            f = 1.0
            for w in range(lwp[link], lwp[link + 1]):
                w_start, w_end = lwns[w, 0], lwns[w, 1]
                if w_start <= t < w_end:
                    f *= lwf[w]
                    if w_end < edge:
                        edge = w_end
                elif t < w_start < edge:
                    edge = w_start
            r = lbw[link] * f
            if r < rate:
                rate = r
        if edge >= NO_LIMIT or (edge - t) * rate >= left:
            return t + np.int64(-((-left) // rate))
        left -= (edge - t) * rate
        t = edge


@njit(cache=True, inline="always")
def _windowed(lwp, links):
    """Whether a link of ``links`` has slow-link windows (LinkModel.side_ns's test)."""
    if lwp[lwp.shape[0] - 1] == 0:
        return False
    for link in links:
        if lwp[link + 1] > lwp[link]:
            return True
    return False


@njit(cache=True, inline="always")
def _reserve(lfree, lstat, lbw, lwp, lwns, lwf, rt, rid, first, count, size, start, arrival):
    wait = start - arrival
    windows = lwp[lwp.shape[0] - 1] > 0
    for j in range(count):
        link = rt[rid, first + j]
        if windows and lwp[link + 1] > lwp[link]:
            dur = _finish(lbw, lwp, lwns, lwf, rt[rid, first + j : first + j + 1], size, start) - start
        else:
            dur = np.int64(-((-size) // lbw[link]))
        lfree[link] = start + dur
        lstat[0, link] += size
        lstat[1, link] += dur
        lstat[2, link] += 1
        if wait > lstat[3, link]:
            lstat[3, link] = wait


@njit(cache=True, inline="always")
def _queued(lstat, blocker, wait):
    """Queueing delay: a message that waited ``wait`` ns for a busy link is charged to the link
    whose free time set its start (the latest free of its route's links), once per route side."""
    if blocker >= 0:
        lstat[4, blocker] += wait
        lstat[5, blocker] += 1
