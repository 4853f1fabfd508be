"""Per-link and per-tier traffic accounting of one shard (merged across shards at the end).

The per-link totals are the link model's (netmodel/links.py), which adds to them as messages occupy
links; this class adds the closed-form path's and the compiled core's shares, and keeps the
per-tier figures, size histograms and the traffic timeline.
"""

from __future__ import annotations

from netmodel.links import LinkModel


class ShardStats:
    """Bytes, busy time, message counts and queueing per link; bytes and size histogram per tier."""

    __slots__ = ("links", "link_bytes", "link_busy_ns", "link_messages", "link_max_wait_ns", "tier_bytes",
                 "tier_messages", "size_hist", "kind_hist", "timeline", "bucket_ns", "closed_accounts",
                 "core", "ops_core")  # fmt: skip

    def __init__(self, topo, bucket_ns: int = 1_000_000, links: LinkModel | None = None):
        self.links = links if links is not None else LinkModel(topo)
        self.link_bytes = self.links.bytes
        self.link_busy_ns = self.links.busy_ns
        self.link_messages = self.links.messages
        self.link_max_wait_ns = self.links.max_wait_ns
        tiers = len(topo.tier_names)
        self.tier_bytes = [0] * tiers
        self.tier_messages = [0] * tiers
        # message-size histogram per tier: bucket b holds sizes in (2^(b-1), 2^b]; bucket 0 is 0 B
        self.size_hist: list[dict[int, int]] = [{} for _ in range(tiers)]
        # the same per operation kind ("all_reduce", "send", ...), all tiers together
        self.kind_hist: dict[str, dict[int, int]] = {}
        # bytes sent per tier per time bucket of ``bucket_ns`` (utilisation over virtual time)
        self.bucket_ns = bucket_ns
        self.timeline: list[dict[int, int]] = [{} for _ in range(tiers)]
        # the intra-node closed form's calls, per plan (CollectiveExecution._closed_plan): see closed_account
        self.closed_accounts: list[tuple] = []
        self.core = None  # the shard's NetCore, whose own accounting flush() adds here
        self.ops_core = None  # the shard's compiled per-op engine (opcore.py), likewise

    def closed_account(self, tx: tuple, rx: tuple, per: int, msg_bytes: int, busy_ns: int, messages: int,
                       kind: str) -> list[int]:  # fmt: skip
        """The accumulator of one closed-form plan: every call of it puts ``per`` messages of
        ``msg_bytes`` on each of its ports ``tx`` and ``rx`` (each busy ``busy_ns``) and ``messages``
        on the scale-up tier. The same plan runs thousands of times with the same figures, so a call
        only counts itself and its wait (``acc[0] += 1``, ``acc[1] = max(acc[1], wait)``, see
        CollectiveExecution._rendezvous); :meth:`flush` adds ``calls x`` each figure to the per-link,
        per-tier and histogram totals (before anything reads them). Only the traffic timeline depends
        on the call's time: the caller adds it (:meth:`timeline_add`)."""
        acc = [0, 0]
        bucket = (msg_bytes - 1).bit_length() if msg_bytes > 0 else 0
        self.closed_accounts.append((tx, rx, per, msg_bytes, busy_ns, messages, bucket, kind, acc))
        return acc

    def flush(self) -> None:
        if self.core is not None:
            self.core.flush()
        if self.ops_core is not None:
            self.ops_core.flush()
        for tx, rx, per, msg_bytes, busy, messages, bucket, kind, acc in self.closed_accounts:
            calls, wait = acc
            if not calls:
                continue
            acc[0] = acc[1] = 0
            for links in (tx, rx):
                for link in links:
                    self.link_bytes[link] += calls * per * msg_bytes
                    self.link_busy_ns[link] += calls * busy
                    self.link_messages[link] += calls * per
                    if wait > self.link_max_wait_ns[link]:
                        self.link_max_wait_ns[link] = wait
            count = calls * messages
            self.tier_bytes[0] += msg_bytes * count
            self.tier_messages[0] += count
            hist = self.size_hist[0]
            hist[bucket] = hist.get(bucket, 0) + count
            hist = self.kind_hist.get(kind)
            if hist is None:
                hist = self.kind_hist[kind] = {}
            hist[bucket] = hist.get(bucket, 0) + count

    def messages(self, tier: int, size: int, kind: str, t: int, count: int, t_end: int = 0) -> None:
        """Account ``count`` messages of ``size`` bytes sent on ``tier`` from ``t``; their bytes go to
        the time buckets of ``[t, t_end)`` (all to the bucket of ``t`` when ``t_end`` is not later)."""
        self.tier_bytes[tier] += size * count
        self.tier_messages[tier] += count
        bucket = (size - 1).bit_length() if size > 0 else 0
        hist = self.size_hist[tier]
        hist[bucket] = hist.get(bucket, 0) + count
        hist = self.kind_hist.get(kind)
        if hist is None:
            hist = self.kind_hist[kind] = {}
        hist[bucket] = hist.get(bucket, 0) + count
        self.timeline_add(tier, size, count, t, t_end)

    def timeline_add(self, tier: int, size: int, count: int, t: int, t_end: int) -> None:
        """Add ``count`` messages of ``size`` bytes serialised over ``[t, t_end)`` to the timeline."""
        if size * count == 0:  # empty messages (barriers) add no bytes: no entry either (nor below)
            return
        line = self.timeline[tier]
        bucket_ns = self.bucket_ns
        slot = t // bucket_ns
        if t_end <= t or (t_end - 1) // bucket_ns == slot:
            line[slot] = line.get(slot, 0) + size * count
            return
        # a message longer than what is left of its bucket: spread its bytes pro rata over the buckets
        # its serialisation spans, so that utilisation over time never exceeds what the links carried
        # (integer shares of the cumulative total: the bytes add up exactly; shares are those of one
        # message times ``count``, so that k calls of one message and one call of k agree exactly)
        done = 0
        for s in range(slot, (t_end - 1) // bucket_ns + 1):
            part = size * (min(t_end, (s + 1) * bucket_ns) - t) // (t_end - t) - done
            if part:  # a zero share (slow links, many buckets) adds no entry
                line[s] = line.get(s, 0) + part * count
            done += part

    def export(self, owned_links) -> dict:
        """Plain data for the owned links (each link is owned by exactly one shard)."""
        self.flush()
        return {
            "links": {
                i: (self.link_bytes[i], self.link_busy_ns[i], self.link_messages[i], self.link_max_wait_ns[i])
                for i in owned_links
                if self.link_messages[i]
            },  # fmt: skip
            "tier_bytes": list(self.tier_bytes),
            "tier_messages": list(self.tier_messages),
            "size_hist": [dict(h) for h in self.size_hist],
            "kind_hist": {k: dict(h) for k, h in self.kind_hist.items()},
            "timeline": [dict(t) for t in self.timeline],
            "bucket_ns": self.bucket_ns,
        }
