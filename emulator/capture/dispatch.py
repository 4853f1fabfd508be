"""What a captured rank's GPU runs: a ``TorchDispatchMode`` that sees every aten op with its shapes
and records compute, collectives, point-to-point ops and the waits on their handles (the record
format is in emulator/capture/rank.py's docstring).

Part of the capture (emulator/capture/rank.py runs it).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry

from emulator.capture.device import cpu_device
from emulator.capture.recorder import CaptureError, Recorder

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

PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp32"}


def _storages(value) -> list:
    out = []
    for leaf in tree_flatten(value)[0]:
        if isinstance(leaf, torch.Tensor) and not is_traceable_wrapper_subclass(leaf):
            try:
                out.append((leaf, leaf.untyped_storage()))
            except (RuntimeError, NotImplementedError):  # a tensor subclass without one storage
                continue
    return out


def group_ranks(pg) -> tuple[int, ...]:
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
        args, kwargs = tree_map(cpu_device, (args, kwargs))
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
            group = group_ranks(_arg(func, args, kwargs, "process_group"))
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
        ranks = group_ranks(pg)
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
