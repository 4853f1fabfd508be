"""One cache stamp for all of the project's numba kernels.

numba keeps a compiled function in its cache under the stamp of the one file that defines it
(its content's hash), and checks nothing else: a kernel that calls a jitted function of another
module, or reads a constant of another module (netlayout reads the event kinds of
emulator/engine/events.py; netkernels and opkernels inline the kernels of the modules they are split into), keeps
its cached machine code after that other file changes - a stale kernel that gives silently wrong
results, on the machine of whoever edited the file. Here
every kernel of the files in :data:`SOURCES` is stamped with the hash of all of them together, so
a change to any one recompiles them all (about 50 s of CPU, once, as on a fresh machine).

The stamp is given by a cache locator put in front of numba's own (``CacheImpl._locator_classes``,
where numba looks for the place and stamp of a function's cache): the kernel modules import this
module before they define a kernel. A numba without that list keeps its per-file stamps, and a
warning says so. tests/emulator/engine/test_kernel_cache.py checks that every file of the project
that caches a kernel is listed with every project module it imports, and that an edit of a callee's
file recompiles its caller.

A kernel of these files also loads from the cache for less: numba refreshes its compiler's registries
before every load (it imports some 40 of its modules and installs their typing and lowering tables,
~0.2-0.3 s of CPU, once per process), which a compile needs and a load does not - the cached object
code is linked as it is, against numba's runtime (NRT), which is initialised as numba's refresh does.
A cache miss compiles, and numba's compiler refreshes the registries itself first.
:func:`cached` says whether a run would compile at all (netcore.prepare_kernels compiles ahead,
in a thread, only then).
"""

from __future__ import annotations

import hashlib
import os
import warnings

from numba.core import caching
from numba.core.dispatcher import Dispatcher

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# the files whose kernels are cached, and the project modules they read at compile time
SOURCES = tuple(
    os.path.join(_ROOT, *path.split("/"))
    for path in (
        "emulator/engine/events.py",
        "emulator/engine/kernel_memory.py",
        "emulator/engine/netheap.py",
        "emulator/engine/netkernels.py",
        "emulator/engine/netlayout.py",
        "emulator/engine/netlinks.py",
        "emulator/engine/netmailbox.py",
        "emulator/engine/netmessages.py",
        "emulator/engine/netstats.py",
        "emulator/engine/opheap.py",
        "emulator/engine/opkernels.py",
        "emulator/engine/oplayout.py",
        "emulator/engine/oploop.py",
        "emulator/engine/opsends.py",
        "emulator/engine/opstreams.py",
        "emulator/results/textrows.py",
    )
)

_groups: dict[str, tuple[str, ...]] = {}  # real path of a file -> the files stamped together with it
_stamps: dict[tuple[str, ...], bytes] = {}  # (the group, each file's (mtime, size)) -> its stamp
_locators: tuple[type, ...] = ()  # install's locator classes: a cache found by one is a grouped kernel's


def group_stamp(files: tuple[str, ...]) -> bytes:
    """The hash of ``files``' contents, in their order (read again when one's mtime or size changed)."""
    key = files + tuple(str((st.st_mtime_ns, st.st_size)) for st in map(os.stat, files))
    stamp = _stamps.get(key)
    if stamp is None:
        digest = hashlib.sha256()
        for path in files:
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
        stamp = _stamps[key] = digest.digest()
    return stamp


def _stamped(base):
    """A locator class that finds a grouped file's cache where ``base`` does, with the group's stamp."""

    class Locator(base):
        @classmethod
        def from_function(cls, py_func, py_file):
            if os.path.realpath(py_file) not in _groups:
                return None  # another file: numba's own locators
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return group_stamp(_groups[os.path.realpath(self._py_file)])

    Locator.__name__ = Locator.__qualname__ = f"Grouped{base.__name__}"
    return Locator


def _load_without_refresh(numbas_load):
    """numba's ``Cache.load_overload``, without its refresh of the compiler's registries for a kernel of
    the grouped files (the module doc); another library's cached function loads as numba loads it."""
    from numba.core.runtime import rtsys

    def load_overload(self, sig, target_context):
        if not isinstance(getattr(getattr(self, "_impl", None), "locator", None), _locators):
            return numbas_load(self, sig, target_context)
        rtsys.initialize(target_context)  # what the loaded code calls (numba's refresh starts with it)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    load_overload.without_refresh = True
    return load_overload


def cached(modules) -> bool:
    """Whether every kernel that Python calls in ``modules`` (those not inlined into other kernels) has
    machine code for this machine in numba's cache, compiled from the files as they are now: the
    index numba reads (its version, the group's stamp) holds a key with this machine and the
    function's bytecode."""
    from numba.core.registry import cpu_target

    codegen = cpu_target.target_context.codegen()
    for module in modules:
        for kernel in vars(module).values():
            if (not isinstance(kernel, Dispatcher) or kernel.py_func.__module__ != module.__name__
                    or kernel.targetoptions.get("inline") == "always"):  # fmt: skip
                continue
            cache = kernel._cache
            if not isinstance(cache, caching.Cache):
                return False  # a kernel without numba's cache: compiled by every process
            try:
                wanted = cache._index_key(None, codegen)[1:]  # (a key: the signature, the machine, the bytecode)
                keys = cache._cache_file._load_index()
            except (AttributeError, TypeError):  # another numba's private layout: say "compile ahead"
                return False
            if not any(key[1:] == wanted for key in keys):
                return False
    return True


def install(files: tuple[str, ...]) -> bool:
    """Stamp the kernels of ``files`` (defined after this call) with one stamp; False where this
    numba has no locator list to extend (each file then keeps its own stamp)."""
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    classes = getattr(impl, "_locator_classes", None)
    # numba's order: a user-given cache directory first, then __pycache__, then the user's cache
    bases = [getattr(caching, name) for name in
             ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator")
             if hasattr(caching, name)]  # fmt: skip
    if not isinstance(classes, list) or not bases:
        # (a numba whose locators have other names, as older ones with a leading underscore: the
        # warning, not a silent per-file stamp)
        warnings.warn("numba has no cache locator list: a kernel's cache is not refreshed when a module it "
                      "reads changes (clear __pycache__ after editing the kernels)", stacklevel=2)  # fmt: skip
        return False
    group = tuple(os.path.realpath(f) for f in files)
    for path in group:
        _groups[path] = group
    if not any(getattr(c, "__name__", "").startswith("Grouped") for c in classes):
        classes[:0] = [_stamped(base) for base in bases]
    global _locators
    _locators = tuple(c for c in classes if getattr(c, "__name__", "").startswith("Grouped"))
    numbas_load = getattr(caching.Cache, "load_overload", None)
    # (numba's private names this relies on: where one is missing numba loads as it always did)
    private = ("_load_overload", "_guard_against_spurious_io_errors")
    if all(hasattr(caching.Cache, n) for n in private) and not getattr(numbas_load, "without_refresh", False):
        caching.Cache.load_overload = _load_without_refresh(numbas_load)
    return True


install(SOURCES)
