"""Finding the program every rank runs: a user's ``path.py:function``, the built-in workload, or,
for a run with ``jobs``, each rank's job's program on the job's view of the GPU."""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from emulator.config.loader import read_bounded
from emulator.errors import ConfigError

_CACHE: dict[str, Callable] = {}
MAX_PROGRAM_BYTES = 16 << 20  # a program file larger than this is not a program someone wrote


def _split(spec: str) -> tuple[str, str]:
    if ":" not in spec:
        raise ConfigError(f"program: expected 'path.py:function', got {spec!r}")
    return spec.rsplit(":", 1)


def check_program(spec: str) -> None:
    """Check, without running anything, that ``path.py:function`` names a Python file that defines
    ``function`` at module level (``def``, an assignment or an import of that name); ConfigError
    otherwise. ``emulator check`` calls it: executing the file could have effects or take forever.
    """
    file_part, func_name = _split(spec)
    path = Path(file_part)
    if not path.is_file():
        raise ConfigError(f"program: no file {file_part!r} (from {spec!r})")
    source = read_bounded(path, MAX_PROGRAM_BYTES, "program: cannot read", "not a Python program")
    try:
        tree = ast.parse(source, filename=file_part)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:  # ValueError: NUL bytes
        line = getattr(exc, "lineno", None)
        where = f" (line {line}: {type(exc).__name__})" if line else f" ({type(exc).__name__})"
        raise ConfigError(f"program: {file_part} is not a Python program{where}") from None
    names = _module_names(tree)
    if func_name not in names:
        defined = ", ".join(sorted(n for n in names if not n.startswith("_"))) or "nothing"
        raise ConfigError(f"program: {file_part} has no function {func_name!r}; it defines {defined}")


def _module_names(tree: ast.Module) -> set[str]:
    """Names bound at the module level of ``tree``: functions, classes, assignments, imports."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def load_program(spec: str) -> Callable:
    """Import ``function`` from ``path.py`` (``path.py:function``); errors name the spec."""
    if spec in _CACHE:
        return _CACHE[spec]
    file_part, func_name = _split(spec)
    path = Path(file_part)
    if not path.is_file():
        raise ConfigError(f"program: no file {file_part!r} (from {spec!r})")
    if not any(file_part.endswith(suffix) for suffix in importlib.machinery.SOURCE_SUFFIXES):
        check_program(spec)  # a file not named .py: refuse what is not Python before executing it
    module_name = f"emulator_user_program_{abs(hash(str(path.resolve())))}"
    # an explicit source loader: spec_from_file_location finds none for a name without .py
    loader_spec = importlib.util.spec_from_loader(
        module_name, importlib.machinery.SourceFileLoader(module_name, str(path)), origin=str(path)
    )
    assert loader_spec is not None and loader_spec.loader is not None
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:
        raise ConfigError(f"program: importing {file_part} failed: {type(exc).__name__}: {exc}") from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        known = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise ConfigError(f"program: {file_part} has no function {func_name!r}; it defines {', '.join(known)}")
    _CACHE[spec] = func
    return func


def forget_program(spec: str) -> None:
    """Drop ``spec`` from the import cache, so that the next load reads the file again."""
    _CACHE.pop(spec, None)


def resolve_program(config) -> tuple[Callable, dict]:
    """The program and its arguments for a run config (called inside every shard process); for a
    run with ``jobs``, each rank's job's program (:func:`jobs_program`)."""
    if getattr(config, "jobs", None):
        return jobs_program(config), {}
    if config.program is not None:
        return load_program(config.program), dict(config.program_args)
    from emulator.workloads.training import training_program

    return training_program(config), dict(config.program_args)


def jobs_program(config) -> Callable:
    """The program of every rank of a run with ``jobs``: its job's program, on the job's view of
    the GPU (called once per shard, like any program). Where each job runs comes from
    emulator/config/jobs.py; the rank mapping is the mock GPU API's (``GPU.for_job``)."""
    from emulator.engine.api import JobRanks

    entries = []
    owner: dict[int, int] = {}
    for index, job in enumerate(config.jobs):
        program, args = resolve_program(job.run)
        entries.append((JobRanks(job.name, job.ranks, job.run.training.precision), program, args, job.run))
        owner.update(dict.fromkeys(job.ranks, index))

    def program(gpu) -> None:
        index = owner.get(gpu.rank)
        if index is None:
            return  # a GPU no job occupies stays idle
        ranks, job_program, args, job_config = entries[index]
        job_program(gpu.for_job(ranks, args, job_config))

    return program
