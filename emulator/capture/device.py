"""The pretend CUDA device of a captured rank: ``cuda`` tensors are fake tensors of the CPU device
whose storages are flagged "on the GPU" (:class:`Devices`), and ``torch.cuda`` (streams, events,
memory queries, device properties), ``torch.autocast("cuda")`` and ``Module.to("cuda")`` answer as
on a GPU of the cluster's type.

The CPU build of torch cannot run autograd on tensors whose device is ``cuda`` (its device guard is
not linked in), so the pretend GPU is the fake CPU device: device arguments that name ``cuda`` are
rewritten to ``cpu``, and each storage carries a flag "on the GPU" (set by ``.to("cuda")``,
``.cuda()``, ``device="cuda"``, and passed from inputs to outputs), which is what counts for
memory and for the GPU's work. Host-side tensors (a batch built on the CPU) cost nothing.

Part of the capture (emulator/capture/rank.py runs it).
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch
from torch.overrides import TorchFunctionMode

from emulator.capture.recorder import RankValue, Recorder

REAL_DEVICE = torch.device  # the C type: capture's torch.device (TorchDevice) makes these
CPU = REAL_DEVICE("cpu")


def _is_cuda(device) -> bool:
    if isinstance(device, (CudaDevice, RankValue, int)) and not isinstance(device, bool):
        return True  # a bare index names a CUDA device in torch
    if isinstance(device, REAL_DEVICE):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0] == "cuda"
    return False


def cpu_device(value):
    if isinstance(value, REAL_DEVICE) and value.type == "cuda":  # the C type: no metaclass check per argument
        return CPU
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
                # a device, or an int: a CUDA device's index (a bool is non_blocking or copy)
                if isinstance(a, (str, REAL_DEVICE, int)) and not isinstance(a, bool):
                    target = a
                else:
                    rest.append(a)
            if _is_cuda(target):
                kwargs.pop("device", None)
                moved = self._move(args[0], None)
                if rest or kwargs:
                    moved = moved.to(*rest, **kwargs)
                return moved
            if isinstance(target, REAL_DEVICE | str) and str(target).startswith("cpu") and self._on(args[0]):
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
        self.device = REAL_DEVICE("cuda", 0)
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


def patch_cuda(rec: Recorder, spec: dict, local_rank: int, nproc: int) -> None:
    """``torch.cuda`` as on a GPU of the cluster's type: memory from this capture's accounting."""
    cuda = torch.cuda
    _Stream.recorder = rec
    props = types.SimpleNamespace(name=spec["gpu_name"], total_memory=spec["capacity_bytes"], major=spec["major"],
                                  minor=spec["minor"], multi_processor_count=spec["sms"],
                                  is_integrated=False, is_multi_gpu_board=False)  # fmt: skip
    state = {"device": None, "peak_from": 0}  # None: not set, the local rank (as the capture always had it)

    def set_device(device) -> None:
        # the rank's identity as the index is kept as it is: every index is the same fake device, so
        # setting it changes nothing in the stream; what the script reads back of it records
        if isinstance(device, CudaDevice):
            state["device"] = device.index
        elif isinstance(device, RankValue):
            state["device"] = device
        elif isinstance(device, REAL_DEVICE | str):
            state["device"] = REAL_DEVICE(device).index or 0
        else:
            state["device"] = int(device)

    def current_device() -> int:
        """The device set, for the script as it set it (the identity stand-in for the local rank, if
        none was set); torch's libraries get the plain number (they use it to pick the device, and
        every index is the same fake device)."""
        device = state["device"]
        script = rec.script_calling(1)
        if device is None:
            return rec.identity(["local"], local_rank) if script else local_rank
        if isinstance(device, RankValue) and not script:
            return device.value
        return device

    def memory_allocated(device=None) -> int:
        rec.sweep()
        return rec.live_bytes

    def max_memory_allocated(device=None) -> int:
        return rec.peak_bytes

    def reset_peak(device=None) -> None:
        rec.peak_bytes = rec.live_bytes

    values = {
        "is_available": lambda: True, "device_count": lambda: nproc, "current_device": current_device,
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
    _TorchDeviceType.recorder = rec
    torch.device = TorchDevice


class CudaDevice(str):
    """``torch.device("cuda", i)`` where ``i`` is the rank identity's stand-in (a RankValue). Every
    index is the same fake device, so to torch it is ``"cuda"`` (a ``str``: torch's argument parsers
    take it as the device, reading only those characters); its ``index`` is the stand-in itself;
    any other use (printing it, comparing it, hashing it, its attributes) records the exact index
    and acts on the real ``torch.device("cuda", i)``."""

    type = "cuda"

    def __new__(cls, index: RankValue):
        device = super().__new__(cls, "cuda")
        device._index = index
        return device

    @property
    def index(self) -> RankValue:
        return self._index

    def _exact(self):
        return REAL_DEVICE("cuda", int(self._index))

    def __getattribute__(self, name: str):
        if name in _CUDA_DEVICE_OWN:
            return object.__getattribute__(self, name)
        return getattr(object.__getattribute__(self, "_exact")(), name)

    def __str__(self) -> str:
        return str(self._exact())

    def __repr__(self) -> str:
        return repr(self._exact())

    def __format__(self, spec: str) -> str:
        return format(self._exact(), spec)

    def __eq__(self, other) -> bool:
        return self._exact() == (other._exact() if isinstance(other, CudaDevice) else other)

    def __ne__(self, other) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self._exact())

    def __bool__(self) -> bool:
        return True


_CUDA_DEVICE_OWN = frozenset({"type", "index", "_index", "_exact", "__class__", "__dict__"})


def _not_a_string(name: str):
    def refuse(self, *args):
        self._exact()
        raise TypeError(f"unsupported operation {name} on torch.device")

    return refuse


# a torch.device is no string: what str would answer from the characters "cuda" is refused, as on a GPU
for _name in ("__add__", "__radd__", "__mul__", "__rmul__", "__mod__", "__rmod__", "__len__", "__iter__",
              "__getitem__", "__contains__", "__lt__", "__le__", "__gt__", "__ge__"):  # fmt: skip
    setattr(CudaDevice, _name, _not_a_string(_name))


class _TorchDeviceType(type):
    """``torch.device`` under capture: the C type, except a CUDA device whose index is the rank
    identity's stand-in (a :class:`CudaDevice`); instances of either are ``torch.device``s."""

    recorder: Recorder | None = None

    def __call__(cls, *args, **kwargs):
        if len(args) == 1 and not kwargs and isinstance(args[0], CudaDevice):
            return args[0]
        if not _TorchDeviceType.recorder.exact:
            kind = kwargs.get("type", args[0] if args else None)
            index = kwargs.get("index", args[1] if len(args) > 1 else None)
            if isinstance(kind, RankValue) and index is None:  # torch.device(i): CUDA device i
                return CudaDevice(kind)
            if isinstance(index, RankValue) and isinstance(kind, str) and kind == "cuda":
                return CudaDevice(index)
        return REAL_DEVICE(*args, **kwargs)

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, (REAL_DEVICE, CudaDevice))

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, (REAL_DEVICE, CudaDevice))


