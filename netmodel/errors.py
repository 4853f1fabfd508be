"""The base of the project's user-fixable errors, and the configuration error.

They live here, below the engine, because the network model raises them (an invalid cluster, an
unknown collective algorithm); emulator/errors.py re-exports them with the engine's own errors, so
``except emulator.errors.ConfigError`` catches what netmodel raises (they are the same classes).
"""

from __future__ import annotations


class EmulatorError(Exception):
    """Base of every user-fixable error; the CLI prints it as one line and exits 2."""

    exit_code = 2


class ConfigError(EmulatorError):
    """Invalid configuration: the message names the key path (``cluster.nodes``)."""
