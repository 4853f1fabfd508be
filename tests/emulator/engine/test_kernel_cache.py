"""The kernels' one cache stamp (emulator/engine/kernel_cache.py): complete, and effective."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from numba.core import caching

from emulator.engine import kernel_cache

ROOT = Path(__file__).resolve().parents[3]


def _project_imports(path: Path) -> set[Path]:
    """The project files ``path`` imports (modules, and names taken from a package that are modules)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.split(".")[0] in ("emulator", "netmodel", "actors"):
                file = ROOT.joinpath(*name.split(".")).with_suffix(".py")
                if file.exists():
                    found.add(file)
    return found


def test_every_cached_kernel_file_and_what_it_reads_share_the_stamp():
    listed = {Path(p).resolve() for p in kernel_cache.SOURCES}
    cached = {p.resolve() for pkg in ("emulator", "netmodel", "actors") for p in (ROOT / pkg).rglob("*.py")
              if "cache=True" in p.read_text()}  # fmt: skip
    assert cached, "no cached kernel found: the scan is wrong"
    assert cached <= listed, f"kernel files missing from kernel_cache.SOURCES: {sorted(map(str, cached - listed))}"
    own = Path(kernel_cache.__file__).resolve()
    for path in listed:
        assert path.exists(), path
        missing = {p.resolve() for p in _project_imports(path)} - listed - {own}
        assert not missing, f"{path} reads {sorted(map(str, missing))}, not in kernel_cache.SOURCES"


def test_the_stamp_covers_each_file(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 1\n")
    files = (str(a), str(b))
    first = kernel_cache.group_stamp(files)
    assert kernel_cache.group_stamp(files) == first
    b.write_text("y = 22\n")
    assert kernel_cache.group_stamp(files) != first


def test_an_edit_of_a_callee_recompiles_its_caller(tmp_path):
    """numba alone would load the caller's machine code from its cache, built with the old callee."""
    caller, callee = tmp_path / "caller.py", tmp_path / "callee.py"
    caller.write_text(textwrap.dedent("""
        from numba import njit
        import callee

        @njit(cache=True)
        def f():
            return callee.g() + callee.K
    """))
    callee.write_text(textwrap.dedent("""
        from numba import njit
        K = 10

        @njit(cache=True)
        def g():
            return 1
    """))
    script = "; ".join((
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})",
        "from emulator.engine import kernel_cache",
        f"kernel_cache.install(({str(caller)!r}, {str(callee)!r}))",
        "import caller; print(caller.f())",
    ))  # fmt: skip
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), NUMBA_DEBUG_CACHE="1")

    def run() -> tuple[str, str]:
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        return out.stdout.strip().splitlines()[-1], out.stdout

    assert run()[0] == "11"
    value, log = run()
    assert value == "11" and "data loaded" in log, log  # unchanged: both kernels from the cache
    callee.write_text(callee.read_text().replace("return 1", "return 2").replace("K = 10", "K = 20"))
    assert run()[0] == "22"
    # NUMBA_CACHE_DIR honoured: the grouped locators keep numba's order (a user-given directory first)
    assert list((tmp_path / "cache").rglob("*.nbi")) and not list(tmp_path.glob("__pycache__/*.nb*"))


@pytest.mark.parametrize("numba_has", ["a locator tuple", "no locator of the known names"])
def test_a_numba_without_the_locator_list_only_warns(numba_has, monkeypatch):
    """install leaves numba's locators as they are and warns (each file keeps numba's own stamp)."""
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    before = list(impl._locator_classes)
    if numba_has == "a locator tuple":
        monkeypatch.setattr(impl, "_locator_classes", tuple(before))
    else:
        for name in ("UserProvidedCacheLocator", "InTreeCacheLocator", "UserWideCacheLocator"):
            monkeypatch.delattr(caching, name)
    with pytest.warns(UserWarning, match="no cache locator list"):
        assert kernel_cache.install(("never_a_kernel_file.py",)) is False
    assert list(impl._locator_classes) == before
    assert os.path.realpath("never_a_kernel_file.py") not in kernel_cache._groups


def test_the_kernel_files_import_each_other_in_one_direction():
    """numba compiles kernels of files that call each other in a cycle, but crashes loading them
    from its cache: the project imports among the kernel files (netkernels and the modules it is
    split into, opkernels, ...) form no cycle."""
    listed = {Path(p).resolve() for p in kernel_cache.SOURCES}
    edges = {path: {p.resolve() for p in _project_imports(path)} & listed for path in listed}
    done: set[Path] = set()

    def visit(path: Path, trail: tuple[Path, ...]) -> None:
        assert path not in trail, f"kernel files import each other in a cycle: {[p.name for p in (*trail, path)]}"
        if path not in done:
            for callee in edges[path]:
                visit(callee, (*trail, path))
            done.add(path)

    for path in sorted(listed):
        visit(path, ())
    netkernels = ROOT / "emulator" / "engine" / "netkernels.py"
    assert {p.name for p in edges[netkernels]} >= {"netlayout.py", "netheap.py", "netmessages.py"}, "the scan is wrong"
    opkernels = ROOT / "emulator" / "engine" / "opkernels.py"
    assert {p.name for p in edges[opkernels]} >= {"oplayout.py", "opstreams.py", "oploop.py"}, "the scan is wrong"


