"""The torch libraries under capture: ``init_process_group`` becomes the fake process group, DDP,
device meshes and pipelining work on the pretend GPU, the rank identity the script reads comes
back as :class:`~emulator.capture.recorder.RankValue`, and optimizers mark iterations and pick the
kernels a GPU gets.

Part of the capture (emulator/capture/rank.py runs it).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import os
import sys

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.testing._internal.distributed.fake_pg import FakeStore

from emulator.capture.dispatch import group_ranks
from emulator.capture.identity import ENV
from emulator.capture.recorder import EnvText, Recorder


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


def patch_distributed(rec: Recorder, rank: int, world: int) -> None:
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


def patch_identity(rec: Recorder) -> None:
    """The rank identity the script's own code reads comes back as RankValues (identity.py); what
    torch's libraries read stays plain (they pick among process groups, checked by torchrun)."""
    c10d = dist.distributed_c10d
    original_get_rank = c10d.get_rank

    @functools.wraps(original_get_rank)
    def get_rank(group=None):
        value = original_get_rank(group)
        if not rec.script_calling(1):
            return value
        expr = ["rank"] if group is None or group is dist.group.WORLD else ["grank", list(group_ranks(group))]
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
    # the environment torchrun gives: a variable naming the rank, read by the script, is an EnvText
    # (the script's int() of it is the identity's RankValue; any other use records its exact text);
    # with plain values (exact mode) the text itself, recorded exactly when it is read
    environ_class = type(os.environ)

    class WatchedEnviron(environ_class):
        def __getitem__(self, key):
            value = super().__getitem__(key)
            if key in ENV and _script_frame_outside(rec, ("os.py", "_collections_abc.py")):
                if not rec.exact:
                    return EnvText(key, value, rec)
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


def patch_optimizer(rec: Recorder) -> None:
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
