"""The capture cache key holds the source of every module the capture runs: an edit to any of them
recaptures (emulator/capture/torchrun.py, CAPTURE_MODULES).

    python -m pytest -q tests/emulator/capture/test_cache_key.py
"""

from __future__ import annotations

import shutil

from emulator.capture import torchrun
from tests.test_layers import import_graph

GPU = {"gpu_name": "NVIDIA H100", "capacity_bytes": 80 << 30, "major": 9, "minor": 0, "sms": 132}


def _imported_from(graph: dict[str, set[str]], start: str) -> set[str]:
    """``start`` and every project module it imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def test_every_module_the_capture_runs_is_in_the_cache_key():
    # what `python -m emulator.capture.rank` imports of the project: a module left out of
    # CAPTURE_MODULES could change the captures without changing the key
    ran = _imported_from(import_graph(), "emulator.capture.rank")
    hashed = {f"emulator.capture.{name.removesuffix('.py')}" for name in torchrun.CAPTURE_MODULES}
    assert ran - hashed == set()
    assert hashed - ran == set()  # nothing hashed that the capture does not run (a stale name)


def test_an_edit_to_any_capture_module_changes_the_key(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    code = tmp_path / "capture"
    shutil.copytree(torchrun.CAPTURE_DIR, code, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(torchrun, "CAPTURE_DIR", code)

    def key() -> str:
        return torchrun.cache_key(script, [], "2.13.0", 1, 2, GPU, "auto")

    keys = {key()}
    for name in torchrun.CAPTURE_MODULES:
        path = code / name
        path.write_text(path.read_text() + "\n# edited\n")
        keys.add(key())
    assert len(keys) == 1 + len(torchrun.CAPTURE_MODULES)
