"""The import graph of emulator/, netmodel/ and actors/: no cycles, and imports only downwards
through the layers that ARCHITECTURE.md lists (its "Layers" block is parsed here, so the page and
the code cannot drift apart).

    python -m pytest -q tests/test_layers.py

Every import counts, also those inside functions (a lazy import still ties the two modules
together; it only hides the cycle until run time).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("emulator", "netmodel", "actors")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the project's packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports_of(name: str, source: str, is_package: bool, known: set[str]) -> set[str]:
    """The project modules ``name`` imports anywhere in ``source`` (function bodies included)."""
    here = name.split(".") if is_package else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import mod` imports the submodule; `from mod import name` the module
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` where only a.b is ours, say
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    files = module_files(root)
    known = set(files)
    return {name: imports_of(name, path.read_text(), path.name == "__init__.py", known) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        # iterative over each node's edges would be longer; the graph is a few hundred modules deep at most
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def read_layers(text: str) -> list[list[str]]:
    """The layers of ARCHITECTURE.md, top first: the code block under its "## Layers" heading, one
    layer a line, ``name  package, package, ...`` (the first word names the layer)."""
    match = re.search(r"^## Layers.*?^```\w*\n(.*?)^```", text, re.S | re.M)
    assert match, "ARCHITECTURE.md has no code block under '## Layers'"
    layers = []
    for line in match.group(1).splitlines():
        if line.strip():
            _, _, rest = line.strip().partition(" ")
            layers.append([p.strip() for p in rest.split(",") if p.strip()])
    return layers


def owner(module: str, layers: list[list[str]]) -> tuple[int, str] | None:
    """(layer index, package) of the longest package prefix of ``module`` in ``layers``."""
    best = None
    for depth, packages in enumerate(layers):
        for package in packages:
            inside = module == package or module.startswith(package + ".")
            if inside and (best is None or len(package) > len(best[1])):
                best = (depth, package)
    return best


def upward_imports(graph: dict[str, set[str]], layers: list[list[str]]) -> list[str]:
    """Imports that go sideways or up: to a package of the same layer or of a higher one."""
    bad = []
    for module in sorted(graph):
        mine = owner(module, layers)
        for target in sorted(graph[module]):
            theirs = owner(target, layers)
            if mine is None or theirs is None or mine[1] == theirs[1]:
                continue
            if theirs[0] <= mine[0]:
                bad.append(f"{module} (layer {mine[0] + 1}) imports {target} (layer {theirs[0] + 1})")
    return bad


@pytest.fixture(scope="module")
def graph():
    return import_graph()


@pytest.fixture(scope="module")
def layers():
    return read_layers((ROOT / "ARCHITECTURE.md").read_text())


def test_no_import_cycles(graph):
    """No two modules import each other, directly or round a longer loop."""
    assert cycles(graph) == []


def test_imports_go_downwards(graph, layers):
    """Every import stays in its package or goes to a package of a lower layer."""
    assert upward_imports(graph, layers) == []


def test_every_module_has_a_layer(graph, layers):
    """A new package must be placed in ARCHITECTURE.md's layers before its imports are checked."""
    assert [m for m in sorted(graph) if owner(m, layers) is None] == []


def test_top_level_of_emulator_is_packages(graph):
    """emulator/'s top level: packages and the package face only."""
    top = sorted(p.stem for p in (ROOT / "emulator").glob("*.py"))
    assert top == ["__init__", "__main__", "api", "cli", "errors"]


def test_the_checks_catch_a_cycle_and_an_upward_import():
    """The checkers themselves: a three-module loop is found, an import from engine up to the
    runner is reported, and an import down is not."""
    loop = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(loop) == [["a", "b", "c"]]
    layered = [["emulator.runner"], ["emulator.engine"]]
    up = {"emulator.engine.shard": {"emulator.runner.sequence"}, "emulator.runner.sequence": set()}
    assert upward_imports(up, layered) == [
        "emulator.engine.shard (layer 2) imports emulator.runner.sequence (layer 1)"
    ]
    down = {"emulator.runner.sequence": {"emulator.engine.shard"}, "emulator.engine.shard": set()}
    assert upward_imports(down, layered) == []


def test_a_lazy_import_inside_a_function_counts():
    """An import in a function body is an edge like any other."""
    source = "def f():\n    from emulator.runner.sequence import run_job\n"
    known = {"emulator.runner.sequence", "emulator.engine.shard"}
    assert imports_of("emulator.engine.shard", source, False, known) == {"emulator.runner.sequence"}


# third-party packages only some modules may import (ARCHITECTURE.md, "Rules the layers do not show")
CONFINED = {"ray": ("actors",), "prometheus_client": ("emulator.monitoring",)}


def external_importers(root: Path = ROOT) -> dict[str, set[str]]:
    """Third-party top-level package -> the project modules that import it (anywhere in the file)."""
    found: dict[str, set[str]] = {}
    for name, path in module_files(root).items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""]
            else:
                continue
            for target in targets:
                found.setdefault(target.split(".")[0], set()).add(name)
    return found


def test_torch_ray_and_prometheus_are_imported_only_where_allowed():
    """torch only in the capture modules (emulator/capture/: those `python -m emulator.capture.rank`
    runs, the ones its cache key hashes; never torchrun.py or identity.py, which the CLI imports),
    ray only in actors/, prometheus_client only in emulator/monitoring/."""
    from emulator.capture.torchrun import CAPTURE_MODULES

    found = external_importers()
    capture = {f"emulator.capture.{name.removesuffix('.py')}" for name in CAPTURE_MODULES}
    assert found.get("torch", set()) - capture == set()
    assert {"emulator.capture.torchrun", "emulator.capture.identity"} & found.get("torch", set()) == set()
    for package, allowed in CONFINED.items():
        outside = {m for m in found.get(package, set()) if not any(m == a or m.startswith(a + ".") for a in allowed)}
        assert outside == set(), package
