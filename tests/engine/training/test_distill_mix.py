"""``eaglelab distill --mix``: parts of prompts with their own answer length in one --out, second turns that keep the
target's first answer and ask a follow-up (rendered as HF transformers renders the same chat), and clear errors for
a bad spec."""

from __future__ import annotations

import json

import pytest
import torch

from eaglelab.engine.errors import ConfigError
from eaglelab.engine.training import distill_mix as M
from eaglelab.engine.training.distill import read_manifest, read_shard, shard_paths, write_shard

pytestmark = pytest.mark.usefixtures("one_thread")


def _spec(tmp_path, parts, seed=0):
    path = tmp_path / "mix.json"
    path.write_text(json.dumps({"seed": seed, "parts": parts}))
    return path


def _prompts(path, n, start=0):
    path.write_text("\n".join(json.dumps({"prompt": f"w{start + i} w{start + i + 1} w{start + 2 * i}"})
                              for i in range(n)) + "\n")
    return str(path)


@pytest.mark.parametrize("parts, field", [
    ([{"name": "a", "prompts": "p", "max_new_token": 3}], "parts[0].max_new_token"),
    ([{"name": "a", "prompts": "p"}, {"name": "b", "second_turn_of": "c"}], "parts[1].second_turn_of"),
    ([{"name": "a", "prompts": "p", "second_turn_of": "a"}], "parts[0]"),
    ([{"name": "a", "prompts": "p"}, {"name": "a", "prompts": "q"}], "parts[1].name"),
    ([{"name": "a", "prompts": "p", "limit": 0}], "parts[0].limit"),
    ([], "parts"),
])
def test_a_bad_mix_spec_names_the_part_and_field(tmp_path, parts, field):
    with pytest.raises(ConfigError) as e:
        M.read_mix(_spec(tmp_path, parts))
    assert e.value.field == field and "mix.json" in str(e.value)


def test_part_ranges_and_follow_ups_are_fixed_by_the_spec(tmp_path):
    """chat 5 prompts (limit 4) -> 0..3; long 3 -> 4..6; turn2 of chat (limit 2) -> 7..8; follow-ups by (seed, index)."""
    spec = M.read_mix(_spec(tmp_path, [
        {"name": "chat", "prompts": _prompts(tmp_path / "a.jsonl", 5), "limit": 4},
        {"name": "long", "prompts": _prompts(tmp_path / "b.jsonl", 3), "max_new_tokens": 40},
        {"name": "turn2", "second_turn_of": "chat", "limit": 2}], seed=3))
    texts = M.first_turn_texts(spec)
    assert M.part_ranges(spec, texts) == {"chat": range(0, 4), "long": range(4, 7), "turn2": range(7, 9)}
    assert spec.parts[1].max_new_tokens == 40 and spec.parts[0].max_new_tokens == 256
    assert M.follow_up(3, 7) == M.follow_up(3, 7) in M.FOLLOW_UPS
    assert len({M.follow_up(0, i) for i in range(200)}) > 10


def test_second_turns_render_the_answer_and_a_follow_up_as_hf_does(tmp_path):
    """Shard rows for prompts 0 (ended on EOS) and 1 (cut): only prompt 0 gets a second turn, whose ids equal HF
    transformers' apply_chat_template over [user, assistant (the answer as text), user (the follow-up)]."""
    from transformers import AutoTokenizer

    from eaglelab.engine.formats.tokenizer import Tokenizer
    from tests.conftest import add_word_tokenizer

    add_word_tokenizer(tmp_path, vocab=96)
    tok = Tokenizer(tmp_path)
    spec = M.read_mix(_spec(tmp_path, [{"name": "chat", "prompts": _prompts(tmp_path / "a.jsonl", 2)},
                                       {"name": "turn2", "second_turn_of": "chat"}]))
    texts = M.first_turn_texts(spec)
    ranges = M.part_ranges(spec, texts)
    first = tok.chat_ids_many(texts["chat"])
    eos = tok.eos_token_ids[0]
    write_shard(tmp_path / "d" / "shards" / "shard_00000.safetensors",
                [(0, first[0], tok.encode("w40 w41 w42") + [eos], True), (1, first[1], tok.encode("w50 w51"), False)])
    ids: list = [None] * 4
    M.mix_prompt_ids(spec, texts, ranges, spec.parts[1], tmp_path / "d", tok, None, ids)
    assert ids[3] is None  # prompt 1's answer was cut: no second turn
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    msgs = [{"role": "user", "content": texts["chat"][0]}, {"role": "assistant", "content": "w40 w41 w42"},
            {"role": "user", "content": M.follow_up(0, 2)}]
    want = hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
    assert ids[2] == list(want)


def test_distill_mix_through_the_cli_answers_each_part_with_its_length_and_resumes(tmp_path):
    """Two first-turn parts (4 prompts up to 5 tokens, 3 up to 11) and second turns of the first: every row in one
    --out, each part's answers within its own cap, second turns exactly for the first answers that ended on EOS;
    a second run answers nothing new."""
    from eaglelab.cli import main
    from tests.engine.training.test_train import _tiny_model_dir

    _tiny_model_dir(tmp_path / "target")
    mix = _spec(tmp_path, [{"name": "a", "prompts": _prompts(tmp_path / "a.jsonl", 4), "max_new_tokens": 5},
                           {"name": "b", "prompts": _prompts(tmp_path / "b.jsonl", 3, 10), "max_new_tokens": 11},
                           {"name": "t2", "second_turn_of": "a", "max_new_tokens": 5}])
    cmd = ["distill", "--mix", str(mix), "--out", str(tmp_path / "d"), "--model", str(tmp_path / "target"),
           "--batch-size", "4", "--device", "cpu"]
    assert main(cmd) == 0
    rows = {}
    for path in shard_paths(tmp_path / "d"):
        t = read_shard(path)
        off = t["offsets"].tolist()
        for r, i in enumerate(t["indices"].tolist()):
            rows[i] = (off[r + 1] - off[r] - int(t["prompt_lens"][r]), bool(t["hit_eos"][r]))
    assert {i for i in rows if i < 7} == set(range(7))
    assert all(rows[i][0] <= 5 for i in range(4)) and all(rows[i][0] <= 11 for i in range(4, 7))
    assert any(rows[i][0] > 5 for i in range(4, 7)) or all(rows[i][1] for i in range(4, 7))
    assert {i - 7 for i in rows if i >= 7} == {i for i in range(4) if rows[i][1]}
    m = read_manifest(tmp_path / "d")
    assert [p["name"] for p in m["mix"]["parts"]] == ["a", "b", "t2"] and m["mix"]["parts"][2]["indices"] == [7, 11]
    assert main(cmd) == 0
    assert read_manifest(tmp_path / "d")["counts"]["samples"] == m["counts"]["samples"]


def test_mix_and_prompts_are_exclusive(tmp_path, capsys):
    from eaglelab.cli import main

    assert main(["distill", "--out", str(tmp_path / "d")]) != 0
    assert "--prompts or --mix" in capsys.readouterr().err
