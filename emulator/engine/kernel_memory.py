"""Raw memory for the kernels (opkernels.py, netkernels.py): an address as a pointer numba's
``carray`` views, and cache hints.

The kernels take their arrays as addresses (one table per call: numba's dispatcher unboxes each
array argument at about 0.15 us apiece) and view them with ``carray(void_ptr(address), shape)``.
Both kernel modules inline these, so their cache stamp covers this file (kernel_cache.SOURCES).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from emulator.engine import kernel_cache  # noqa: F401 - before the kernels that inline these: one cache stamp


@intrinsic
def void_ptr(typingctx, address):
    """The int64 ``address`` as a ``void*``."""

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(address), codegen


def _prefetch_hint(write: int):
    """An intrinsic hinting that the line at an address will be read (``write`` 0) or written (1)
    soon: llvm.prefetch, which never faults and changes nothing but the caches."""

    @intrinsic
    def prefetch(typingctx, address):
        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, i32, i32, i32]), "llvm.prefetch.p0i8"
            )
            ptr = builder.inttoptr(args[0], cgutils.voidptr_t)
            # (read or write, high locality, data cache)
            builder.call(fn, [ptr, ir.Constant(i32, write), ir.Constant(i32, 3), ir.Constant(i32, 1)])
            return context.get_dummy_value()

        return types.void(address), codegen

    return prefetch


prefetch = _prefetch_hint(0)
prefetch_w = _prefetch_hint(1)
