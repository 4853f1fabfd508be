"""The link model: how a message occupies links, when it has crossed them, and what each link did.

    emulator run configs/examples/data-parallel.yaml \
        --set 'faults.slow_link=[{nic: {node: 1}, factor: 0.25, start_s: 0.01}]'

Every link (netmodel/topology.py) is a FIFO server. A message put on the links of one side of its
route (the sender's *up* links at its send time, the receiver's *down* links at its hand-over)
starts when all of them are free; each link is then busy for the time its bandwidth needs for the
message's bytes, and the message's tail has left when the slowest of them has carried it
(cut-through). Delivery is ``max(end_up + latency, start_down + the down side's time)``.

A link's bandwidth is its nominal one times the factors of the run's degraded links
(``faults.slow_link``): whole-run factors are folded into ``Topology.link_bw`` once (every user of
the topology sees them: both collective engines, the intra-node closed form, the lookahead,
links.csv); a factor with a time window ``[start_s, end_s)`` applies to the bytes a link carries
while the window is open, so a transfer across a window edge is paced piecewise (see
:meth:`LinkModel.finish_ns`). A link that is down (``faults.fail``) loses every message whose route
holds it when it is sent, or that it has not delivered when it goes down.

This module is the one place these rules live. :class:`LinkModel` is their implementation for the
shard's Python paths (point-to-point messages, the reference collective engine, the intra-node
closed form); the compiled collective engine implements the same functions over the same arrays
(:meth:`LinkModel.arrays`) in emulator/engine/netlinks.py (numba caches a kernel against its own
file only, so its code cannot be imported from here), and tests/netmodel/test_links.py checks the
two agree bit for bit. Both read and write one buffer of link free times, so a shard's messages see
one FIFO per link whichever path sent them.

Windows only ever lower a bandwidth (factors are at most 1), so a bound computed with
``Topology.link_bw`` (emulator/engine/lookahead.py) stays a lower bound on every transfer time.
"""

from __future__ import annotations

import array
import math

import numpy as np

from netmodel.errors import ConfigError
from netmodel.limits import MIN_LINK_BYTES_PER_NS

NO_END_NS = 1 << 62  # a window without end_s; the compiled kernels' "no limit" (netkernels.NO_LIMIT)


def resolve_slow_links(topo, faults: list) -> None:
    """Apply ``faults.slow_link`` to ``topo``: entries without a window scale ``link_bw`` (their
    factors multiply); windowed ones are kept as ``link_windows`` (link -> ``(start_ns, end_ns,
    factor)``, config order). Each entry selects ``links`` by name, a ``nic`` (tx and rx) or a
    whole ``tier``; ``slow_links`` records what was applied (summary.json, the live figures) with
    ``target``, the name the entry gave (a tier, ``node1.nic0``, link names). A factor that could
    take a link below the slowest one the emulator allows is a ConfigError."""
    by_name = {name: i for i, name in enumerate(topo.link_name)} if faults else {}
    for index, fault in enumerate(faults):
        path = f"faults.slow_link[{index}]"
        if fault.links is not None:
            links = [by_name[name] for name in fault.links]  # names were checked against the cluster
            target = ",".join(fault.links)
        elif fault.nic is not None:
            node, nic = fault.nic.node, fault.nic.index
            links = [topo.nic_tx[node][nic], topo.nic_rx[node][nic]]
            target = f"node{node}.nic{nic}"
        else:
            target = fault.tier
            tiers = {k for k, name in enumerate(topo.tier_names) if name == fault.tier}
            if fault.tier in {g.scale_up.name for g in topo.groups}:
                tiers.add(0)  # every node group's scale-up fabric, whatever the first one's name
            links = [i for i, tier in enumerate(topo.link_tier) if tier in tiers]
        factor = fault.factor
        start_s, end_s = getattr(fault, "start_s", None), getattr(fault, "end_s", None)
        windowed = start_s is not None or end_s is not None
        topo.slow_links.append({"target": target, "links": links, "factor": factor, "start_s": start_s, "end_s": end_s})
        window = (round((start_s or 0.0) * 1e9), NO_END_NS if end_s is None else round(end_s * 1e9), factor)
        for link in links:
            if windowed:
                topo.link_windows.setdefault(link, []).append(window)
            else:
                topo.link_factor[link] = topo.link_factor.get(link, 1.0) * factor
                topo.link_bw[link] *= factor
            # the least the link can carry: every factor of it at once
            least = topo.link_bw[link] * math.prod(f for _, _, f in topo.link_windows.get(link, ()))
            if least < MIN_LINK_BYTES_PER_NS:
                raise ConfigError(
                    f"{path}.factor: {factor:g} takes {topo.link_name[link]} to {least * 1e9:.3g} B/s, below "
                    f"the slowest link the emulator allows ({MIN_LINK_BYTES_PER_NS * 1e9:.3g} B/s, netmodel/limits.py)"
                )