class TorchDevice(metaclass=_TorchDeviceType):
    """What ``torch.device`` names during capture (see :class:`_TorchDeviceType`)."""



def patch_autocast() -> None:
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


def patch_module_to(rec: Recorder) -> None:
    """``model.to("cuda")`` / ``model.cuda()``: the parameters and buffers move to the GPU in place
    (fake parameters cannot be swapped for new ones)."""
    original_to = torch.nn.Module.to

    def to(self, *args, **kwargs):
        # the identity as a device index: "cuda" (every index is the same fake device)
        args = tuple("cuda" if isinstance(a, RankValue) else a for a in args)
        if isinstance(kwargs.get("device"), RankValue):
            kwargs["device"] = "cuda"
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

    # a tensor's .to(i) / .cuda(i) with the identity's stand-in as the index: torch's argument parser
    # takes only an int there, and reads it unseen; it is "cuda" (every index is the same fake
    # device). Devices then sees these calls as usual (it is handed torch.Tensor.to, this function)
    original_tensor_to, original_tensor_cuda = torch.Tensor.to, torch.Tensor.cuda

    def tensor_to(self, *args, **kwargs):
        args = tuple("cuda" if isinstance(a, RankValue) else a for a in args)
        if isinstance(kwargs.get("device"), RankValue):
            kwargs["device"] = "cuda"
        return original_tensor_to(self, *args, **kwargs)

    def tensor_cuda(self, device=None, *args, **kwargs):
        return original_tensor_cuda(self, None if isinstance(device, RankValue) else device, *args, **kwargs)

    torch.Tensor.to, torch.Tensor.cuda = tensor_to, tensor_cuda
