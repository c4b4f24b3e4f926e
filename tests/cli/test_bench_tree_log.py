"""`bench` says which tree it drafts, and why, before it starts measuring: a figures run cut short by a time limit
(or read while it runs) must not leave a reader guessing whether a drafter without a profile ran a chain of 3."""

from __future__ import annotations

import json

import pytest

from eaglelab import draft_registry as R
from eaglelab.cli import build_parser


def _logged_setup(tmp_path, monkeypatch, *, profile: bool) -> list[str]:
    from eaglelab.bench.setup import setup_bench

    if not profile:  # a drafter nobody tuned: no profile in the cache, none shipped beside it
        monkeypatch.setattr(R, "find_profile", lambda *a, **k: None)
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["Count to five."]}) + "\n")
    args = build_parser().parse_args(["bench", "--model", "default", "--device", "cpu", "--questions", str(questions),
                                      "--batch-sizes", "1", "--prompts", "1", "--max-new-tokens", "4"])
    logged: list[str] = []
    setup_bench(args, log=logged.append)
    return logged


@pytest.mark.usefixtures("one_thread")
def test_a_drafter_without_a_profile_says_it_drafts_the_default_chain_before_measuring(tmp_path, monkeypatch):
    logged = _logged_setup(tmp_path, monkeypatch, profile=False)
    trees = [m for m in logged if m.startswith("tree:")]
    assert trees == ["tree: 3 steps, topk 1, 4 draft tokens (default: no measured profile for this drafter on cpu "
                     "(float32); `eaglelab tune` measures one)"], logged


@pytest.mark.usefixtures("one_thread")
def test_the_shipped_drafter_says_its_profile_chose_the_tree(tmp_path, monkeypatch):
    logged = _logged_setup(tmp_path, monkeypatch, profile=True)
    trees = [m for m in logged if m.startswith("tree:")]
    assert len(trees) == 1 and "measured best for batch <= 1 on cpu" in trees[0], logged
