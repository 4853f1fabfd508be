"""Rounds that the shards run among themselves, over a connection between every pair of shards.

    emulator run configs/runs/megatron-1t-3072gpu.yaml --backend ray --shards 2     # engine.ray_rounds: direct

With ordinary actor calls every round goes shard -> driver -> shard: a task submission, a scheduling
decision and an object-store result per busy shard, 1.3-2 ms a round on two cores. Here each shard
keeps its own copy of the protocol's state (``emulator.engine.coordinator.Rounds``) and, after each
round, sends every other shard one frame over a TCP connection: its reply to the round (next event
time, output bound, for every destination the count and earliest time of the records it sends) and
the records routed to that shard. Every copy receives the same replies and applies them in shard
order, so every shard computes the same horizons and the same work for the next round as the driver
would: the rounds, and the results, are those of the other transports, bit for bit. A shard waiting
for its peers sleeps in ``select`` (no spinning), so the driver and the shards can share two cores.

The driver only starts the rounds and hears from the shards every so often (live figures, Ctrl-C):
shard 0 sets a *pause* flag in its frame once the call's wall budget is spent, and every shard stops
after that same round. A shard whose round raised (OOM, a program error) flags it; every shard stops
after that round and the driver raises the first of their errors in event order, as the other
transports do (emulator/engine/coordinator.py first_error: every shard finished the round, up to
its own first error). A
peer whose connection closes (its process died) or that is aborted by the driver (a frozen host,
Ctrl-C) ends the shard's loop with a status the driver turns into the lost shard's one-line error.

Nothing here imports Ray: the loop runs as well in threads of one process (the tests do that).
"""

from __future__ import annotations

import select
import socket
import struct
import time

import msgpack

from emulator.engine.coordinator import Rounds
from emulator.errors import BackendError

_LENGTH = struct.Struct("!Q")  # a frame: its length, then the msgpack of (header, payload)
_HELLO = struct.Struct("!I")  # a new connection's first bytes: the connecting shard's index
_RECV_BYTES = 1 << 20

# frame flags
WORKED, IDLE, ERROR, PAUSE = 1, 2, 4, 8


class PeerLost(Exception):
    """A peer's connection closed (its process died, or this mesh was aborted)."""

    def __init__(self, peer: int):
        super().__init__(f"connection to shard {peer} closed")
        self.peer = peer


class Mesh:
    """One TCP connection to every other shard; one all-to-all exchange of frames per round."""

    def __init__(self, index: int, shards: int, host: str):
        self.index, self.shards = index, shards
        self.listener = socket.create_server((host, 0), backlog=max(1, shards))
        self.address = (host, self.listener.getsockname()[1])
        self.peers: dict[int, socket.socket] = {}
        self.pending: dict[int, bytearray] = {}  # bytes received beyond the frame of the current round
        self.aborted = False

    def connect(self, addresses: list[tuple[str, int]], timeout_s: float) -> None:
        """Connect to the lower-numbered shards, accept the higher ones (connects complete in the
        listeners' backlog, so every shard can do both at once)."""
        for j in range(self.index):
            host, port = addresses[j]
            try:
                sock = socket.create_connection((host, port), timeout=timeout_s)
                sock.sendall(_HELLO.pack(self.index))
            except OSError as exc:
                raise BackendError(
                    f"shard {self.index} cannot connect to shard {j} at {host}:{port} ({exc.strerror or exc}): the "
                    "shards' hosts must reach each other on any TCP port, or use --set engine.ray_rounds=calls"
                ) from None
            self.peers[j] = sock
        self.listener.settimeout(timeout_s)
        while len(self.peers) < self.shards - 1:
            try:
                sock, _ = self.listener.accept()
                sock.settimeout(timeout_s)
                self.peers[_HELLO.unpack(_recv_exact(sock, _HELLO.size))[0]] = sock
            except OSError as exc:
                missing = sorted(set(range(self.index + 1, self.shards)) - set(self.peers))
                host, port = self.address
                raise BackendError(
                    f"shard {self.index} at {host}:{port} heard from no shard of {missing} within "
                    f"{timeout_s:.0f} s ({exc}): the shards' hosts must reach each other on any TCP port, or use "
                    "--set engine.ray_rounds=calls"
                ) from None
        self.listener.close()
        for sock in self.peers.values():
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # frames are small and awaited
            sock.setblocking(False)
        self.pending = {j: bytearray() for j in self.peers}

    def exchange(self, frames: dict[int, bytes]) -> dict[int, bytes]:
        """Send ``frames[j]`` to every peer j and receive one frame from each (both at once, so that
        two large frames crossing never wait on each other)."""
        out = {j: memoryview(_LENGTH.pack(len(f)) + f) for j, f in frames.items()}
        for j in list(out):
            out[j] = self._send(j, out[j])
            if not out[j]:
                del out[j]
        got: dict[int, bytes] = {}
        for j in self.peers:
            frame = self._frame(j)
            if frame is not None:
                got[j] = frame
        while out or len(got) < len(self.peers):
            readable, writable, _ = select.select([self.peers[j] for j in self.peers if j not in got],
                                                  [self.peers[j] for j in out], [])  # fmt: skip
            for j in [j for j in out if self.peers[j] in writable]:
                out[j] = self._send(j, out[j])
                if not out[j]:
                    del out[j]
            for j in [j for j in self.peers if j not in got and self.peers[j] in readable]:
                try:
                    data = self.peers[j].recv(_RECV_BYTES)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    raise PeerLost(j)
                self.pending[j] += data
                frame = self._frame(j)
                if frame is not None:
                    got[j] = frame
        return got

    def _send(self, j: int, view: memoryview) -> memoryview:
        try:
            sent = self.peers[j].send(view)
        except BlockingIOError:
            return view
        except OSError:
            raise PeerLost(j) from None
        return view[sent:]

    def _frame(self, j: int) -> bytes | None:
        buf = self.pending[j]
        if len(buf) < _LENGTH.size:
            return None
        size = _LENGTH.unpack_from(buf)[0]
        end = _LENGTH.size + size
        if len(buf) < end:
            return None
        frame = bytes(buf[_LENGTH.size : end])
        del buf[:end]
        return frame

    def abort(self) -> None:
        """Wake a shard blocked in :meth:`exchange` (from another thread): its loop ends."""
        self.aborted = True
        for sock in list(self.peers.values()):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        for sock in [self.listener, *self.peers.values()]:
            try:
                sock.close()
            except OSError:
                pass


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("peer closed the connection during the handshake")
        data += chunk
    return data


