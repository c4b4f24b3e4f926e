"""benchmarks/drafter_acceptance.py: its per-position acceptance, the MT-bench categories it groups by (the same
spread of questions the bench harness picks), the per-group figures and the draft vocabulary's coverage."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from benchmarks.drafter_acceptance import by_group, draft_vocabulary, mtbench_categories, per_position, share
from eaglelab.bench.harness import mtbench_first_turns


def test_per_position_is_conditional_on_reaching_the_position():
    # accepted lengths (bonus included) 1, 2, 4, 4: position 0 reached 4 times, accepted 3; position 1: 3 and 2 ...
    assert per_position([1, 2, 4, 4], 3) == [0.75, pytest.approx(2 / 3), 1.0]
    assert per_position([], 2) == [0.0, 0.0]


def test_categories_follow_the_questions_the_harness_picks(tmp_path):
    lines = [{"question_id": i, "category": f"c{i // 3}", "turns": [f"question {i}"]} for i in range(9)]
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    turns, cats = mtbench_first_turns(4, path), mtbench_categories(4, str(path))
    assert [lines[int(t.split()[1])]["category"] for t in turns] == cats == ["c0", "c0", "c1", "c2"]


def test_groups_pool_their_prompts_cycles_and_coverage():
    groups = by_group(["a", "b", "a"], [[1, 2], [4], [3]], 3)
    assert groups["a"] == {"prompts": 2, "cycles": 3, "mean_accept_len": 2.0, "per_position_acceptance": [
        pytest.approx(2 / 3), 0.5, 0.0]}
    assert groups["b"]["mean_accept_len"] == 4.0 and list(groups) == ["a", "b"]
    assert share([(3, 4), (1, 4)]) == 0.5 and share([]) is None


def test_the_draft_vocabulary_is_read_from_an_eagle3_head_only():
    t2d = torch.tensor([True, False, True])
    assert draft_vocabulary(SimpleNamespace(drafter=SimpleNamespace(net=SimpleNamespace(t2d=t2d)))).tolist() == [
        True, False, True]
    assert draft_vocabulary(SimpleNamespace(drafter=None)) is None
    assert draft_vocabulary(SimpleNamespace(drafter=SimpleNamespace())) is None  # e.g. the n-gram drafter
