"""The Python examples of README.md and docs/*.md run as written (from the repository root).

    python -m pytest -q tests/test_doc_examples.py
"""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCKS = [(doc, i, code) for doc in DOCS for i, code in enumerate(re.findall(r"```python\n(.*?)```", doc.read_text(),
                                                                                flags=re.S))]  # fmt: skip


def test_the_docs_have_python_examples():
    """The notebook examples (README and docs/outputs.md) are among the blocks run below."""
    assert {doc.name for doc, _, _ in BLOCKS} >= {"README.md", "outputs.md"}


@pytest.mark.parametrize("doc,index,code", BLOCKS, ids=[f"{d.name}:{i}" for d, i, _ in BLOCKS])
def test_python_example_runs(doc, index, code, monkeypatch):
    """Each ```python block runs without error (blocks that start with '# needs pandas' need pandas)."""
    if code.startswith("# needs pandas"):
        pytest.importorskip("pandas")
    monkeypatch.chdir(ROOT)
    exec(compile(code, f"{doc}:block{index}", "exec"), {"__name__": "__doc_example__"})
