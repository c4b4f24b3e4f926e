"""Fixtures shared by the prompt-corpus tests."""

from __future__ import annotations

import pytest

from eaglelab.engine.training import prompt_corpus as pc


@pytest.fixture
def few_modules(monkeypatch):
    """Docstrings of three small stdlib modules only (importing every package takes ~30 s)."""
    monkeypatch.setattr(pc, "module_names", lambda roots=(): ["json", "textwrap", "fractions"])
    pc._doc_entries.cache_clear()
    yield
    pc._doc_entries.cache_clear()


@pytest.fixture(scope="module")
def evaluation():
    return pc.OverlapIndex.from_texts(pc.evaluation_texts())
