"""benchmarks/tree_replay.py and tree_select.py: the recording marks as correct exactly the drafted tokens the engine
accepted, and a replayed selection keeps what the engine's own ranking keeps."""

from __future__ import annotations

import pytest
import torch

from benchmarks.tree_replay import check_full_expansion, correct_flags, record_cycles
from benchmarks.tree_select import accepted, calibrated_scores, fit_calibration, read_replay, shallower, stop_reasons
from eaglelab.engine.formats.drafter_loader import load_eagle3
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig


def _call(tokens, parents, depth, score):
    t = torch.tensor
    return {"token": t(tokens), "parent": t(parents), "depth": t(depth), "score": t(score, dtype=torch.float32)}


def test_a_candidate_is_correct_only_with_its_whole_path():
    # root -> 7 (c0), 8 (c1); c0 -> 9 (c2), 5 (c3); c1 -> 9 (c4): c4 has the right token under the wrong parent
    call = _call([7, 8, 9, 5, 9], [-1, -1, 0, 0, 1], [1, 1, 2, 2, 2], [-0.1, -2.0, -0.3, -3.0, -2.1])
    assert correct_flags(call, [7, 9]).tolist() == [True, False, True, False, False]
    assert correct_flags(call, [8, 9]).tolist() == [False, True, False, False, True]
    assert correct_flags(call, [7]).tolist() == [True, False, False, False, False]  # truth shorter than the tree


def test_a_selection_accepts_the_correct_nodes_it_keeps():
    call = _call([7, 8, 9, 5, 9], [-1, -1, 0, 0, 1], [1, 1, 2, 2, 2], [-0.1, -2.0, -0.3, -3.0, -2.1])
    data = {k: v[None] for k, v in call.items()}
    data["correct"] = correct_flags(call, [7, 9])[None]
    assert accepted(data, data["score"], 5).tolist() == [3]  # both correct kept, plus the bonus
    assert accepted(data, data["score"], 1).tolist() == [2]  # the best: c0
    worse = data["score"].clone()
    worse[0, 2] = -2.5  # c2 now ranks below c1 and c4
    assert accepted(data, worse, 3).tolist() == [2]
    with pytest.raises(AssertionError, match="without its parent"):
        accepted(data, torch.tensor([[-5.0, -1.0, -0.1, -3.0, -2.0]]), 1)  # c2 kept, c0 not


def test_a_recording_read_as_a_shallower_tree_keeps_only_what_that_tree_drafts():
    """--depths 1 over a 2-step recording: the kept nodes are depth-1 ones even where a depth-2 node scores higher, so
    its accepted length is the 1-step tree's; a node count the shallower tree cannot hold is refused, not miscounted."""
    # root -> 7 (c0), 8 (c1); c0 -> 9 (c2, scoring above c1), 5 (c3); truth 7, 9
    call = _call([7, 8, 9, 5], [-1, -1, 0, 0], [1, 1, 2, 2], [-0.1, -2.0, -0.3, -3.0])
    data = {k: v[None] for k, v in call.items()}
    data["correct"] = correct_flags(call, [7, 9])[None]
    assert accepted(data, data["score"], 2).tolist() == [3]  # c0 and c2: two steps right
    assert accepted(data, shallower(data, 1, 3, "rec"), 2).tolist() == [2]  # c0 and c1: one step
    with pytest.raises(SystemExit, match="--depths 1 leaves 2 candidates a cycle, fewer than the 3"):
        shallower(data, 1, 4, "rec")
    with pytest.raises(SystemExit, match="--depths 0 leaves 0 candidates"):
        shallower(data, 0, 2, "rec")


