"""Fixtures shared by the prompt-corpus tests."""

from __future__ import annotations

import pytest

from eaglelab.engine.training import prompt_corpus as pc


@pytest.fixture
def few_modules(monkeypatch):
    """Docstrings of three small stdlib modules only, read in this process (the whole walk, in its child process,
    takes ~10-30 s)."""
    entries = tuple(pc.gather_doc_entries(["json", "textwrap", "fractions"]))
    monkeypatch.setattr(pc, "_doc_entries", lambda: entries)
    yield


@pytest.fixture(scope="module")
def evaluation():
    return pc.OverlapIndex.from_texts(pc.evaluation_texts())
