"""Capture one rank of a user's PyTorch training script: what its GPU would do, with no GPU and no data.

    python -m emulator.capture.rank SPEC.json      # what emulator/capture/torchrun.py runs per rank

The only module of the project that imports torch. The script runs unchanged in this process as
rank ``r`` of ``N``: ``init_process_group`` (whatever backend it asks for) becomes PyTorch's fake
process group (``init_process_group("fake", store=FakeStore(), ...)``: every collective returns at
once, moving nothing), every tensor is a fake tensor (``FakeTensorMode``: shapes, dtypes and
strides, no storage), and ``torch.cuda`` answers as a GPU of the cluster's type would.

The CPU build of torch cannot run autograd on tensors whose device is ``cuda`` (its device guard is
not linked in), so the pretend GPU is the fake CPU device: device arguments that name ``cuda`` are
rewritten to ``cpu``, and each storage carries a flag "on the GPU" (set by ``.to("cuda")``,
``.cuda()``, ``device="cuda"``, and passed from inputs to outputs), which is what counts for
memory and for the GPU's work. Host-side tensors (a batch built on the CPU) cost nothing.

A ``TorchDispatchMode`` sees every aten op with its shapes and records, in order:

- ``C`` compute: FLOPs (``torch.utils.flop_counter``'s formulas), bytes read and written (the
  distinct input and output storages), kind (matmul, attention, elementwise), precision (dtype);
- ``K`` collectives (c10d and functional): op, bytes (nccl-tests' convention), the process
  group's ranks, a handle; ``P`` sends and receives with peer, bytes, tag and handle;
- ``W`` waits: a blocking call waits at once; an async handle is waited for where its tensors are
  next used (what ``work.wait()`` or a stream dependency does on a GPU) or at the iteration's end;
- ``A``/``F`` allocations and frees of storages on the GPU (tensor lifetimes: the peak a real run
  would reach);
- ``I`` an iteration mark at every ``optimizer.step()`` (or ``emulator_mark_iteration()``).

Each record carries the line of the user's script that issued it (the innermost frame in that
file), so that the replay's errors name the script's file:line.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib
import importlib.abc
import importlib.util
import json
import numbers
import os
import runpy
import sys
import time
import traceback
import types

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily
from torch.multiprocessing.reductions import StorageWeakRef
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.overrides import TorchFunctionMode
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry

from emulator.capture.identity import BINARY, ENV, UNARY

aten = torch.ops.aten

# in-place random fills (weight initialisation): the values of fake tensors do not matter
RANDOM_INPLACE = {aten.uniform_.default, aten.normal_.default, aten.bernoulli_.float, aten.exponential_.default,
                  aten.random_.default}  # fmt: skip
ATTENTION = {"_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_efficient_attention_backward",
             "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_cudnn_attention_backward",
             "_flash_attention_forward", "_flash_attention_backward", "_efficient_attention_forward",
             "_efficient_attention_backward", "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_flash_attention_for_cpu_backward"}  # fmt: skip
# ops that only describe a tensor (no kernel on a GPU)
FREE_OPS = {"detach", "view", "_unsafe_view", "t", "transpose", "permute", "expand", "as_strided", "slice",
            "select", "unsqueeze", "squeeze", "alias", "split", "split_with_sizes", "chunk", "unbind",
            "_reshape_alias", "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
            "lift_fresh", "_to_copy_meta", "set_", "resize_", "clone_meta", "is_same_size", "_local_scalar_dense",
            "unflatten", "view_as", "reshape", "flatten", "narrow", "diagonal", "_has_compatible_shallow_copy_type",
            "record_stream", "_foreach_empty"}  # fmt: skip
# collectives: c10d op -> (emulator op, which argument holds the size, how)
C10D = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "allgather_": "all_gather",
    "_allgather_base_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "allgather_coalesced_": "all_gather", "reduce_scatter_": "reduce_scatter",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "broadcast_": "broadcast", "reduce_": "reduce", "alltoall_": "all_to_all", "alltoall_base_": "all_to_all",
    "barrier": "barrier", "gather_": "all_gather", "scatter_": "broadcast",
}  # fmt: skip
FUNCTIONAL = {
    "all_reduce": "all_reduce", "all_reduce_": "all_reduce", "all_reduce_coalesced": "all_reduce",
    "all_reduce_coalesced_": "all_reduce", "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all_single": "all_to_all", "broadcast": "broadcast", "broadcast_": "broadcast",
}  # fmt: skip

# imported before torch.cuda pretends to be there: the modules whose classes capture patches
PREIMPORT = ("torch.distributed.device_mesh", "torch.nn.parallel")
PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp32"}


class CaptureError(Exception):
    """The script cannot be captured (it raised, or asked for what capture cannot give)."""


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return False


def _storages(value) -> list:
    out = []
    for leaf in tree_flatten(value)[0]:
        if isinstance(leaf, torch.Tensor) and not is_traceable_wrapper_subclass(leaf):
            try:
                out.append((leaf, leaf.untyped_storage()))
            except (RuntimeError, NotImplementedError):  # a tensor subclass without one storage
                continue
    return out


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


def _group_ranks(pg) -> tuple[int, ...]:
    if isinstance(pg, str):
        pg = dist.distributed_c10d._resolve_process_group(pg)
    elif isinstance(pg, torch.ScriptObject):
        pg = dist.ProcessGroup.unbox(pg)
    return tuple(dist.get_process_group_ranks(pg))


def _arg(func, args, kwargs, name, default=None):
    for i, a in enumerate(func._schema.arguments):
        if a.name == name:
            if name in kwargs:
                return kwargs[name]
            return args[i] if i < len(args) else default
    return default


HOST_REAL_ELEMENTS = 1 << 16  # a host tensor up to this size is created for real (bigger ones are fake)


def _host_real(args, kwargs, inputs) -> bool:
    """Whether a host-side op runs on real tensors: its inputs are all real, or it creates a small
    tensor from sizes and scalars."""
    if inputs:
        return not any(isinstance(t, FakeTensor) for t, _ in inputs)
    numel = 1
    for leaf in tree_flatten((args, kwargs))[0]:
        if isinstance(leaf, (int, float)) and not isinstance(leaf, bool):
            numel *= max(1, abs(int(leaf)))
            if numel > HOST_REAL_ELEMENTS:
                return False
    return True


# the fake CPU device's fused attention stands for the GPU's flash kernel: FLOPs as
# torch.utils.flop_counter counts the GPU's (two GEMMs forward; backward five: the scores
# recomputed, dV, dP, dQ, dK), halved under a causal mask, whose blocks above the diagonal a fused
# kernel skips (FlashAttention-2, Dao 2023; emulator/workloads/layer_costs.py counts the same)
CPU_FLASH = {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward"}


def _cpu_flash_flops(base: str, args, kwargs) -> int:
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    if base.endswith("_backward"):
        grad_out, query, key, value = args[:4]
        causal = kwargs.get("is_causal", args[7] if len(args) > 7 else False)
        flops = sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)
    else:
        query, key, value = args[:3]
        causal = kwargs.get("is_causal", args[4] if len(args) > 4 else False)
        flops = sdpa_flop_count(query.shape, key.shape, value.shape)
    return int(flops // 2 if causal else flops)


def _nbytes(value) -> int:
    return sum(t.numel() * t.element_size() for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor))


class Dispatch(TorchDispatchMode):
    """Records every aten op a rank runs (above FakeTensorMode, so it sees the script's ops)."""

    def __init__(self, rec: Recorder):
        super().__init__()
        self.rec = rec

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        rec = self.rec
        name = func._schema.name
        namespace, _, short = name.partition("::")
        if func in RANDOM_INPLACE:
            return args[0]
        if func is aten._local_scalar_dense.default and isinstance(args[0], FakeTensor):
            # a value read on the host (loss.item() for a log line, a NaN check): fake tensors have
            # none; zero keeps such code on its usual path
            return False if args[0].dtype == torch.bool else 0 if not args[0].is_floating_point() else 0.0
        args, kwargs = tree_map(_cpu_device, (args, kwargs))
        if any(is_traceable_wrapper_subclass(t) for t in tree_flatten((args, kwargs))[0]):
            # a DTensor (or another wrapper): it dispatches the op again on its local tensors, which
            # is what the GPU runs (and what this mode then sees); its own global-shaped op is only
            # a description
            return NotImplemented
        inputs = _storages((args, kwargs))
        device = self._device_call(args, kwargs) or any(rec.on_device(s) for _, s in inputs)
        if not device and namespace == "aten" and _host_real(args, kwargs, inputs):
            # small host-side work (a device mesh's rank map, index tensors) runs for real: scripts and
            # libraries read its values
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if namespace in ("c10d", "_c10d_functional") and device is not None:
            return self._comm(func, namespace, short, args, kwargs, inputs)
        if device and _in_shape_propagation():
            device = False  # DTensor computing an op's output shape on empty tensors: no GPU work
        if namespace not in ("aten", "fsdp"):
            return func(*args, **kwargs)  # prim::device and the like: no kernel
        frame = rec.frame() if device else -1
        if device:
            rec.wait_for(inputs, frame)
        out = func(*args, **kwargs)
        if not device:
            return out
        outputs = _storages(out)
        seen = {StorageWeakRef(s).cdata for _, s in inputs}
        for _, storage in outputs:
            if StorageWeakRef(storage).cdata not in seen:
                rec.track(storage, frame)
        base = short.split(".")[0]
        if base in FREE_OPS or func.is_view:
            return out
        flops = 0
        packet = func.overloadpacket
        if base in CPU_FLASH:
            flops = _cpu_flash_flops(base, args, kwargs)
        elif packet in flop_registry:
            try:
                flops = int(flop_registry[packet](*args, **kwargs, out_val=out))
            except Exception:  # a formula that does not take this overload: count it as memory-bound
                flops = 0
        moved = {}
        for tensor, storage in inputs + outputs:
            moved[StorageWeakRef(storage).cdata] = tensor.numel() * tensor.element_size()
        nbytes = sum(moved.values())
        if flops == 0 and nbytes == 0:
            return out
        kind = "attention" if base in ATTENTION else "matmul" if flops else "elementwise"
        dtype = next((t.dtype for t, _ in outputs + inputs if t.is_floating_point()), torch.float32)
        rec.ops.append(("C", base, flops, nbytes, kind, PRECISION.get(dtype, "fp32"), frame, rec.stream))
        rec.sweep()
        return out

    def _device_call(self, args, kwargs) -> bool:
        return self.rec.force_device > 0

    def _comm(self, func, namespace, short, args, kwargs, inputs):
        rec = self.rec
        frame = rec.frame()
        rec.wait_for(inputs, frame)
        out = func(*args, **kwargs)
        if short == "wait_tensor":
            rec.wait_for(_storages(args), frame)
            return out
        if short in ("send", "recv_", "recv_any_source_"):
            group = _group_ranks(_arg(func, args, kwargs, "process_group"))
            peer = int(_arg(func, args, kwargs, "dst" if short == "send" else "src", 0))
            tag = int(_arg(func, args, kwargs, "tag", 0))
            handle = rec.new_handle()
            kind = "send" if short == "send" else "recv"
            rec.ops.append(("P", kind, group[peer], _nbytes(args[0]), tag, handle, frame, rec.stream))
            self._after(handle, args[0], frame, rec.blocking_p2p > 0)
            return out
        op = (C10D if namespace == "c10d" else FUNCTIONAL).get(short)
        if op is None:
            raise CaptureError(f"{rec.frames[frame] if frame >= 0 else 'the script'}: collective {namespace}.{short} "
                               f"is not supported by capture")  # fmt: skip
        if namespace == "c10d":
            pg = _arg(func, args, kwargs, "process_group")
            async_op = bool(_arg(func, args, kwargs, "async_op", True))
        else:
            pg = _arg(func, args, kwargs, "group_name")
            async_op = True
        ranks = _group_ranks(pg)
        size = self._size(op, short, args, kwargs, out)
        root = 0
        if op in ("broadcast", "reduce"):
            root_arg = _arg(func, args, kwargs, "root_rank", None)
            root = int(root_arg) if root_arg is not None else int(_arg(func, args, kwargs, "src", 0) or 0)
        handle = rec.new_handle()
        rec.ops.append(("K", op, size, rec.group_id(ranks), root, handle, frame, rec.stream))
        targets = out if namespace == "_c10d_functional" else (args[0], args[1] if op in ("all_gather",
                                                                "reduce_scatter", "all_to_all") else None)  # fmt: skip
        self._after(handle, targets, frame, not async_op)
        return out

    def _size(self, op, short, args, kwargs, out) -> int:
        """Bytes in nccl-tests' convention: the whole buffer; the gathered total; the send buffer."""
        if op == "barrier":
            return 0
        if op == "all_gather":
            if short in ("allgather_", "gather_"):
                return _nbytes(args[0])  # the output lists
            if short.startswith("all_gather_into_tensor") and not short.endswith("_out"):
                return _nbytes(out)
            return _nbytes(args[0])
        if op == "reduce_scatter":
            if short in ("reduce_scatter_",):
                return _nbytes(args[1])
            if short.startswith("reduce_scatter_tensor"):
                return _nbytes(args[0])
            return _nbytes(args[1])
        if op == "all_to_all" and short in ("alltoall_base_", "alltoall_"):
            return _nbytes(args[1])
        return _nbytes(args[0])

    def _after(self, handle, targets, frame, blocking: bool) -> None:
        rec = self.rec
        if blocking:
            rec.open_handles.discard(handle)
            rec.ops.append(("W", handle, frame, rec.stream))
            return
        for _, storage in _storages(targets):
            # the weak reference keeps the storage's address from being reused while it is pending
            ref = StorageWeakRef(storage)
            rec.pending[ref.cdata] = (ref, handle)


SHAPE_PROPAGATION = ("_sharding_prop.py", "_op_schema.py")


def _in_shape_propagation() -> bool:
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if name.endswith(SHAPE_PROPAGATION) and "distributed/tensor" in name:
            return True
        f = f.f_back
    return False


def _cpu_device(value):
    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("cpu")
    return value


class Devices(TorchFunctionMode):
    """The script's ``cuda`` becomes the fake CPU device, and what it puts there is on the GPU."""

    def __init__(self, rec: Recorder):
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func, types_, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        wants = False
        if func is torch.Tensor.cuda:
            return self._move(args[0], kwargs.get("dtype"))
        if func is torch.Tensor.to:
            target = kwargs.get("device")
            rest = []
            for a in args[1:]:
                if isinstance(a, (str, torch.device)):
                    target = a
                else:
                    rest.append(a)
            if _is_cuda(target):
                kwargs.pop("device", None)
                moved = self._move(args[0], None)
                if rest or kwargs:
                    moved = moved.to(*rest, **kwargs)
                return moved
            if isinstance(target, torch.device | str) and str(target).startswith("cpu") and self._on(args[0]):
                kwargs.pop("device", None)
                with _forced(self.rec, False):
                    return args[0].detach().clone() if not rest else args[0].to(*rest, **kwargs)
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
            wants = True
        if wants:
            with _forced(self.rec, True):
                return func(*args, **kwargs)
        return func(*args, **kwargs)

    def _on(self, tensor) -> bool:
        try:
            return self.rec.on_device(tensor.untyped_storage())
        except (RuntimeError, NotImplementedError):
            return False

    def _move(self, tensor, dtype):
        """``tensor.cuda()``: a copy on the GPU (the same tensor if it is there already)."""
        if self._on(tensor):
            return tensor if dtype is None else tensor.to(dtype)
        with _forced(self.rec, True):
            out = torch.empty_like(tensor, dtype=dtype or tensor.dtype, requires_grad=False)
        if tensor.requires_grad:
            out.requires_grad_(True)
        return out


@contextlib.contextmanager
def _forced(rec: Recorder, on: bool):
    before = rec.force_device
    rec.force_device = before + 1 if on else 0
    try:
        yield
    finally:
        rec.force_device = before


# -- the pretend torch.cuda -------------------------------------------------------------------------
class _Stream:
    """A CUDA stream of the pretend GPU: work issued under it is recorded on it."""

    recorder: Recorder | None = None

    def __init__(self, *args, _index: int | None = None, **kwargs):
        rec = _Stream.recorder
        if _index is None:
            rec.streams += 1
            _index = rec.streams
        self.index = _index
        self.device = torch.device("cuda", 0)
        self.cuda_stream = _index

    def wait_stream(self, other) -> None:
        event = _Event()
        event.record(other)
        self.wait_event(event)

    def wait_event(self, event) -> None:
        if event.index is not None:
            _Stream.recorder.ops.append(("S", self.index, event.index))

    def record_event(self, event=None):
        event = event or _Event()
        event.record(self)
        return event

    def synchronize(self) -> None:
        _Stream.recorder.ops.append(("Y", _Stream.recorder.frame()))

    def query(self) -> bool:
        return True

    def __enter__(self):
        self._before = _Stream.recorder.stream
        _Stream.recorder.stream = self.index
        return self

    def __exit__(self, *exc):
        _Stream.recorder.stream = self._before
        return False

    def __eq__(self, other):
        return isinstance(other, _Stream) and other.index == self.index

    def __hash__(self):
        return self.index


class _Event:
    """A CUDA event: where a stream was when it was recorded, for another stream to wait on."""

    def __init__(self, *args, **kwargs):
        self.index = None

    def record(self, stream=None) -> None:
        rec = _Stream.recorder
        rec._next_id += 1
        self.index = rec._next_id
        rec.ops.append(("R", self.index, rec.stream if stream is None else stream.index))

    def wait(self, stream=None) -> None:
        (stream or _current_stream()).wait_event(self)

    def synchronize(self) -> None:
        _Stream.recorder.ops.append(("Y", _Stream.recorder.frame()))

    def query(self) -> bool:
        return True

    def elapsed_time(self, other) -> float:
        # capture has no clock: the times are the replay's (summary.json); 0 keeps a script's logging going
        return 0.0


def _current_stream(device=None) -> _Stream:
    return _Stream(_index=_Stream.recorder.stream)


@contextlib.contextmanager
def _use_stream(stream=None):
    if stream is None:
        yield
        return
    with stream:
        yield


def _set_stream(stream) -> None:
    _Stream.recorder.stream = stream.index


def _patch_cuda(rec: Recorder, spec: dict, local_rank: int, nproc: int) -> None:
    """``torch.cuda`` as on a GPU of the cluster's type: memory from this capture's accounting."""
    cuda = torch.cuda
    _Stream.recorder = rec
    props = types.SimpleNamespace(name=spec["gpu_name"], total_memory=spec["capacity_bytes"], major=spec["major"],
                                  minor=spec["minor"], multi_processor_count=spec["sms"],
                                  is_integrated=False, is_multi_gpu_board=False)  # fmt: skip
    state = {"device": local_rank, "peak_from": 0}

    def set_device(device) -> None:
        state["device"] = device.index if isinstance(device, torch.device) else int(device)

    def memory_allocated(device=None) -> int:
        rec.sweep()
        return rec.live_bytes

    def max_memory_allocated(device=None) -> int:
        return rec.peak_bytes

    def reset_peak(device=None) -> None:
        rec.peak_bytes = rec.live_bytes

    values = {
        "is_available": lambda: True, "device_count": lambda: nproc, "current_device": lambda: state["device"],
        "set_device": set_device, "get_device_name": lambda device=None: spec["gpu_name"],
        "get_device_properties": lambda device=None: props,
        "get_device_capability": lambda device=None: (spec["major"], spec["minor"]),
        "synchronize": lambda device=None: rec.ops.append(("Y", rec.frame())), "empty_cache": lambda: None,
        "memory_allocated": memory_allocated, "max_memory_allocated": max_memory_allocated,
        "memory_reserved": lambda device=None: rec.live_bytes, "max_memory_reserved": max_memory_allocated,
        "reset_peak_memory_stats": reset_peak, "reset_max_memory_allocated": reset_peak,
        "mem_get_info": lambda device=None: (spec["capacity_bytes"] - rec.live_bytes, spec["capacity_bytes"]),
        "is_bf16_supported": lambda *a, **k: True, "manual_seed": lambda seed: None,
        "manual_seed_all": lambda seed: None, "seed": lambda: None, "is_initialized": lambda: True,
        "init": lambda: None, "_lazy_init": lambda: None,
        # a generator's state is a byte tensor on the host; the pretend GPU's is never consumed
        "get_rng_state": lambda device="cuda": torch.zeros(16, dtype=torch.uint8),
        "set_rng_state": lambda state, device="cuda": None,
        "get_rng_state_all": lambda: [torch.zeros(16, dtype=torch.uint8)] * nproc,
        "set_rng_state_all": lambda states: None, "initial_seed": lambda: 0,
        "Stream": _Stream, "Event": _Event, "current_stream": _current_stream,
        "default_stream": lambda device=None: _Stream(_index=0), "stream": _use_stream, "set_stream": _set_stream,
        "device": lambda d=None: contextlib.nullcontext(),
    }  # fmt: skip
    for attr, value in values.items():
        setattr(cuda, attr, value)
    # the pretend GPU is the fake CPU device, so libraries that ask the device for its streams and
    # events (FSDP2's all-gather and reduce-scatter streams) get them from torch.cpu and torch.accelerator
    for module in (torch.cpu, torch.accelerator):
        for attr in ("Stream", "Event", "current_stream", "stream", "synchronize", "set_stream"):
            if hasattr(module, attr):
                setattr(module, attr, values[attr])
    with contextlib.suppress(AttributeError):
        torch.cuda.memory.memory_allocated = values["memory_allocated"]
        torch.cuda.memory.max_memory_allocated = max_memory_allocated


def _patch_autocast() -> None:
    """``torch.autocast("cuda", bf16)`` casts the fake CPU device's ops the same way."""
    original = torch.amp.autocast_mode.autocast

    class autocast(original):  # noqa: N801 - the name scripts use
        def __init__(self, device_type="cuda", dtype=None, enabled=True, cache_enabled=None):
            if device_type == "cuda":
                device_type = "cpu"
                dtype = dtype or torch.float16
            super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    torch.autocast = autocast
    torch.amp.autocast = autocast
    torch.amp.autocast_mode.autocast = autocast

    def cuda_autocast(enabled=True, dtype=torch.float16, cache_enabled=True):
        return autocast("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    torch.cuda.amp.autocast = cuda_autocast
    torch.cuda.amp.GradScaler = functools.partial(torch.amp.GradScaler, "cpu")


def _patch_module_to(rec: Recorder) -> None:
    """``model.to("cuda")`` / ``model.cuda()``: the parameters and buffers move to the GPU in place
    (fake parameters cannot be swapped for new ones)."""
    original_to = torch.nn.Module.to

    def to(self, *args, **kwargs):
        device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "cuda":
            frame = rec.frame()
            for tensor in list(self.parameters()) + list(self.buffers()):
                rec.track(tensor.untyped_storage(), frame)
            if dtype is None and memory_format is None:
                return self
            return original_to(self, dtype=dtype) if memory_format is None else original_to(
                self, dtype=dtype, memory_format=memory_format)  # fmt: skip
        return original_to(self, *args, **kwargs)

    torch.nn.Module.to = to
    torch.nn.Module.cuda = lambda self, device=None: to(self, "cuda")


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch on a module right after it is imported (pipelining is heavy to import: only
    scripts that use it pay for it)."""

    def __init__(self, name: str, patch):
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader, patch = spec.loader, self.patch

        class Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return loader.create_module(spec)

            def exec_module(self, module):
                loader.exec_module(module)
                patch(module)

        spec.loader = Loader()
        return spec


def _after_import(name: str, patch) -> None:
    if name in sys.modules:
        patch(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, patch))


def _patch_distributed(rec: Recorder, rank: int, world: int) -> None:
    """``init_process_group`` (NCCL asked for) becomes the fake process group of this rank."""
    c10d = dist.distributed_c10d
    original_init = c10d.init_process_group

    def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank_=-1, store=None,
                           group_name="", pg_options=None, device_id=None, **kwargs):  # fmt: skip
        if dist.is_initialized():
            return None
        return original_init("fake", store=FakeStore(), rank=rank, world_size=world,
                             **({"timeout": timeout} if timeout is not None else {}))  # fmt: skip

    dist.init_process_group = init_process_group
    c10d.init_process_group = init_process_group

    def blocking(fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            rec.blocking_p2p += 1
            try:
                return fn(*args, **kwargs)
            finally:
                rec.blocking_p2p -= 1

        return call

    for name in ("send", "recv"):
        wrapped = blocking(getattr(c10d, name))
        setattr(c10d, name, wrapped)
        setattr(dist, name, wrapped)
    # a DeviceMesh of "cuda" is a mesh of the fake CPU device: DTensor moves local tensors to the
    # mesh's device type, also in backward, where no function mode rewrites the device
    from torch.distributed import device_mesh

    original_mesh_init = device_mesh.DeviceMesh.__init__

    @functools.wraps(original_mesh_init)
    def mesh_init(self, device_type, *args, **kwargs):
        original_mesh_init(self, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    device_mesh.DeviceMesh.__init__ = mesh_init
    original_init_mesh = device_mesh.init_device_mesh

    @functools.wraps(original_init_mesh)
    def init_device_mesh(device_type, *args, **kwargs):
        return original_init_mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    device_mesh.init_device_mesh = init_device_mesh
    dist.init_device_mesh = init_device_mesh
    # torch.distributed.pipelining votes over point-to-point whether the stages' shapes are static and
    # reads the received value; a fake tensor has none: the stages are static (shapes do not change
    # between microbatches in a training loop), which is what the vote finds on a GPU
    def patch_schedules(schedules) -> None:
        def warmup_p2p(self, stages, has_backward, p2p_done) -> None:
            for stage in stages:
                stage._inference_mode = schedules.InferenceMode.STATIC

        schedules._PipelineSchedule._warmup_p2p = warmup_p2p

    _after_import("torch.distributed.pipelining.schedules", patch_schedules)
    # DDP refuses device_ids for a module whose parameters are not on a GPU: the pretend GPU is the
    # fake CPU device, so the module is placed already and device_ids has nothing to add
    ddp = torch.nn.parallel.DistributedDataParallel
    original_ddp_init = ddp.__init__

    @functools.wraps(original_ddp_init)
    def ddp_init(self, module, device_ids=None, output_device=None, *args, **kwargs):
        # gradients as views of the buckets: the reducer copies nothing back, so the buckets'
        # all-reduces are waited for where the gradients are next read (the optimizer step), as
        # DDP's end-of-backward wait would order them; a copy would make the wait immediate
        kwargs["gradient_as_bucket_view"] = True
        original_ddp_init(self, module, None, None, *args, **kwargs)
        group = kwargs.get("process_group")
        # the fake group's work has no result tensor, which DDP's built-in all-reduce hook needs:
        # the same all-reduce (sum, then divide by the group size) as a Python hook
        self.register_comm_hook(group, _ddp_allreduce_hook)

    ddp.__init__ = ddp_init
    # DDP checks that the parameters agree across ranks with a real collective over their values
    # (a data-dependent check fake tensors cannot answer): the fake group agrees by construction
    with contextlib.suppress(AttributeError):
        dist.utils._verify_param_shape_across_processes = lambda *a, **k: None
        torch.nn.parallel.distributed._verify_param_shape_across_processes = lambda *a, **k: None
        torch.nn.parallel.distributed._sync_module_states = lambda *a, **k: None
        dist.utils._sync_module_states = lambda *a, **k: None


def _patch_identity(rec: Recorder) -> None:
    """The rank identity the script's own code reads comes back as RankValues (identity.py); what
    torch's libraries read stays plain (they pick among process groups, checked by torchrun)."""
    c10d = dist.distributed_c10d
    original_get_rank = c10d.get_rank

    @functools.wraps(original_get_rank)
    def get_rank(group=None):
        value = original_get_rank(group)
        if not rec.script_calling(1):
            return value
        expr = ["rank"] if group is None or group is dist.group.WORLD else ["grank", list(_group_ranks(group))]
        return rec.identity(expr, value)

    dist.get_rank = c10d.get_rank = get_rank
    original_local = c10d.get_node_local_rank

    @functools.wraps(original_local)
    def get_node_local_rank(fallback_rank=None):
        value = original_local(fallback_rank)
        return rec.identity(["local"], value) if rec.script_calling(1) else value

    dist.get_node_local_rank = c10d.get_node_local_rank = get_node_local_rank
    original_pg_rank = dist.ProcessGroup.rank

    def pg_rank(self):
        value = original_pg_rank(self)
        if not rec.script_calling(1):
            return value
        return rec.identity(["grank", list(dist.get_process_group_ranks(self))], value)

    dist.ProcessGroup.rank = pg_rank
    from torch.distributed import device_mesh

    mesh_class = device_mesh.DeviceMesh

    def mesh_expr(mesh, dim: int):
        return ["coord", [int(r) for r in mesh.mesh.flatten().tolist()], list(mesh.mesh.shape), dim]

    original_mesh_rank, original_local_rank = mesh_class.get_rank, mesh_class.get_local_rank
    original_coordinate = mesh_class.get_coordinate

    def mesh_get_rank(self):
        value = original_mesh_rank(self)
        return rec.identity(["rank"], value) if rec.script_calling(1) else value

    def mesh_get_local_rank(self, mesh_dim=None):
        value = original_local_rank(self, mesh_dim)
        if not rec.script_calling(1):
            return value
        dim = 0 if mesh_dim is None else mesh_dim if isinstance(mesh_dim, int) else self.mesh_dim_names.index(mesh_dim)
        return rec.identity(mesh_expr(self, dim), value)

    def mesh_get_coordinate(self):
        value = original_coordinate(self)
        if value is None or not rec.script_calling(1):
            return value
        return [rec.identity(mesh_expr(self, d), v) for d, v in enumerate(value)]

    mesh_class.get_rank, mesh_class.get_local_rank = mesh_get_rank, mesh_get_local_rank
    mesh_class.get_coordinate = mesh_get_coordinate
    # the environment torchrun gives: a variable naming the rank, read by the script, is recorded
    # with its exact value (a string: what the script makes of it cannot be followed)
    environ_class = type(os.environ)

    class WatchedEnviron(environ_class):
        def __getitem__(self, key):
            value = super().__getitem__(key)
            if key in ENV and _script_frame_outside(rec, ("os.py", "_collections_abc.py")):
                rec.predicate(["env", key], value)
            return value

    os.environ.__class__ = WatchedEnviron


def _script_frame_outside(rec: Recorder, skip: tuple[str, ...]) -> bool:
    """Whether the first frame up the stack outside the files ``skip`` is the script's own."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.endswith(skip):
        f = f.f_back
    return f is not None and rec.is_script_file(f.f_code.co_filename)


def _ddp_allreduce_hook(group, bucket):
    buffer = bucket.buffer()
    buffer.div_((group or dist.group.WORLD).size())
    dist.all_reduce(buffer, group=group, async_op=True)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future


def _patch_optimizer(rec: Recorder) -> None:
    """An iteration ends at every ``optimizer.step()``; optimizers choose the kernels a GPU gets."""

    def hook(optimizer, args, kwargs) -> None:
        rec.mark_iteration()

    register_optimizer_step_post_hook(hook)

    # torch runs an optimizer's multi-tensor (foreach) kernels by default when every parameter is a
    # CUDA tensor, and a loop of per-parameter kernels for CPU tensors (optimizer.py,
    # _default_to_fused_or_foreach). Capture's "cuda" tensors live on the fake CPU device, so the
    # default would pick the CPU loop: hundreds of small kernels a GPU run never launches (6.4 ms of
    # an FSDP example's 45 ms). Parameters on the pretend GPU are answered as CUDA ones; what the
    # script asks for explicitly (foreach=False, fused=True) torch still honours.
    from torch.optim import optimizer as optim_base

    original = optim_base._default_to_fused_or_foreach

    def on_gpu(param) -> bool:
        local = getattr(param, "_local_tensor", param)  # a DTensor's shard (FSDP2, tensor parallel)
        try:
            return rec.on_device(local.untyped_storage())
        except (RuntimeError, NotImplementedError):
            return False

    def default_kernels(params, differentiable, use_fused=False):
        present = [p for p in params if p is not None]
        if not present or not all(on_gpu(p) for p in present):
            return original(params, differentiable, use_fused)
        if torch.jit.is_scripting() or differentiable:
            return False, False
        supported = all(type(p) in optim_base._foreach_supported_types for p in present)
        fused = use_fused and supported and all(torch.is_floating_point(p) for p in present)
        return fused, not fused and supported

    # each optimizer module imported the function by name: replace it where it was imported too
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.optim") and getattr(module, "_default_to_fused_or_foreach", None) is original:
            module._default_to_fused_or_foreach = default_kernels


def capture(spec: dict) -> dict:
    """Run the script of ``spec`` as one rank; the rank's records."""
    rank, world, local_rank, nproc = spec["rank"], spec["world_size"], spec["local_rank"], spec["nproc_per_node"]
    env = {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": nproc,
           "GROUP_RANK": rank // nproc, "NODE_RANK": rank // nproc, "ROLE_RANK": rank, "ROLE_WORLD_SIZE": world,
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "emulator",
           "OMP_NUM_THREADS": "1", "EMULATOR_CAPTURE": "1"}  # fmt: skip
    os.environ.update({k: str(v) for k, v in env.items()})
    rec = Recorder(spec["script"], rank, world, spec["gpu"]["capacity_bytes"])
    # the distributed packages a script uses, imported before torch.cuda pretends to be there (some
    # choose CUDA-only code paths at import time)
    for module in PREIMPORT:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    torch.__future__.set_overwrite_module_params_on_conversion(True)
    _patch_cuda(rec, spec["gpu"], local_rank, nproc)
    _patch_autocast()
    _patch_module_to(rec)
    _patch_distributed(rec, rank, world)
    _patch_identity(rec)
    rec.exact = bool(spec.get("exact_identity"))
    _patch_optimizer(rec)
    builtins_mark = rec.mark_iteration
    import builtins

    builtins.emulator_mark_iteration = builtins_mark  # a user mark: emulator_mark_iteration()
    sys.argv = [rec.script, *spec["args"]]
    script_dir = os.path.dirname(os.path.realpath(spec["script"]))
    sys.path.insert(0, script_dir)
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    # the cycle collector runs when allocation counts say so, which differ from process to process:
    # frees would land at different places in ranks that run the same script; it runs at each
    # iteration mark instead (and reference counting frees everything else at once)
    gc.collect()
    gc.disable()
    try:
        with fake, Devices(rec), Dispatch(rec):
            runpy.run_path(rec.script, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise CaptureError(f"{_where(exc, rec.script)}: the script exited with status {exc.code}") from None
    except CaptureError:
        raise
    except BaseException as exc:
        if os.environ.get("EMULATOR_CAPTURE_DEBUG"):
            traceback.print_exc()
        raise CaptureError(f"{_where(exc, rec.script)}: the script raised {type(exc).__name__}: "
                           f"{_first_line(exc)}") from None  # fmt: skip
    rec.wait_all(-1)
    rec.sweep()
    return rec.dump()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


def _where(exc: BaseException, script: str) -> str:
    """``file:line`` of the innermost frame of the traceback in the user's script (else the last)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if os.path.realpath(f.filename) == script]
    frame = mine[-1] if mine else (frames[-1] if frames else None)
    if frame is None:
        return os.path.basename(script)
    return f"{os.path.basename(frame.filename)}:{frame.lineno}"


def _capture_to_file(spec: dict) -> int:
    try:
        result = capture(spec)
    except CaptureError as exc:
        with open(spec["out"] + ".error", "w") as f:
            f.write(str(exc))
        return 2
    tmp = spec["out"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, separators=(",", ":"))
    os.replace(tmp, spec["out"])
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m emulator.capture.rank SPECS.json``: capture each rank of the list SPECS, each in a
    child forked from this process once torch and the distributed packages are imported (the imports
    are most of a small script's capture); each child writes its ``out`` (or ``out.error``), what
    the script printed to ``out.log`` and the seconds it took to ``out.seconds``.

    ``python -m emulator.capture.rank --serve``: the same for every line of stdin (a JSON list of
    specs), answering each with a line holding the batch's exit status: a capture that goes on in
    rounds (emulator/capture/torchrun.py) imports torch once per worker, not once per round."""
    argv = sys.argv[1:] if argv is None else argv
    for module in PREIMPORT:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)
    if argv[0] == "--serve":
        answer = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)  # nothing else of this process may write to the answers
        for line in sys.stdin:
            answer.write(f"{_capture_specs(json.loads(line))}\n")
            answer.flush()
        return 0
    with open(argv[0]) as f:
        return _capture_specs(json.load(f))


def _capture_specs(specs: list[dict]) -> int:
    status = 0
    for spec in specs:
        start = time.perf_counter()
        code = _forked(spec)
        if code != 0 and not spec.get("exact_identity"):
            # a script may trip on the RankValues its identity reads return (a type check, a C
            # function wanting an int): again with plain values, each read recorded exactly
            with contextlib.suppress(FileNotFoundError):
                os.remove(spec["out"] + ".error")
            code = _forked(dict(spec, exact_identity=True))
        with open(spec["out"] + ".seconds", "w") as f:
            f.write(f"{time.perf_counter() - start:.3f}")
        status = max(status, code)
    return status


def _forked(spec: dict) -> int:
    """Capture ``spec``'s rank in a child forked from this process; its exit code. The child's
    output (the script's prints, argparse's complaints) goes to ``out.log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: one rank, then gone without running the parent's exit handlers
        code = 1
        try:
            log = os.open(spec["out"] + ".log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            code = _capture_to_file(spec)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, wait_status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(wait_status)


if __name__ == "__main__":
    sys.exit(main())
