"""the README (Results): its Python examples run as written (from the repository root)."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

DOC = ROOT / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_doc_has_python_examples():
    """The notebook section holds the examples run below."""
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_python_example_runs(index, monkeypatch):
    """Each ```python block of the doc runs without error (pandas blocks need pandas)."""
    code = BLOCKS[index]
    if code.startswith("# needs pandas"):
        pytest.importorskip("pandas")
    monkeypatch.chdir(ROOT)
    exec(compile(code, f"{DOC}:block{index}", "exec"), {"__name__": "__doc_example__"})
