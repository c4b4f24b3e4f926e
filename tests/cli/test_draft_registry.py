"""One registry turns a ``--draft`` value into a drafter, and one function holds the tree defaults: run, bench
(a real model and a scale model) and the pytest plugin all ask it (STYLE 18)."""

from __future__ import annotations

import json

import pytest

from eaglelab import draft_registry as R
from eaglelab.cli import build_parser
from eaglelab.draft_registry import TreeFlags, TreeShape, tree_defaults


def test_tree_defaults_fill_only_the_flags_not_given():
    assert tree_defaults("eagle3", TreeFlags()) == TreeShape(3, 1, 0), "a chain of 3"
    assert tree_defaults("eagle3", TreeFlags(topk=4)) == TreeShape(5, 4, 0), "a tree goes 5 deep"
    assert tree_defaults("eagle3", TreeFlags(2, 4, 8)) == TreeShape(2, 4, 8)
    assert tree_defaults("ngram", TreeFlags()) == TreeShape(4, 1, 0), "n-gram: a chain of 4"
    assert tree_defaults("ngram", TreeFlags(steps=6, topk=3)) == TreeShape(6, 1, 0), "n-gram drafts a chain"


def test_the_lookup_branch_is_the_flag_else_the_profile_buckets_with_its_tree_else_none():
    from eaglelab.profiles import BucketChoice

    bucket = BucketChoice(1, 5, 4, 24, lookup_tokens=16)
    assert tree_defaults("eagle3", TreeFlags(), bucket) == TreeShape(5, 4, 24, 16)
    assert tree_defaults("eagle3", TreeFlags(lookup_tokens=0), bucket) == TreeShape(5, 4, 24, 0), "0 turns it off"
    assert tree_defaults("eagle3", TreeFlags(lookup_tokens=4), bucket) == TreeShape(5, 4, 24, 4)
    assert tree_defaults("eagle3", TreeFlags(2, 4, 8), bucket) == TreeShape(2, 4, 8, 0), "measured with its tree only"
    assert tree_defaults("eagle3", TreeFlags(2, 4, 8, 8), bucket) == TreeShape(2, 4, 8, 8)
    assert tree_defaults("eagle3", TreeFlags(topk=4)) == TreeShape(5, 4, 0, 0)
    spec = R.tree_spec("eagle3", None, None, None, bucket, lookup_tokens=None, attention_mode="decode")
    assert (spec.tree_nodes, spec.max_depth) == (40, 16)


@pytest.fixture
def odd_defaults(monkeypatch):
    """tree_defaults answering a tree no default ever is: an entry point that does not ask it shows."""
    monkeypatch.setattr(R, "tree_defaults", lambda algorithm, flags, measured=None: TreeShape(flags.steps or 2, 1, 0))
    return 2


def _steps_in_run(tiny_dir) -> int:
    from eaglelab.session import build_session

    args = build_parser().parse_args(["run", "hi", "--model", str(tiny_dir), "--device", "cpu", "--draft", "ngram",
                                      "--no-gemv"])
    return build_session(args, log=lambda m: None).spec.num_steps


def _steps_in_bench(tmp_path, *extra: str) -> int:
    from eaglelab.bench.setup import setup_bench

    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "turns": ["Count to five."]}) + "\n")
    args = build_parser().parse_args(["bench", "--device", "cpu", "--draft", "ngram", "--questions", str(questions),
                                      "--batch-sizes", "1", "--prompts", "1", "--max-new-tokens", "4", *extra])
    return setup_bench(args, log=lambda m: None).ctx.spec.num_steps


def _steps_in_plugin(tiny_dir) -> int:
    from eaglelab.engine.formats.loader import load_target
    from eaglelab.pytest_plugin import drafter_for

    spec, drafter = drafter_for(load_target(str(tiny_dir), device="cpu"), str(tiny_dir), "ngram")
    assert drafter is not None
    return spec.num_steps


def test_every_entry_point_takes_the_n_gram_default_from_the_registry(tiny_dir, tmp_path, odd_defaults):
    assert _steps_in_run(tiny_dir) == odd_defaults
    assert _steps_in_bench(tmp_path, "--model", str(tiny_dir)) == odd_defaults
    assert _steps_in_bench(tmp_path, "--scale-model", "tiny") == odd_defaults
    assert _steps_in_plugin(tiny_dir) == odd_defaults


def test_run_bench_and_the_plugin_agree_on_the_n_gram_default(tiny_dir, tmp_path):
    want = tree_defaults("ngram", TreeFlags()).steps
    assert _steps_in_run(tiny_dir) == _steps_in_bench(tmp_path, "--scale-model", "tiny") == want
    assert _steps_in_plugin(tiny_dir) == want


def test_a_draft_choice_makes_fresh_drafters_for_any_spec(tiny_dir):
    """bench and tune rebuild a drafter per configuration from the choice's factory."""
    from eaglelab.draft_registry import choose_drafter
    from eaglelab.engine.formats.loader import load_target

    target = load_target(str(tiny_dir), device="cpu")
    ngram = choose_drafter("ngram", str(tiny_dir), target.model)
    assert ngram.kind == "ngram" and ngram.drafter() is not ngram.drafter()
    none = choose_drafter("none", str(tiny_dir), target.model, modes=dict(attention_mode="prefill", cuda_graphs=True))
    assert none.kind == "none" and none.drafter() is None and not none.spec.enabled
    assert none.spec.cuda_graphs and none.spec.attention_mode == "decode", "a plain spec keeps only the plain modes"
    default = choose_drafter("default", str(tiny_dir), target.model)
    assert default.kind == "ngram" and default.notes == ("drafter: n-gram (no drafter ships for this model)",)
