"""Loading run files: YAML, references to other config files, ``--set`` overrides.

A run file may inline ``cluster``, ``model``, ``parallel`` and ``training`` or reference them: a
path (``../clusters/dgx-a100-hdr.yaml``, relative to the file that names it) or a preset name
(``dgx-a100-hdr``, looked up in ``configs/clusters/`` or ``configs/models/``).
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import yaml

from emulator.config.schema import ClusterConfig, ModelConfig, ParallelConfig, RunConfig, TrainingConfig
from emulator.config.typed import from_dict, shown_key, to_dict
from emulator.errors import ConfigError

CONFIG_ROOT = Path(__file__).resolve().parents[2] / "configs"
PRESET_DIRS = {"cluster": "clusters", "model": "models", "parallel": "parallel", "training": "training"}
# the keys each kind of referenced file may hold: a file with none of them is another kind of file
KIND_KEYS = {
    kind: {f.name for f in dataclasses.fields(cls)}
    for kind, cls in (
        ("cluster", ClusterConfig),
        ("model", ModelConfig),
        ("parallel", ParallelConfig),
        ("training", TrainingConfig),
    )
}


MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: the largest shipped run or cluster file is ~2 kB
# Nodes of a document with every alias expanded: what anything walking the data (deepcopy, the
# typed conversion, config.yaml, JSON) will visit. A "billion laughs" document is a few hundred
# bytes with few aliases but ~10^9 nodes once expanded; a real config file has a few hundred.
MAX_EXPANDED_NODES = 1_000_000  # about what 1 MiB of plain YAML can hold ("[1,1,1,...")
MAX_DEPTH = 64  # nesting of mappings and lists; the deepest real config has 4


def read_yaml(path: Path) -> Any:
    """Parse one YAML file; a missing, oversized or malformed file is a ConfigError naming it.

    Bounded: at most :data:`MAX_CONFIG_BYTES` of text, :data:`MAX_DEPTH` levels of nesting and
    :data:`MAX_EXPANDED_NODES` nodes with aliases expanded, so that no file hangs or exhausts memory.
    """
    raw = read_bounded(path, MAX_CONFIG_BYTES, "cannot read config file", "not a config file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (not UTF-8)") from None
    return parse_yaml(text, str(path))


def read_bounded(path: Path, max_bytes: int, cannot_read: str, too_large: str) -> bytes:
    """The bytes of ``path``, reading no more than ``max_bytes`` + 1 of them (a config or program
    may name /dev/zero or a huge file); ConfigError ``"{cannot_read} PATH: why"`` when unreadable,
    ``"PATH: larger than N MiB; {too_large}"`` when larger than ``max_bytes``."""
    try:
        with path.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(f"{cannot_read} {path}: {exc.strerror}") from None
    if len(raw) > max_bytes:
        raise ConfigError(f"{path}: larger than {max_bytes >> 20} MiB; {too_large}")
    return raw


def parse_yaml(text: str, source: str) -> Any:
    """Safe-load ``text`` (a file's), refusing alias bombs and deep nesting; errors name ``source``
    and never quote the text beyond a short cut of the parser's message."""
    try:
        return _load_bounded(text, source)
    except yaml.MarkedYAMLError as exc:
        if "nesting depth" in str(exc.problem):
            # libyaml >= 0.2.6 (PyYAML 6.0.2's wheels on) stops at its own depth limit while scanning
            # ahead, before the parser's events reach ours: the same refusal, said the same way
            raise ConfigError(f"{source}: nested too deeply (more than {MAX_DEPTH} levels)") from None
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{source}: invalid YAML{where}: {shown_key(exc.problem or exc.context)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {shown_key(str(exc).splitlines()[0])}") from None


# the C parser when PyYAML was built with libyaml: the same documents, ~10x faster on large files
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_bounded(text: str, source: str) -> Any:
    """``yaml.safe_load`` with the size and depth checks of :func:`_check_size` between composing the
    document (aliases are shared nodes then) and constructing it; YAML errors propagate."""
    _check_depth(text, source)
    loader = _SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_size(node, source)
        return loader.construct_document(node)
    except RecursionError:
        raise ConfigError(f"{source}: nested too deeply (more than {MAX_DEPTH} levels)") from None
    finally:
        loader.dispose()


def _check_depth(text: str, source: str) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` from the parser's events, before composing: the
    composer recurses per level (libyaml's crashes the interpreter at ~10^5 levels of ``[[[...``)."""
    depth = 0
    for event in yaml.parse(text, Loader=_SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(f"{source}: nested too deeply (more than {MAX_DEPTH} levels)")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_size(root: yaml.Node, source: str) -> None:
    """Count the nodes of the composed document with aliases expanded (each distinct node once,
    memoised, so this is linear in the text) and its depth; refuse recursive aliases."""
    expanded: dict[int, int] = {}
    depth_of: dict[int, int] = {}
    # iterative post-order walk: a node's size is 1 + its children's expanded sizes
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    open_nodes: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_nodes.discard(key)
            kids = _children(node)
            expanded[key] = 1 + sum(expanded[id(k)] for k in kids)
            depth_of[key] = 1 + max((depth_of[id(k)] for k in kids), default=0)
            if expanded[key] > MAX_EXPANDED_NODES:
                raise ConfigError(
                    f"{source}: more than {MAX_EXPANDED_NODES} values once aliases are expanded (an alias bomb?)"
                )
            if depth_of[key] > MAX_DEPTH:
                raise ConfigError(f"{source}: nested too deeply (more than {MAX_DEPTH} levels)")
            continue
        if key in expanded:
            continue
        if key in open_nodes:
            raise ConfigError(f"{source}: an alias refers to a value that contains it (recursive alias)")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in _children(node) if id(k) not in expanded)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def preset_names(kind: str) -> list[str]:
    """Names of the shipped presets of one kind (``cluster`` or ``model``)."""
    folder = CONFIG_ROOT / PRESET_DIRS[kind]
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def resolve_reference(kind: str, ref: str, base_dir: Path) -> tuple[dict, Path]:
    """Load the mapping a string reference names: a path, else a shipped preset name.

    A file that is not a mapping of ``kind``'s keys is refused without quoting what it holds: the
    reference may name any file (``cluster: /etc/shadow``), and errors must not print its content.
    """
    candidates = [base_dir / ref, Path.cwd() / ref, CONFIG_ROOT / ref]
    if kind in PRESET_DIRS:
        candidates.append(CONFIG_ROOT / PRESET_DIRS[kind] / f"{ref}.yaml")
    for candidate in candidates:
        if candidate.is_file():
            not_kind = f"{kind}: {candidate.resolve()} is not a {kind} file"
            try:
                data = read_yaml(candidate)
            except ConfigError as exc:
                if "invalid YAML" not in str(exc):  # unreadable, too large: says nothing of the content
                    raise
                raise ConfigError(f"{not_kind} (not valid YAML)") from None
            if not isinstance(data, dict):
                raise ConfigError(f"{not_kind} (expected a YAML mapping)")
            # a preset file may wrap its content in its kind's key (cluster: {...})
            if set(data) == {kind}:
                data = data[kind]
                if not isinstance(data, dict):
                    raise ConfigError(f"{not_kind} (expected a YAML mapping under '{kind}')")
            valid = KIND_KEYS.get(kind)
            if data and valid is not None and not any(key in valid for key in data):
                raise ConfigError(f"{not_kind} (none of its keys is a {kind} key)")
            return data, candidate.parent
    known = ", ".join(preset_names(kind)) if kind in PRESET_DIRS else ""
    raise ConfigError(f"{kind}: no file or preset named {shown_key(ref)}" + (f"; presets: {known}" if known else ""))


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``key.path=value`` into the key path and a YAML-parsed value."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    keys = [k for k in key.strip().split(".") if k]
    if not keys:
        raise ConfigError(f"--set {text!r}: empty key path")
    try:
        value = _load_bounded(raw, f"--set {shown_key(key.strip())}") if raw.strip() else ""
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
    if data is None:
        raise ConfigError(f"{run_path} is empty")
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ConfigError(f"{run_path}: a run file must be a YAML mapping (key: value lines), got a {kind}")
    data = copy.deepcopy(data)
    base = run_path.resolve().parent
    _resolve_references(data, base)
    data.setdefault("name", run_path.stem)
    for text in overrides:
        keys, value = parse_override(text)
        if keys[0] in ("cluster", "model") and isinstance(value, str) and len(keys) == 1:
            value, _ = resolve_reference(keys[0], value, Path.cwd())
        apply_override(data, keys, value)
    if isinstance(data.get("jobs"), list):  # after the overrides: --set jobs.0.run=... is resolved too
        data["jobs"] = [_resolve_job(job, i, base) for i, job in enumerate(data["jobs"])]
    return data, base


def _resolve_references(data: dict, base: Path) -> None:
    """Replace the references of a run (or job) mapping in place: ``cluster``, ``model``,
    ``parallel``, ``training`` named by path or preset (or ``{from: ..., key: value}``), and a
    ``program`` path relative to ``base``."""
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


def _resolve_job(job: Any, index: int, base: Path) -> Any:
    """One entry of ``jobs``: its ``run`` file (relative to the jobs file, else to the working
    directory) gives every key the entry does not (nested mappings merged key by key); then its
    references are resolved like a run file's. Named after its run file unless it has a name."""
    if not isinstance(job, dict):
        return job  # the typed conversion says what is wrong with it
    job = copy.deepcopy(job)
    ref = job.pop("run", None)
    if ref is not None:
        where = f"jobs[{index}].run"
        if not isinstance(ref, str):
            raise ConfigError(f"{where}: expected the path of a run file, got {type(ref).__name__}")
        path = next((p for p in (base / ref, Path.cwd() / ref) if p.is_file()), None)
        if path is None:
            raise ConfigError(f"{where}: no run file {shown_key(ref)} (relative to {base} or the working directory)")
        raw = read_yaml(path)  # looked at before loading: a run file with jobs could name this file again
        for key in ("jobs", "placement", "faults", "engine"):
            if isinstance(raw, dict) and key in raw:
                raise ConfigError(
                    f"{where}: {path.name} has '{key}'; a job is one run, and on a shared cluster {key} "
                    "belongs to the top level of the jobs file"
                )
        loaded, _ = load_run_dict(path)
        job = _deep_merge(loaded, job)
    _resolve_references(job, base)
    job.setdefault("name", f"job{index}")
    return job


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


def _override_pairs(overrides: dict | list | tuple | None) -> list[tuple[list[str], Any]]:
    """``{"a.b": 1}`` or ``["a.b=1"]`` (the ``--set`` syntax) as (key path, value) pairs."""
    if not overrides:
        return []
    if isinstance(overrides, dict):
        pairs = []
        for key, value in overrides.items():
            keys = [k for k in str(key).split(".") if k]
            if not keys:
                raise ConfigError(f"overrides: empty key path {key!r}")
            pairs.append((keys, value))
        return pairs
    if isinstance(overrides, str):
        raise ConfigError("overrides: give a dict {'key.path': value} or a list of 'key.path=value' strings")
    return [parse_override(text) for text in overrides]


def load_config(path_or_config, overrides: dict | list | None = None):
    """A validated RunConfig from a run file path, a RunConfig or a plain dict, overrides applied."""
    if isinstance(path_or_config, (str, Path)):
        data, _ = load_run_dict(path_or_config, [])
    elif isinstance(path_or_config, RunConfig):
        data = to_dict(path_or_config)
    elif isinstance(path_or_config, dict):
        data = to_dict(path_or_config)  # a deep copy: the caller's dict is left alone
        for kind in ("cluster", "model", "parallel", "training"):
            if isinstance(data.get(kind), str):  # a preset name or file, as in a run file
                data[kind], _ = resolve_reference(kind, data[kind], Path.cwd())
    else:
        raise ConfigError(
            f"run(): expected a run file path, a RunConfig or a dict, got {type(path_or_config).__name__}"
        )
    for keys, value in _override_pairs(overrides):
        # as with --set: cluster=<preset or file> and model=<preset or file> load the referenced config
        if keys[0] in ("cluster", "model") and isinstance(value, str) and len(keys) == 1:
            value, _ = resolve_reference(keys[0], value, Path.cwd())
        apply_override(data, keys, value)
    return from_dict(RunConfig, data, "")
