"""Loading run files: YAML, references to other config files, ``--set`` overrides.

A run file may inline ``cluster``, ``model``, ``parallel`` and ``training`` or reference them: a
path (``../clusters/dgx-a100-hdr.yaml``, relative to the file that names it) or a preset name
(``dgx-a100-hdr``, looked up in ``configs/clusters/`` or ``configs/models/``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from emulator.config.schema import RunConfig
from emulator.config.typed import from_dict
from emulator.errors import ConfigError

CONFIG_ROOT = Path(__file__).resolve().parents[2] / "configs"
PRESET_DIRS = {"cluster": "clusters", "model": "models", "parallel": "parallel", "training": "training"}


def read_yaml(path: Path) -> Any:
    """Parse one YAML file; a missing or malformed file is a ConfigError naming it."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None


def preset_names(kind: str) -> list[str]:
    """Names of the shipped presets of one kind (``cluster`` or ``model``)."""
    folder = CONFIG_ROOT / PRESET_DIRS[kind]
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def resolve_reference(kind: str, ref: str, base_dir: Path) -> tuple[dict, Path]:
    """Load the mapping a string reference names: a path, else a shipped preset name."""
    candidates = [base_dir / ref, Path.cwd() / ref, CONFIG_ROOT / ref]
    if kind in PRESET_DIRS:
        candidates.append(CONFIG_ROOT / PRESET_DIRS[kind] / f"{ref}.yaml")
    for candidate in candidates:
        if candidate.is_file():
            data = read_yaml(candidate)
            if not isinstance(data, dict):
                raise ConfigError(f"{kind}: {candidate} does not hold a mapping")
            # a preset file may wrap its content in its kind's key (cluster: {...})
            if set(data) == {kind}:
                data = data[kind]
            return data, candidate.parent
    known = ", ".join(preset_names(kind)) if kind in PRESET_DIRS else ""
    raise ConfigError(f"{kind}: no file or preset named {ref!r}" + (f"; presets: {known}" if known else ""))


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``key.path=value`` into the key path and a YAML-parsed value."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    keys = [k for k in key.strip().split(".") if k]
    if not keys:
        raise ConfigError(f"--set {text!r}: empty key path")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return keys, value


def apply_override(data: dict, keys: list[str], value: Any) -> None:
    """Set ``data[k1][k2]... = value``, descending into lists by index."""
    node: Any = data
    for depth, key in enumerate(keys[:-1]):
        path = ".".join(keys[: depth + 1])
        if isinstance(node, list):
            node = node[_index(key, node, path)]
        else:
            if node.get(key) is None:
                node[key] = {}
            node = node[key]
        if not isinstance(node, (dict, list)):
            raise ConfigError(f"--set {'.'.join(keys)}: '{path}' is a value, not a section")
    last = keys[-1]
    if isinstance(node, list):
        node[_index(last, node, ".".join(keys))] = value
    else:
        node[last] = value


def _index(key: str, node: list, path: str) -> int:
    if not key.isdigit() or int(key) >= len(node):
        raise ConfigError(f"--set: '{path}' must be an index below {len(node)}")
    return int(key)


def _deep_merge(base: dict, extra: dict) -> dict:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _deep_merge(base[key], value)
        else:
            base[key] = value
    return base


def load_run_dict(path: str | Path, overrides: list[str] = ()) -> tuple[dict, Path]:
    """The run file as plain data with references resolved and overrides applied."""
    run_path = Path(path)
    data = read_yaml(run_path)
    if not isinstance(data, dict):
        raise ConfigError(f"{run_path}: a run file must be a mapping")
    data = copy.deepcopy(data)
    base = run_path.resolve().parent
    for kind in ("cluster", "model", "parallel", "training"):
        value = data.get(kind)
        if isinstance(value, str):
            data[kind], _ = resolve_reference(kind, value, base)
        elif isinstance(value, dict) and isinstance(value.get("from"), str):
            # {from: preset-or-path, key: value ...}: the referenced config with some keys changed
            loaded, _ = resolve_reference(kind, value["from"], base)
            data[kind] = _deep_merge(copy.deepcopy(loaded), {k: v for k, v in value.items() if k != "from"})
    if isinstance(data.get("program"), str) and ":" in data["program"]:
        file_part, func = data["program"].rsplit(":", 1)
        if not Path(file_part).is_absolute() and (base / file_part).is_file():
            data["program"] = f"{base / file_part}:{func}"
    data.setdefault("name", run_path.stem)
    for text in overrides:
        keys, value = parse_override(text)
        if keys[0] in ("cluster", "model") and isinstance(value, str) and len(keys) == 1:
            value, _ = resolve_reference(keys[0], value, Path.cwd())
        apply_override(data, keys, value)
    return data, base


def load_run(path: str | Path, overrides: list[str] = ()) -> RunConfig:
    """Load and strictly validate a run file; raises ConfigError naming the key path."""
    data, _ = load_run_dict(path, overrides)
    return from_dict(RunConfig, data, "")


def load_cluster(ref: str | Path, overrides: list[str] = ()) -> Any:
    """Load a cluster file or preset on its own (``collbench --cluster``)."""
    from emulator.config.cluster import ClusterConfig

    data, _ = resolve_reference("cluster", str(ref), Path.cwd())
    data = copy.deepcopy(data)
    for text in overrides:
        keys, value = parse_override(text)
        if keys[0] == "cluster":
            keys = keys[1:]
        apply_override(data, keys, value)
    return from_dict(ClusterConfig, data, "cluster")
