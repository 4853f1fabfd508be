"""Finding the program every rank runs: a user's ``path.py:function`` or the built-in workload."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path

from emulator.errors import ConfigError

_CACHE: dict[str, Callable] = {}


def load_program(spec: str) -> Callable:
    """Import ``function`` from ``path.py`` (``path.py:function``); errors name the spec."""
    if spec in _CACHE:
        return _CACHE[spec]
    if ":" not in spec:
        raise ConfigError(f"program: expected 'path.py:function', got {spec!r}")
    file_part, func_name = spec.rsplit(":", 1)
    path = Path(file_part)
    if not path.is_file():
        raise ConfigError(f"program: no file {file_part!r} (from {spec!r})")
    module_name = f"emulator_user_program_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
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
    """The program and its arguments for a run config (called inside every shard process)."""
    if config.program is not None:
        return load_program(config.program), dict(config.program_args)
    from emulator.workloads.training import training_program

    return training_program(config), dict(config.program_args)