class LinkModel:
    """One shard's links: free times, bandwidths and windows, which are down, and per-link totals.

    ``down_ns``: link -> the virtual time it goes down (``faults.fail``, emulator/engine/faults.py).
    Accounting per link: ``bytes``, ``busy_ns``, ``messages``, ``max_wait_ns`` (the longest a
    message waited for the link's side of its route) and, for live figures only, ``queued_ns`` /
    ``queued_messages`` charged to the link that held a message back (the one free last)."""

    def __init__(self, topo, down_ns: dict[int, int] | None = None):
        n = len(topo.link_bw)
        self.bw = topo.link_bw  # bytes per ns, whole-run factors included
        self.windows: dict[int, list] = getattr(topo, "link_windows", {})
        self.down_ns = down_ns or {}
        # free times: one buffer, seen by Python as array.array (whose indexing costs a quarter of
        # numpy's element access) and by the compiled kernels as numpy
        self.free_py = array.array("q", bytes(8 * n))
        self.free = np.frombuffer(self.free_py, dtype=np.int64)
        self.bytes = [0] * n
        self.busy_ns = [0] * n
        self.messages = [0] * n
        self.max_wait_ns = [0] * n
        self.queued_ns = [0] * n
        self.queued_messages = [0] * n

    def arrays(self) -> tuple[np.ndarray, ...]:
        """``(bandwidth, free, window_ptr, window_ns, window_factor)`` for the compiled kernels:
        link ``l``'s windows are rows ``window_ptr[l]:window_ptr[l + 1]`` of ``window_ns``
        (start, end) and ``window_factor``, in config order."""
        n = len(self.bw)
        ptr = np.zeros(n + 1, np.int64)
        rows = []
        for link in range(n):
            rows += self.windows.get(link, ())
            ptr[link + 1] = len(rows)
        ns = np.array([(s, e) for s, e, _ in rows], np.int64).reshape(-1, 2)
        factor = np.array([f for _, _, f in rows], np.float64)
        return np.array(self.bw, np.float64), self.free, ptr, ns, factor

    # -- the rules --------------------------------------------------------------------------
    def finish_ns(self, links, size: int, start: int) -> int:
        """When ``size`` bytes put on ``links`` at ``start`` have left the slowest of them: at each
        moment the pace is the least of the links' bandwidths times the factors of their windows
        open then, piecewise constant between window edges."""
        bw, windows = self.bw, self.windows
        t = start
        left = float(size)
        while True:
            rate = math.inf
            edge = NO_END_NS
            for link in links:
                f = 1.0
                for w_start, w_end, factor in windows.get(link, ()):
                    if w_start <= t < w_end:
                        f *= factor
                        if w_end < edge:
                            edge = w_end
                    elif t < w_start < edge:
                        edge = w_start
                r = bw[link] * f
                if r < rate:
                    rate = r
            if edge >= NO_END_NS or (edge - t) * rate >= left:
                return t + int(-(-left // rate))
            left -= (edge - t) * rate
            t = edge

    def side_ns(self, links, side_bw: float, size: int, start: int) -> int:
        """:meth:`finish_ns` for one side of a route whose slowest whole-run bandwidth is ``side_bw``."""
        if self.windows and any(link in self.windows for link in links):
            return self.finish_ns(links, size, start)
        return start + int(-(-size // side_bw))

    def start_of(self, links, arrival: int) -> tuple[int, int]:
        """FIFO: when ``links`` are all free (not before ``arrival``), and the link free last (-1:
        none held the message back)."""
        free = self.free_py
        start = arrival
        blocker = -1
        for link in links:
            if free[link] > start:
                start = free[link]
                blocker = link
        return start, blocker

    def _occupy(self, links, size: int, start: int, arrival: int, blocker: int) -> None:
        """``size`` bytes on ``links`` from ``start``: each link is busy until it has carried them."""
        wait = start - arrival
        if blocker >= 0:
            self.queued_ns[blocker] += wait
            self.queued_messages[blocker] += 1
        free, bw, windows = self.free_py, self.bw, self.windows
        for link in links:
            if windows and link in windows:
                dur = self.finish_ns((link,), size, start) - start
            else:
                dur = int(-(-size // bw[link]))
            free[link] = start + dur
            self.bytes[link] += size
            self.busy_ns[link] += dur
            self.messages[link] += 1
            if wait > self.max_wait_ns[link]:
                self.max_wait_ns[link] = wait

    def hold(self, links, arrival: int, duration_ns: int, members: int) -> tuple[int, int] | None:
        """The intra-node closed form (netmodel/collectives/analytic.py): a group's ``links`` (its
        ports) held together for ``duration_ns`` from when all are free; ``(start, end)``, or None
        when one of them is down before the end (the call is lost). The bytes are accounted by the
        caller, per port set (ShardStats.ports). Each of the ``members`` waited for the port free
        last (live queueing figures)."""
        start, blocker = self.start_of(links, arrival)
        end = start + duration_ns
        if self.down_ns and self.down(links, end):
            return None
        if blocker >= 0:
            self.queued_ns[blocker] += (start - arrival) * members
            self.queued_messages[blocker] += members
        free = self.free_py
        for link in links:
            free[link] = end
        return start, end

    def send(self, route, size: int, t: int) -> tuple[int, int] | None:
        """Put a message on its route's up links at ``t``: ``(start, end_up)``, when its head and
        its tail leave; None when a link of the route is down at ``t`` (the message is lost)."""
        if self.down_ns and self.lost(route, t):
            return None
        up = route.up
        start, blocker = self.start_of(up, t)
        self._occupy(up, size, start, t, blocker)
        if self.windows:
            return start, self.side_ns(up, route.up_bw, size, start)
        return start, start + int(-(-size // route.up_bw))  # the common case, without a call

    def receive(self, route, size: int, t: int, end_up: int) -> int | None:
        """The message's hand-over at ``t`` to its route's down links: its delivery time, or None
        when a link of the route is down by then (lost; the down links are not occupied)."""
        start, blocker = self.start_of(route.down, t)
        if self.windows:
            end_down = self.side_ns(route.down, route.down_bw, size, start)
        else:
            end_down = start + int(-(-size // route.down_bw))
        delivery = max(end_up + route.latency_ns, end_down)
        if self.down_ns and self.lost(route, delivery):
            return None
        self._occupy(route.down, size, start, t, blocker)
        return delivery

    def lost(self, route, t: int) -> bool:
        """Whether a link of ``route`` is down at ``t``."""
        return self.down(route.up, t) or self.down(route.down, t)

    def down(self, links, t: int) -> bool:
        """Whether one of ``links`` is down at ``t``."""
        down_ns = self.down_ns
        for link in links:
            at = down_ns.get(link)
            if at is not None and at <= t:
                return True
        return False

    def slow_link_busy(self, topo, now_ns: int, scale: int = 1) -> list[list[int]]:
        """Per ``topo.slow_links`` entry, ``[busy_ns, nominal_ns]`` over its links so far: their busy
        time, and the time their bytes needed at the links' nominal bandwidth (no slow-link
        factor); the difference is the time the degradation cost those links. A link of several
        entries counts in each, except in a window that has not opened by ``now_ns`` (zeros).
        ``scale`` multiplies the links above the scale-up tier (the rails a folded run replicates
        at the end)."""
        out = []
        for entry in topo.slow_links:
            busy = nominal = 0.0
            if entry["start_s"] is not None and now_ns < round(entry["start_s"] * 1e9):
                out.append([0, 0])
                continue
            for link in entry["links"]:
                if self.messages[link]:
                    f = 1 if topo.link_tier[link] == 0 else scale
                    busy += self.busy_ns[link] * f
                    nominal += self.bytes[link] / (self.bw[link] / topo.link_factor.get(link, 1.0)) * f
            out.append([int(busy), round(nominal)])
        return out
