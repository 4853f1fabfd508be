"""Validation rules of typed config dataclasses: each ``validate`` reads as a list of them.

Shared by the cluster spec (netmodel/spec.py) and the run file's other sections
(emulator/config/), which re-export them from emulator/config/typed.py.
"""

from __future__ import annotations

from typing import Any

from netmodel.errors import ConfigError

MAX_SHOWN_CHARS = 40  # a value or key quoted in an error: enough to recognise, never a file's content


def shown(value: Any) -> str:
    """``repr(value)`` cut to :data:`MAX_SHOWN_CHARS`, for error messages (values may be huge, or
    the first line of a file that is not a config file)."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN_CHARS else text[: MAX_SHOWN_CHARS - 3] + "..."


def require(condition: bool, message: str) -> None:
    """Raise ConfigError(message) unless ``condition``: validation reads as a list of rules."""
    if not condition:
        raise ConfigError(message)


def require_range(obj: Any, path: str, key: str, low: float, high: float, low_open: bool = False) -> None:
    """``low <= obj.key <= high`` (``low < obj.key`` with ``low_open``), else a ConfigError naming
    ``path.key``, the broken bound and the value; None (a default to derive) passes."""
    value = getattr(obj, key)
    if value is None:
        return
    if value < low or (low_open and value == low):
        raise ConfigError(f"{path}.{key} must be {'>' if low_open else '>='} {_bound(low)}, got {_bound(value)}")
    if value > high:
        raise ConfigError(f"{path}.{key} must be <= {_bound(high)} (the emulator's limit), got {_bound(value)}")


def _bound(value: float) -> str:
    """A bound or a value in a range error: integers in full (cut if huge), floats in %g."""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:g}"
    if isinstance(value, float) and abs(value) >= 1e15:
        return f"{value:g}"
    return shown(int(value))