class PeerRounds:
    """One shard's side of the rounds: its copy of the protocol's state, its last reply not yet
    exchanged, and the loop of :meth:`run`.

    ``encode`` / ``decode`` turn one destination's records into bytes and back
    (``actors/shard_actor.py``); ``shard`` is the engine's ``Shard``.
    """

    def __init__(self, shard, index: int, shards: int, mesh: Mesh, lookahead_ns: float, encode, decode):
        self.shard, self.index, self.mesh = shard, index, mesh
        self.encode, self.decode = encode, decode
        self.rounds = Rounds(shards, lookahead_ns)
        self.unsent: tuple | None = None  # (flags, reply or None, a round's?) not yet exchanged
        self.error: BaseException | None = None

    def begin(self, reply: tuple) -> None:
        """The shard's reply to its start: exchanged first thing in :meth:`run`."""
        self.unsent = (WORKED, reply, False)

    def run(self, budget_s: float) -> dict:
        """Rounds until the run ends, a shard flags an error, or shard 0's ``budget_s`` is spent.

        Returns ``{"status": done|paused|stopped|peer_lost, "counters": RoundStats.counters(),
        "peer": the peer lost or None}``;
        raises this shard's own error when the rounds stopped for it.
        """
        stats = self.rounds.stats
        called = time.monotonic()
        last = time.perf_counter()
        status, peer = "done", None
        try:
            while True:
                if self.unsent is not None:
                    pause = self.index == 0 and time.monotonic() - called >= budget_s
                    a_round = self.unsent[2]  # not the exchange of the start's replies
                    flags = self._exchange(pause)
                    now = time.perf_counter()
                    if flags & ERROR:
                        status = "stopped"
                        break
                    if a_round:
                        stats.rounds += 1
                        stats.overhead_s += now - last - self._busiest
                        stats.critical_s += self._busiest
                    last = now
                    if flags & PAUSE:
                        status = "paused"
                        break
                work = self.rounds.plan()
                if work is None:
                    break
                mine = work.get(self.index)
                if mine is None:
                    self.unsent = (IDLE, None, True)
                    continue
                horizon, inbound = mine
                try:
                    self.unsent = (WORKED, self.shard.step(horizon, [self.decode(b) for b in inbound]), True)
                except Exception as exc:  # the run's own errors (OOM, program errors) and bugs alike
                    self.error, self.unsent = exc, (ERROR, None, True)
        except PeerLost as exc:
            status, peer = "peer_lost", exc.peer
        if self.error is not None:
            raise self.error
        return {"status": status, "counters": self.counters(), "peer": peer}

    def counters(self) -> tuple:
        """The protocol's counters so far (``RoundStats.counters``)."""
        return self.rounds.stats.counters()

    def _exchange(self, pause: bool) -> int:
        """Send this shard's reply to every peer, take theirs, apply all of them to the state;
        returns the union of every shard's flags."""
        flags, reply, _ = self.unsent
        self.unsent = None
        if pause:
            flags |= PAUSE
        if reply is None:
            header, payloads, busy = (flags,), {}, 0.0
        else:
            next_time, bound, out, busy = reply
            sends = [(dst, len(recs), min(r[0] for r in recs)) for dst, recs in sorted(out.items()) if recs]
            header = (flags, next_time, bound, busy, sends)
            payloads = {dst: self.encode(recs) for dst, recs in out.items() if recs}
        head = msgpack.packb(header)
        frames = {j: msgpack.packb((head, payloads.get(j))) for j in self.mesh.peers}
        received = self.mesh.exchange(frames)
        replies, seen, self._busiest = {}, flags, busy
        if reply is not None:
            replies[self.index] = (next_time, bound, {dst: (count, earliest, None) for dst, count, earliest in sends})
        for j, frame in received.items():
            head_j, payload = msgpack.unpackb(frame)
            header_j = msgpack.unpackb(head_j)
            seen |= header_j[0]
            if header_j[0] & WORKED:
                _, next_j, bound_j, busy_j, sends_j = header_j
                self._busiest = max(self._busiest, busy_j)
                replies[j] = (next_j, bound_j, {dst: (count, earliest, payload if dst == self.index else None)
                                                for dst, count, earliest in sends_j})  # fmt: skip
        if not seen & ERROR:
            self.rounds.receive(replies)
        return seen
