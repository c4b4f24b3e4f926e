"""``eaglelab synthesize --ask code,maths``: the target's answers to requests for a question become the prompts,
conditioned on the assistant's turn after the request, screened (13-word windows of MT-bench and HumanEval) like
every synthesized prompt."""

from __future__ import annotations

import json

import pytest

from eaglelab.engine.errors import EagleLabError
from eaglelab.engine.training.prompt_corpus import OverlapIndex, read_corpus
from eaglelab.engine.training.synth_prompts import ASKS, SynthSettings, Synthesizer
from tests.engine.training.test_synth_prompts import _RecordingEngine, patch_engine, recording, tiny  # noqa: F401 (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")


def test_asks_condition_the_assistant_turn_in_turn(tiny, recording):  # noqa: F811
    """Batch b's prefix is the chat template of request b mod n ending in the assistant's turn (what the
    tokenizer's chat_ids gives), and the manifest counts per request."""
    model, tok, _ = tiny
    s = SynthSettings(count=3, batch_size=1, asks=("w7 w8", "w9"))
    res = Synthesizer(model, tok, s).run(OverlapIndex.from_texts({}))
    assert [b[0] for b in recording.prompts] == [tok.chat_ids("w7 w8"), tok.chat_ids("w9"), tok.chat_ids("w7 w8")]
    assert tok.decode(recording.prompts[1][0], skip_special_tokens=False).split()[-2:] == ["<|im_start|>", "assistant"]
    assert len(res.prompts) == 3 and dict(res.kept_by_condition) == {0: 2, 1: 1}


def test_asks_exclude_system_messages_and_presets_cover_code_and_maths():
    with pytest.raises(EagleLabError, match="without system messages"):
        SynthSettings(count=1, asks=("w1",), systems=("w2",))
    with pytest.raises(EagleLabError, match="empty request"):
        SynthSettings(count=1, asks=("w1", " "))
    assert len(ASKS["code"]) >= 5 and len(ASKS["maths"]) >= 5
    assert all("HumanEval" not in a and "MT-bench" not in a for k in ASKS for a in ASKS[k])


def test_the_cli_screens_asked_questions_against_the_evaluation_sets(tiny, tmp_path, monkeypatch, capsys):  # noqa: F811
    """--ask code,maths: every preset request in turn; a question sharing 13 words with an evaluation text is
    dropped as an overlap; an unknown kind that is no file is refused naming --ask."""
    from eaglelab.cli import main
    from eaglelab.engine.training import prompt_corpus as pc

    _, tok, path = tiny
    leaked = " ".join(["user assistant system"] * 4 + ["w20", "w21"])  # 14 words: the "evaluation" text
    monkeypatch.setattr(pc, "evaluation_texts", lambda *a: {"humaneval": [leaked]})
    asked = []

    class Engine(_RecordingEngine):
        def generate(self, prompts, max_new_tokens, params, generator=None):
            from types import SimpleNamespace

            asked.append(prompts[0])
            text = leaked if len(asked) == 2 else f"user assistant system w{40 + len(asked)} w{50 + len(asked)}"
            return SimpleNamespace(tokens=[tok.encode(text)], stop_reasons=["eos"])

    patch_engine(monkeypatch, Engine(tok))
    out = tmp_path / "synth"
    args = ["synthesize", "--model", str(path), "--out", str(out), "--count", "3", "--batch-size", "1",
            "--device", "cpu", "--dtype", "float32"]
    assert main(args + ["--ask", "code,maths"]) == 0
    presets = ASKS["code"] + ASKS["maths"]
    assert asked == [tok.chat_ids(a) for a in presets[:4]]
    assert len(read_corpus(out)) == 3 and leaked not in [r["prompt"] for r in read_corpus(out)]
    m = json.loads((out / "manifest.json").read_text())["synthesis"]
    assert m["dropped"]["overlap"] == 1 and m["kept_by_system"][0] == {"ask": presets[0], "kept": 1}
    capsys.readouterr()
    assert main(args + ["--ask", "poetry", "--force"]) != 0
    assert "--ask" in " ".join(capsys.readouterr().err.split())
