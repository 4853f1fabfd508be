"""The recorder of a captured rank: its stream of records, its GPU memory, its async handles, the
script lines, and the stand-in for the rank identity the script reads (:class:`RankValue`).

Part of the capture (emulator/capture/rank.py runs it; the capture modules are the only ones of the
project that import torch).
"""

from __future__ import annotations

import gc
import json
import numbers
import operator
import os
import sys

import numpy
from torch.multiprocessing.reductions import StorageWeakRef

from emulator.capture.identity import BINARY, ENV, UNARY


class CaptureError(Exception):
    """The script cannot be captured (it raised, or asked for what capture cannot give)."""


class Recorder:
    """The rank's stream of records and its memory, handles and frames."""

    def __init__(self, script: str, rank: int, world: int, capacity_bytes: int):
        self.script = os.path.realpath(script)
        self.rank, self.world = rank, world
        self.capacity_bytes = capacity_bytes
        self.ops: list = []
        self.frames: list[str] = []
        self._frame_ids: dict[str, int] = {}
        self.groups: list[tuple[int, ...]] = []
        self._group_ids: dict[tuple[int, ...], int] = {}
        self.device_storages: dict[int, tuple] = {}  # storage cdata -> (weakref, bytes, id) on the GPU
        self.live_bytes = 0
        self.peak_bytes = 0
        self._next_id = 0
        self.pending: dict[int, tuple] = {}  # storage cdata -> (weak ref, async handle not yet waited for)
        self.open_handles: set[int] = set()
        self.force_device = 0  # > 0 while a call that asked for the GPU runs
        self.blocking_p2p = 0  # > 0 inside dist.send / dist.recv (blocking point-to-point)
        self.iterations = 0
        self.stream = 0  # the current CUDA stream (0: the default one, where compute runs)
        self.streams = 0  # streams created so far
        # the script's uses of its rank identity (emulator/capture/identity.py): [expression, answer]
        self.predicates: list = []
        self._predicate_keys: set[str] = set()
        self.folder = os.path.dirname(self.script) + os.sep
        self.exact = False  # identity reads return plain values (each read recorded exactly)

    def is_script_file(self, filename: str) -> bool:
        """Whether code of ``filename`` is the script's own (a file of its folder, not a package
        installed there)."""
        return filename.startswith(self.folder) and "site-packages" not in filename

    def script_calling(self, depth: int) -> bool:
        """Whether the caller ``depth`` frames up is the script's own code."""
        f = sys._getframe(depth + 1)
        return f is not None and self.is_script_file(f.f_code.co_filename)

    def predicate(self, expr, answer) -> None:
        key = json.dumps([expr, answer], separators=(",", ":"))
        if key not in self._predicate_keys:
            self._predicate_keys.add(key)
            self.predicates.append([expr, answer])

    def identity(self, expr, value):
        """What an identity read by the script returns: a RankValue (plain, and recorded exactly,
        in exact mode)."""
        if self.exact:
            self.predicate(expr, value)
            return value
        return RankValue(expr, value, self)

    # -- frames -------------------------------------------------------------------------------
    def frame(self) -> int:
        """The innermost line of the user's script on the Python stack (-1: none)."""
        f = sys._getframe(2)
        while f is not None:
            if f.f_code.co_filename == self.script:
                where = f"{os.path.basename(self.script)}:{f.f_lineno}"
                found = self._frame_ids.get(where)
                if found is None:
                    found = self._frame_ids[where] = len(self.frames)
                    self.frames.append(where)
                return found
            f = f.f_back
        return -1

    def group_id(self, ranks) -> int:
        ranks = tuple(int(r) for r in ranks)
        found = self._group_ids.get(ranks)
        if found is None:
            found = self._group_ids[ranks] = len(self.groups)
            self.groups.append(ranks)
        return found

    # -- memory -------------------------------------------------------------------------------
    def on_device(self, storage) -> bool:
        return StorageWeakRef(storage).cdata in self.device_storages

    def track(self, storage, frame: int) -> None:
        """A storage now lives on the GPU (allocated, or moved there)."""
        ref = StorageWeakRef(storage)
        if ref.cdata in self.device_storages:
            return
        size = int(storage.nbytes())
        self._next_id += 1
        self.device_storages[ref.cdata] = (ref, size, self._next_id)
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        self.ops.append(("A", self._next_id, size, frame))

    def sweep(self) -> None:
        """Free the GPU storages no tensor holds any more."""
        dead = [cdata for cdata, (ref, _, _) in self.device_storages.items() if ref.expired()]
        for cdata in dead:
            _, size, block = self.device_storages.pop(cdata)
            self.live_bytes -= size
            self.ops.append(("F", block))
            self.pending.pop(cdata, None)

    # -- handles ------------------------------------------------------------------------------
    def new_handle(self) -> int:
        self._next_id += 1
        self.open_handles.add(self._next_id)
        return self._next_id

    def wait_for(self, storages, frame: int) -> None:
        """Wait for the async handles whose tensors are about to be used."""
        for _, storage in storages:
            entry = self.pending.pop(StorageWeakRef(storage).cdata, None)
            if entry is None:
                continue
            ref, handle = entry
            if ref.expired():  # a storage that died while its collective ran: not this one
                continue
            if handle in self.open_handles:
                self.open_handles.discard(handle)
                self.ops.append(("W", handle, frame, self.stream))

    def wait_all(self, frame: int) -> None:
        for handle in sorted(self.open_handles):
            self.ops.append(("W", handle, frame, 0))
        self.open_handles.clear()
        self.pending.clear()

    def mark_iteration(self) -> None:
        frame = self.frame()
        self.wait_all(frame)
        gc.collect()  # tensors in reference cycles, at a point that is the same on every rank
        self.sweep()
        self.ops.append(("I", frame))
        self.iterations += 1

    def dump(self) -> dict:
        return {"rank": self.rank, "world_size": self.world, "ops": self.ops, "frames": self.frames,
                "groups": [list(g) for g in self.groups], "peak_bytes": self.peak_bytes,
                "iterations": self.iterations, "predicates": self.predicates, "exact_identity": self.exact}  # fmt: skip