def test_netkernels_still_offers_every_name_taken_from_it():
    """netkernels was split (netlayout, netheap, netmailbox, netlinks, netstats, netmessages); the
    names other modules and tests import from it stay there, re-exported (``__all__``)."""
    from emulator.engine import netkernels

    taken = set()
    for pkg in ("emulator", "netmodel", "actors", "benchmarks", "tests"):
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module == "emulator.engine.netkernels":
                    taken.update(a.name for a in node.names)
    assert {"_inject", "_views", "TABLE", "RECV_DONE"} <= taken, "the scan is wrong"
    assert not taken - set(netkernels.__all__), sorted(taken - set(netkernels.__all__))
    assert all(hasattr(netkernels, name) for name in netkernels.__all__)


def _taken_from(module: str) -> set[str]:
    """The names the project's modules, benchmarks and tests take from ``module``: imported by name,
    or read as attributes of the module imported whole (``from emulator.engine import opkernels as k``)."""
    package, _, name = module.rpartition(".")
    taken = set()
    for pkg in ("emulator", "netmodel", "actors", "benchmarks", "tests"):
        for path in (ROOT / pkg).rglob("*.py"):
            if path == ROOT.joinpath(*module.split(".")).with_suffix(".py"):
                continue
            tree = ast.parse(path.read_text())
            aliases = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == module:
                    taken.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module == package:
                    aliases.update(a.asname or a.name for a in node.names if a.name == name)
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                    taken.add(node.attr)
    return {n for n in taken if not n.startswith("__")}  # (a module's own attributes: __all__, __file__)


def test_opkernels_still_offers_every_name_taken_from_it():
    """opkernels was split (oplayout, opheap, opsends, opstreams, oploop); the names other modules
    and tests take from it, by import or as ``k.NAME``, stay there, re-exported (``__all__``)."""
    from emulator.engine import opkernels

    taken = _taken_from("emulator.engine.opkernels")
    assert {"R_SEQ", "ST_SUSPEND", "_push", "launch_step", "A_NOVF", "_NET_TABLE"} <= taken, "the scan is wrong"
    assert not taken - set(opkernels.__all__), sorted(taken - set(opkernels.__all__))
    assert all(hasattr(opkernels, name) for name in opkernels.__all__)


def test_a_cached_kernel_loads_without_the_compilers_registries(tmp_path):
    """kernel_cache loads a grouped kernel's machine code without numba's refresh of its compiler's
    registries (imports such as numba.np.polynomial); ``cached`` says when every kernel is in the cache;
    a signature missing from the cache still compiles after such a load."""
    (tmp_path / "mod.py").write_text(textwrap.dedent("""
        import numpy as np
        from numba import njit

        @njit(cache=True)
        def f(n):
            return np.arange(n).sum()

        @njit(cache=True)
        def g(x):
            return x * 2
    """))
    script = "; ".join((
        f"import sys; sys.path.insert(0, {str(tmp_path)!r})",
        "from emulator.engine import kernel_cache",
        f"kernel_cache.install(({str(tmp_path / 'mod.py')!r},))",
        "import mod; print(kernel_cache.cached((mod,)), mod.f(4), 'numba.np.polynomial' in sys.modules, mod.g(2.5))",
        "print(kernel_cache.cached((mod,)), mod.g(3))",
    ))  # fmt: skip
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))

    def run() -> list[str]:
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
        return out.stdout.split()

    assert run() == ["False", "6", "True", "5.0", "True", "6"]  # compiled: the registries loaded
    assert run() == ["True", "6", "False", "5.0", "True", "6"]  # from the cache, without them


def test_the_run_starts_no_warm_up_where_the_kernels_are_cached(monkeypatch):
    """netcore.prepare_kernels compiles ahead, in a thread, only where a kernel is missing from the cache."""
    from emulator.engine import netcore, netkernels, netmailbox, opkernels

    netcore.warm_up()
    assert kernel_cache.cached((netkernels, netmailbox, opkernels))
    for missing, started in ((False, False), (True, True)):
        monkeypatch.setattr(netcore, "_prepared", False)
        monkeypatch.setattr(netcore, "_warming", None)
        monkeypatch.setattr(netcore, "warm_up", lambda: None)
        if missing:
            monkeypatch.setattr(kernel_cache, "cached", lambda modules: False)
        netcore.prepare_kernels()
        assert (netcore._warming is not None) == started
        if started:
            netcore._warming.join()
