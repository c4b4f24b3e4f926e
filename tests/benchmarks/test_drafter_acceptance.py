"""benchmarks/drafter_acceptance.py: its per-position acceptance, the MT-bench categories it groups by (those of
the questions the bench harness picks), the per-group figures and the draft vocabulary's coverage."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from benchmarks.drafter_acceptance import by_group, draft_vocabulary, per_position, questions, questions_or_exit, share
from eaglelab.bench.harness import mtbench_first_turns


def test_per_position_is_conditional_on_reaching_the_position():
    # accepted lengths (bonus included) 1, 2, 4, 4: position 0 reached 4 times, accepted 3; position 1: 3 and 2 ...
    assert per_position([1, 2, 4, 4], 3) == [0.75, pytest.approx(2 / 3), 1.0]
    assert per_position([], 2) == [0.0, 0.0]


def test_categories_follow_the_questions_the_harness_picks(tmp_path):
    lines = [{"question_id": i, "category": f"c{i // 3}", "turns": [f"question {i}"]} for i in range(9)]
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    texts, cats = questions("mtbench", 4, None, str(path))
    assert texts == mtbench_first_turns(4, path)
    assert [lines[int(t.split()[1])]["category"] for t in texts] == cats == ["c0", "c0", "c1", "c2"]


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


@pytest.mark.parametrize("bad", ['["a list"]', '{"turns": []}', '{"category": "x"}', "not json"])
def test_a_bad_question_line_names_the_file_and_line(tmp_path, bad):
    from eaglelab.engine.errors import EagleLabError

    path = tmp_path / "question.jsonl"
    path.write_text(json.dumps({"turns": ["fine"], "category": "c"}) + "\n" + bad + "\n")
    with pytest.raises(EagleLabError, match="not an MT-bench question line") as err:
        questions("mtbench", 2, None, str(path))
    assert "line 2" in str(err.value) and "question.jsonl" in str(err.value)


@pytest.mark.parametrize("which", ["mtbench", "humaneval", "file"])
def test_a_missing_or_unreadable_prompts_file_is_said_not_a_traceback(tmp_path, which):
    """Each set's file missing, or (HumanEval) not gzip: an exit with the file named, before any model loads."""
    missing = str(tmp_path / "absent")
    args = {"mtbench": ("mtbench", 2, None, missing), "humaneval": ("humaneval", 2, missing, None),
            "file": ("file", 2, None, None, missing)}[which]
    with pytest.raises(SystemExit) as err:
        questions_or_exit(*args)
    assert str(err.value).startswith("error: ") and "absent" in str(err.value)
    if which == "humaneval":
        (tmp_path / "plain.jsonl.gz").write_text('{"prompt": "not gzip"}\n')
        with pytest.raises(SystemExit, match="not a HumanEval problems file"):
            questions_or_exit("humaneval", 2, str(tmp_path / "plain.jsonl.gz"), None)