def _rank_value_ops(cls):
    """RankValue's operators: arithmetic stays an expression, a comparison records its answer."""
    compare = {"eq", "ne", "lt", "le", "gt", "ge"}
    for name in BINARY:
        if name == "item":
            continue

        def forward(self, other, _name=name):
            return self._binary(_name, self, other)

        def backward(self, other, _name=name):
            return self._binary(_name, other, self)

        setattr(cls, f"__{name}__", forward)  # BINARY's names are the dunders' ("and": __and__)
        if name not in compare:
            setattr(cls, f"__r{name}__", backward)
    for name in ("neg", "pos", "abs", "invert"):
        setattr(cls, f"__{name}__", lambda self, _name=name: self._derived([_name, self.expr],
                                                                           UNARY[_name](self.value)))
    return cls


@_rank_value_ops
class RankValue:
    """A rank identity the script read (emulator/capture/identity.py): behaves as its number, and
    records how the script uses it. Not an ``int`` subclass on purpose: CPython reads an int
    subclass's value directly where it indexes, sizes or loops, unseen; this one answers those
    through ``__index__``, which records the exact value."""

    __slots__ = ("expr", "value", "rec")

    def __init__(self, expr, value, rec: Recorder):
        self.expr, self.value, self.rec = expr, value, rec

    def _derived(self, expr, value):
        return RankValue(expr, value, self.rec) if isinstance(value, (int, float)) else value

    def _binary(self, name, a, b):
        def parts(x):
            if isinstance(x, RankValue):
                return x.expr, x.value
            if isinstance(x, (bool, int, float)):
                return ["const", x], x
            return None, None

        (ea, va), (eb, vb) = parts(a), parts(b)
        if ea is None or eb is None:
            return NotImplemented
        value = BINARY[name](va, vb)
        expr = [name, ea, eb]
        if isinstance(value, bool):  # a comparison: its answer is what the script decides on
            self.rec.predicate(expr, value)
            return value
        if name == "divmod":
            return tuple(self._derived(["item", expr, ["const", i]], v) for i, v in enumerate(value))
        return self._derived(expr, value)

    def exact(self):
        self.rec.predicate(self.expr, self.value)
        return self.value

    def __bool__(self) -> bool:
        value = bool(self.value)
        self.rec.predicate(["bool", self.expr], value)
        return value

    def __index__(self) -> int:
        return int(self.exact())

    def __int__(self) -> int:
        return int(self.exact())

    def __float__(self) -> float:
        return float(self.exact())

    def __hash__(self) -> int:
        return hash(self.exact())

    def __str__(self) -> str:
        return str(self.exact())

    def __repr__(self) -> str:
        return repr(self.exact())

    def __format__(self, spec: str) -> str:
        return format(self.exact(), spec)

    def __round__(self, ndigits=None):
        return round(self.exact(), ndigits)

    def __trunc__(self):
        return int(self.exact())