def test_the_replay_refuses_a_tree_that_drops_candidates_or_adds_a_branch():
    """5 steps, topk 4 keep all 68 candidates only at --draft-tokens 69; a chain of 3 at 4; no lookup branch."""
    from eaglelab.engine.runtime.spec_config import SpecConfig

    check_full_expansion(SpecConfig("eagle3", num_steps=5, topk=4, num_draft_tokens=69))
    check_full_expansion(SpecConfig("eagle3", num_steps=3, topk=1, num_draft_tokens=0))
    with pytest.raises(SystemExit, match="--draft-tokens 69 for 5 steps and topk 4"):
        check_full_expansion(SpecConfig("eagle3", num_steps=5, topk=4, num_draft_tokens=24))
    with pytest.raises(SystemExit, match="lookup 16"):
        check_full_expansion(SpecConfig("eagle3", num_steps=5, topk=4, num_draft_tokens=69, lookup_tokens=16))


def test_a_file_that_is_no_recording_is_said_not_a_traceback(tmp_path):
    from safetensors.torch import save_file

    with pytest.raises(SystemExit, match="not a readable safetensors file"):
        read_replay(str(tmp_path / "missing.safetensors"))
    (tmp_path / "junk.safetensors").write_text("junk")
    with pytest.raises(SystemExit, match="not a readable safetensors file"):
        read_replay(str(tmp_path / "junk.safetensors"))
    save_file({"score": torch.zeros(1, 2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(SystemExit, match="no correct, depth, full_accept_len, logp, parent, prompt tensor"):
        read_replay(str(tmp_path / "other.safetensors"))


@pytest.mark.slow
def test_recording_the_shipped_drafter_marks_what_the_engine_accepted(default_target):
    """Every candidate of a 3-step, topk-3 expansion kept: the recording's correct candidates are the engine's
    accepted tokens cycle by cycle (``record_cycles`` asserts it), and a replayed selection of every candidate
    gives the full expansion's accepted lengths; the drafter's own ranking never beats the oracle."""
    from eaglelab.draft_registry import shipped_drafter_dir

    net, taps, _ = load_eagle3(shipped_drafter_dir(), default_target.model)
    tok = default_target.tokenizer
    prompts = [tok.chat_ids("Give three tips for staying healthy."), tok.chat_ids("What is a binary search?")]
    spec = SpecConfig("eagle3", num_steps=3, topk=3, num_draft_tokens=3 + 2 * 9 + 1)
    engine = Engine(default_target.model, eos_token_ids=(), drafter=Eagle3Drafter(net, spec, taps), spec=spec)
    outputs: list[list[int]] = []
    data = record_cycles(engine, prompts, 40, outputs=outputs)
    cycles, cands = data["correct"].shape
    # each cycle's root indexes its prompt's output: the next cycle starts where this one's tokens end, and the
    # correct candidates are the tokens after the root
    p, r, a = data["prompt"].tolist(), data["root"].tolist(), data["full_accept_len"].tolist()
    assert len(outputs) == 2
    assert all(r[i + 1] == r[i] + a[i] for i in range(cycles - 1) if p[i + 1] == p[i])
    for i in range(cycles):
        kept = data["correct"][i].nonzero().flatten()
        path = sorted(kept.tolist(), key=lambda c: int(data["depth"][i, c]))
        assert [int(data["token"][i, c]) for c in path] == outputs[p[i]][r[i] + 1: r[i] + a[i]]
    assert cands == 21 and cycles >= 8 and set(data["prompt"].tolist()) == {0, 1}
    assert int(data["correct"].sum()) > cycles  # the shipped drafter gets more than one token a cycle right
    full = accepted(data, data["score"].double(), cands)
    assert torch.equal(full, data["full_accept_len"])
    oracle = data["correct"].double() * 100 + data["score"].double()
    for keep in (2, 5, 9):
        assert bool((accepted(data, data["score"].double(), keep) <= accepted(data, oracle, keep)).all())
    a, b = fit_calibration(data, 3, iters=50)
    assert all(x > 0 for x in a)  # a likelier token is likelier right
    accepted(data, calibrated_scores(data, a, b), 5)  # calibrated scores keep the kept set closed under parents
    why = stop_reasons(data, 3)
    assert abs(why["depth"] + why["top_k"] + why["frontier"] - 1.0) < 1e-9
    assert abs(sum(why[f"top_k_at_{d}"] for d in (1, 2, 3)) - why["top_k"]) < 1e-9
