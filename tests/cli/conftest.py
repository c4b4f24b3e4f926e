"""Fixtures the CLI tests share."""

from __future__ import annotations

import json

import pytest

# two MT-bench-shaped first turns: what a bench test needs as --questions
TWO_QUESTIONS = [{"question_id": i, "category": "writing", "turns": [text]}
                 for i, text in enumerate(["Write a haiku about the sea.", "What is 12 times 12?"])]


@pytest.fixture()
def questions(tmp_path):
    """A question.jsonl of TWO_QUESTIONS (a test file may define its own ``questions``)."""
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in TWO_QUESTIONS) + "\n")
    return path


@pytest.fixture()
def idle_machine(monkeypatch):
    """The machine's load as an idle one's (others' work on a shared test machine must not change what a test sees)."""
    from eaglelab.bench import suite
    from eaglelab.bench.timing import MachineLoad

    monkeypatch.setattr(suite, "machine_load", lambda own: MachineLoad(own, 2, own))


@pytest.fixture
def no_model(monkeypatch):
    """Any attempt to load a model fails the test: the command had to refuse before."""
    import eaglelab.engine.formats.loader as loader

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the flags were checked")

    monkeypatch.setattr(loader, "load_target", refuse)
    monkeypatch.setattr(loader, "resolve_model_dir", refuse)