numbers.Integral.register(RankValue)  # ``isinstance(rank, numbers.Integral)`` as for an int


class EnvText:
    """The text of an environment variable naming the rank (``LOCAL_RANK``, ``RANK``... of
    identity.ENV), read by the script's code. Converted by the script's ``int(...)``
    (:class:`ScriptInt`) it becomes the identity's RankValue with nothing recorded yet; any other
    use records the exact text and acts on it. Not a ``str`` subclass on purpose: C code reads a
    str subclass's characters directly, unseen; a C function that wants a str raises on this one,
    and the rank is captured again with plain values (the script tripped on the stand-in)."""

    __slots__ = ("key", "text", "rec")

    def __init__(self, key: str, text: str, rec: Recorder):
        self.key, self.text, self.rec = key, text, rec

    def exact(self) -> str:
        self.rec.predicate(["env", self.key], self.text)
        return self.text

    def as_rank(self) -> RankValue:
        """``int(text)``: the identity itself (identity.ENV names which)."""
        return RankValue([ENV[self.key]], int(self.text), self.rec)

    def __bool__(self) -> bool:
        value = bool(self.text)
        self.rec.predicate(["bool", ["env", self.key]], value)
        return value

    def __getattr__(self, name: str):  # str's methods (split, isdigit...): on the exact text
        return getattr(self.exact(), name)

    def __str__(self) -> str:
        return self.exact()

    def __repr__(self) -> str:
        return repr(self.exact())

    def __format__(self, spec: str) -> str:
        return format(self.exact(), spec)

    def __hash__(self) -> int:
        return hash(self.exact())

    def __int__(self) -> int:  # the builtin int (in a module of the script's folder): exact
        return int(self.exact())

    def __float__(self) -> float:
        return float(self.exact())

    def __len__(self) -> int:
        return len(self.exact())

    def __iter__(self):
        return iter(self.exact())

    def __getitem__(self, index):
        return self.exact()[index]

    def __contains__(self, part) -> bool:
        return part in self.exact()

    def __fspath__(self) -> str:
        return self.exact()


def _env_text_ops(cls):
    """EnvText's comparisons and string operators: on the exact text."""
    for name in ("eq", "ne", "lt", "le", "gt", "ge", "add", "mul", "mod"):

        def forward(self, other, _name=name):
            other = other.exact() if isinstance(other, EnvText) else other
            return getattr(self.exact(), f"__{_name}__")(other)

        setattr(cls, f"__{name}__", forward)
    for name in ("add", "mul"):

        def backward(self, other, _name=name):
            return getattr(operator, _name)(other, self.exact())

        setattr(cls, f"__r{name}__", backward)
    return cls


_env_text_ops(EnvText)


class _ScriptIntType(type):
    """``int(...)`` in the script's code: the identity stays a stand-in; otherwise the builtin."""

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs:
            (value,) = args
            if isinstance(value, EnvText):
                return value.as_rank()
            if isinstance(value, RankValue):
                return value._derived(["int", value.expr], int(value.value))
        return int(*args, **kwargs)

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, int) or (isinstance(obj, RankValue) and isinstance(obj.value, int))

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, int)


class ScriptInt(int, metaclass=_ScriptIntType):
    """The name ``int`` in the script's globals under capture (emulator/capture/rank.py): what the
    script converts to an int from its identity (``int(os.environ["LOCAL_RANK"])``) stays a
    :class:`RankValue`; every other call is the builtin's. ``isinstance(x, int)`` answers as for the
    builtin, and for a RankValue holding an int. numpy takes it for ``int`` as a dtype (its
    ``dtype``); torch does not (``torch.zeros(n, dtype=int)`` raises: the rank is captured again
    with plain values, where ``int`` is the builtin)."""

    dtype = numpy.dtype(int)
