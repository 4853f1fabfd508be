"""Strict conversion of plain YAML data into typed dataclasses.

The dataclasses are the truth; YAML is their serialisation. Every error names the full key path
(``cluster.scale_up.bandwidth_GBps``) and, for an unknown key, the closest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Literal, Union, get_args, get_origin

from emulator.errors import ConfigError

# the validation rules are shared with the cluster spec (netmodel/spec.py), below the engine
from netmodel.rules import MAX_SHOWN_CHARS, require, require_range, shown

__all__ = ["MAX_SHOWN_CHARS", "convert", "from_dict", "require", "require_range", "shown", "shown_key", "to_dict"]


def _type_name(tp: Any) -> str:
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def shown_key(key: Any) -> str:
    """A key as error messages quote it: as text, cut like :func:`shown`."""
    text = str(key)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


def _number(value: Any) -> Any:
    """A string that is a Python number literal (``1e30``, which YAML 1.1 reads as a string) as the
    number; anything else unchanged."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _closest(key: str, valid: list[str]) -> str:
    match = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
    if match:
        return f"; did you mean '{match[0]}'?"
    return f"; valid keys: {', '.join(sorted(valid))}"


def convert(tp: Any, value: Any, path: str) -> Any:
    """Convert ``value`` to type ``tp`` or raise :class:`ConfigError` naming ``path``."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return convert(arg, value, path)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: {shown(value)} fits none of {_type_name(tp)}")
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(f"{path}: {shown(value)} is not one of {', '.join(map(repr, choices))}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__} {shown(value)}")
        (item,) = get_args(tp) or (Any,)
        return [convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__} {shown(value)}")
        key_tp, val_tp = get_args(tp) or (Any, Any)
        return {convert(key_tp, k, f"{path}"): convert(val_tp, v, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true or false, got {shown(value)}")
        return value
    if tp is int:
        number = _number(value)
        if isinstance(number, bool) or not isinstance(number, int):
            if isinstance(number, float) and number.is_integer():
                return int(number)
            raise ConfigError(f"{path}: expected an integer, got {shown(value)}")
        return number
    if tp is float:
        number = _number(value)
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {shown(value)}")
        try:
            number = float(number)
        except OverflowError:  # an int beyond the float range
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(f"{path}: expected a finite number, got {shown(value)}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {shown(value)}")
        return value
    raise AssertionError(f"unsupported config type {tp!r} at {path}")


def from_dict(cls: type, data: Any, path: str) -> Any:
    """Build dataclass ``cls`` from mapping ``data``; unknown keys and wrong types fail."""
    if isinstance(data, cls):
        return data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(data).__name__} {shown(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    prefix = f"{path}." if path else ""
    for key in data:
        if key not in fields:
            raise ConfigError(f"unknown key '{prefix}{shown_key(key)}'{_closest(str(key), list(fields))}")
    kwargs = {}
    for name, field in fields.items():
        if name in data:
            kwargs[name] = convert(hints[name], data[name], f"{prefix}{name}")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing key '{prefix}{name}' ({_type_name(hints[name])})")
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if validate is not None:
        validate(path)
    return obj


def to_dict(obj: Any) -> Any:
    """Plain-data form of a config dataclass (the resolved config written with every run)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, list):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj
