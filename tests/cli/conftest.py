"""Fixtures the CLI tests share."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_model(monkeypatch):
    """Any attempt to load a model fails the test: the command had to refuse before."""
    import eaglelab.engine.formats.loader as loader

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(loader, "load_target", refuse)
    monkeypatch.setattr(loader, "resolve_model_dir", refuse)
