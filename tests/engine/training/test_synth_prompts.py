"""Prompts written by the target: the template's text before a user message, the screen of sampled
turns, deduplication and the evaluation-set screen, seeded sampling, the CLI writing what ``distill``
reads, and (slow) that the real default model does write whole user turns from that text alone."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from eaglelab.engine.errors import ConfigError, EagleLabError
from eaglelab.engine.formats.tokenizer import Tokenizer
from eaglelab.engine.training.prompt_corpus import OverlapIndex, read_corpus
from eaglelab.engine.training.synth_prompts import SynthSettings, Synthesizer, screen, user_turn_prefix
from tests.conftest import add_word_tokenizer, save_hf_dir
from tests.engine.training.test_train import CFG, VOCAB, sharp_target

pytestmark = pytest.mark.usefixtures("one_thread")
MT_QUESTION = ("Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural "
               "experiences and must-see attractions.")


@pytest.fixture
def tiny(tmp_path):
    """The tiny target as an HF directory with a word-level tokenizer and a ChatML-like template."""
    model = sharp_target(seed=3)
    save_hf_dir(model, CFG, tmp_path / "target")
    add_word_tokenizer(tmp_path / "target", VOCAB)
    return model, Tokenizer(tmp_path / "target"), tmp_path / "target"


def test_the_prefix_is_the_template_up_to_the_users_message(tiny):
    _, tok, _ = tiny
    ids = user_turn_prefix(tok)
    assert tok.decode(ids, skip_special_tokens=False).split() == ["<|im_start|>", "user"]
    with_system = tok.decode(user_turn_prefix(tok, system="w7 w8"), skip_special_tokens=False).split()
    assert with_system == ["<|im_start|>", "system", "w7", "w8", "<|im_end|>", "<|im_start|>", "user"]


def test_a_tokenizer_without_a_chat_template_is_a_clear_error(tiny, tmp_path):
    _, _, path = tiny
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    with pytest.raises(ConfigError, match="no chat template with a user turn"):
        user_turn_prefix(Tokenizer(path))


@pytest.mark.parametrize("text, ended, why", [
    ("Can you help me plan a trip to Rome?", True, None),
    ("Can you help me plan a trip to Rome?", False, "cut"),
    ("Hello there", True, "short"),
    ("Tell me a story <|im_start|>assistant about a cat", True, "markup"),
    ("Write me a poem\nassistant\nabout the sea", True, "markup"),
    ("12 + 34 = 46 ; 99 * 2 = 198 ; 7 - 3 = 4", True, "not_text"),
])
def test_the_screen(text, ended, why):
    assert screen(text, ended, min_words=4) == why


def _scripted(batches: list[list[tuple[str, bool]]]):
    """A ``sample_batch`` that returns the given batches in turn (then the last again)."""
    def sample_batch(self, number):
        rows = batches[min(number, len(batches) - 1)]
        return [t for t, _ in rows], [e for _, e in rows], 10 * len(rows)
    return sample_batch


def test_kept_prompts_are_screened_deduplicated_and_never_an_evaluation_question(tiny, monkeypatch):
    model, tok, _ = tiny
    a, b, c = "Can you help me plan a trip to Rome?", "What is a good name for a bakery?", "How do I fix a bike tyre?"
    monkeypatch.setattr(Synthesizer, "sample_batch", _scripted([
        [(a, True), (a.upper(), True), (MT_QUESTION, True), ("Tell me", True), (b, False)],
        [(b, True), (c, True), (a, True)],
    ]))
    overlap = OverlapIndex.from_texts({"mt_bench": [MT_QUESTION]})
    res = Synthesizer(model, tok, SynthSettings(count=3, batch_size=5)).run(overlap)
    assert res.prompts == [a, b, c]
    assert dict(res.dropped) == {"duplicate": 2, "overlap": 1, "short": 1, "cut": 1}
    assert res.batches == 2 and res.sampled == 8
    corpus = res.corpus(seed=0)
    assert corpus.counts == {"target": 3} and corpus.duplicates == 2 and corpus.overlaps == {"target": 1}


def test_a_target_that_writes_no_usable_turn_is_a_clear_error(tiny, monkeypatch):
    model, tok, _ = tiny
    monkeypatch.setattr(Synthesizer, "sample_batch", _scripted([[("cut off mid sentence and", False)] * 4]))
    with pytest.raises(EagleLabError, match="3 batches in a row kept no prompt.*cut 12"):
        Synthesizer(model, tok, SynthSettings(count=5, batch_size=4)).run(OverlapIndex.from_texts({}))


def test_the_time_limit_stops_before_a_batch_would_overrun_it(tiny, monkeypatch):
    model, tok, _ = tiny
    turns = iter(f"Please write a short poem about the number {i}" for i in range(1000))
    monkeypatch.setattr(Synthesizer, "sample_batch", lambda self, n: ([next(turns) for _ in range(2)], [True] * 2, 20))
    ticks = iter(range(1000))
    synth = Synthesizer(model, tok, SynthSettings(count=100, batch_size=2, time_limit=7.5), clock=lambda: next(ticks))
    res = synth.run(OverlapIndex.from_texts({}))
    assert res.stopped_by_time and 0 < len(res.prompts) < 100 and len(res.prompts) == 2 * res.batches


def test_sampling_is_seeded_per_batch(tiny):
    """The real engine samples: the same (seed, batch) gives the same turns, another batch other turns."""
    model, tok, _ = tiny
    s = SynthSettings(count=4, batch_size=4, max_new_tokens=8, temperature=1.0, top_p=1.0)
    first, ended, tokens = Synthesizer(model, tok, s).sample_batch(0)
    again, _, _ = Synthesizer(model, tok, s).sample_batch(0)
    other, _, _ = Synthesizer(model, tok, s).sample_batch(1)
    assert first == again and first != other
    assert len(first) == 4 and len(ended) == 4 and 4 <= tokens <= 32


class _RecordingEngine:
    """Stands in for the batch engine: records each batch's prompts, answers one ended turn per row."""

    def __init__(self, tok):
        self.tok, self.prompts = tok, []

    def generate(self, prompts, max_new_tokens, params, generator=None):
        from types import SimpleNamespace

        self.prompts.append(prompts)
        turn = self.tok.encode(f"user assistant system w{10 + len(self.prompts)}")  # 4 words, mostly letters
        return SimpleNamespace(tokens=[turn] * len(prompts), stop_reasons=["eos"] * len(prompts))


def patch_engine(monkeypatch, fake):
    """Every Synthesizer drafts through ``fake`` instead of the batch engine; -> ``fake``."""
    monkeypatch.setattr(Synthesizer, "engine", property(lambda self: fake))
    return fake


@pytest.fixture
def recording(tiny, monkeypatch):
    """A _RecordingEngine on the tiny target's tokenizer, standing in for every Synthesizer's engine."""
    return patch_engine(monkeypatch, _RecordingEngine(tiny[1]))


def test_several_system_messages_condition_the_batches_in_turn(tiny, recording):
    """Batch b samples after system message b mod n; the result counts what each message kept."""
    model, tok, _ = tiny
    s = SynthSettings(count=4, batch_size=2, systems=("w7 w8", "w9"))
    res = Synthesizer(model, tok, s).run(OverlapIndex.from_texts({}))
    used = [tok.decode(batch[0], skip_special_tokens=False).split()[2:-3] for batch in recording.prompts]
    assert used == [["w7", "w8"], ["w9"], ["w7", "w8"], ["w9"]]
    assert all(len(set(map(tuple, batch))) == 1 and len(batch) == 2 for batch in recording.prompts)
    assert len(res.prompts) == 4 and dict(res.kept_by_condition) == {0: 2, 1: 2}  # one distinct turn per batch


def test_bad_settings_are_refused():
    with pytest.raises(EagleLabError, match="not both"):
        SynthSettings(count=1, system="w1", systems=("w2",))
    with pytest.raises(EagleLabError, match="empty system message"):
        SynthSettings(count=1, systems=("w2", " "))
    with pytest.raises(EagleLabError, match="temperature > 0"):
        SynthSettings(count=1, temperature=0.0)
    with pytest.raises(EagleLabError, match="count must be >= 1"):
        SynthSettings(count=0)


def test_the_cli_writes_what_distill_reads(tiny, tmp_path, monkeypatch):
    """`eaglelab synthesize` writes the prompts format with its manifest; `distill` answers it together
    with an `eaglelab prompts`-style file."""
    from eaglelab.cli import main
    from eaglelab.engine.training.distill import read_manifest

    _, _, path = tiny
    turns = ["write w10 about w11 please", "explain w20 to w21", "write w10 about w11 please", "summarise w30 and w31 briefly"]
    monkeypatch.setattr(Synthesizer, "sample_batch", _scripted([[(t, True) for t in turns]]))
    out = tmp_path / "synth"
    assert main(["synthesize", "--model", str(path), "--out", str(out), "--count", "3", "--batch-size", "4",
                 "--device", "cpu", "--dtype", "float32"]) == 0
    recs = read_corpus(out)
    assert [r["prompt"] for r in recs] == [turns[0], turns[1], turns[3]] and {r["source"] for r in recs} == {"target"}
    m = json.loads((out / "manifest.json").read_text())
    assert m["sources"] == {"target": 3} and m["synthesis"]["dropped"]["duplicate"] == 1
    assert m["synthesis"]["sampled"] == 4 and m["synthesis"]["prefix"].split() == ["<|im_start|>", "user"]
    other = tmp_path / "other"
    other.mkdir()
    with gzip.open(other / "prompts.jsonl.gz", "wt") as f:
        f.write(json.dumps({"prompt": "w40 w41 w42"}) + "\n")
    assert main(["distill", "--model", str(path), "--prompts", str(out), str(other), "--out", str(tmp_path / "d"),
                 "--max-new-tokens", "4", "--batch-size", "4", "--device", "cpu", "--dtype", "float32"]) == 0
    d = read_manifest(tmp_path / "d")
    assert d["counts"]["samples"] == 4 and d["prompts_files"] == [str(out), str(other)]


def test_the_cli_reads_a_file_of_system_messages(tiny, recording, tmp_path, capsys):
    """--systems-file: its lines (not blank, not '#') condition the batches in turn; the manifest counts
    each message's kept prompts; a missing or empty file is said without a traceback."""
    from eaglelab.cli import main

    _, tok, path = tiny
    systems = tmp_path / "systems.txt"
    systems.write_text("# kinds of conversation\nw7 w8\n\nw9\n")
    out = tmp_path / "synth"
    args = ["synthesize", "--model", str(path), "--out", str(out), "--count", "3", "--batch-size", "1",
            "--device", "cpu", "--dtype", "float32"]
    assert main(args + ["--systems-file", str(systems)]) == 0
    m = json.loads((out / "manifest.json").read_text())["synthesis"]
    assert m["kept_by_system"] == [{"system": "w7 w8", "kept": 2}, {"system": "w9", "kept": 1}]
    assert m["settings"]["systems"] == ["w7 w8", "w9"]
    systems.write_text("# nothing\n\n")
    for bad, said in ((systems, "no system message"), (tmp_path / "absent.txt", "cannot read the system messages")):
        capsys.readouterr()
        assert main(args + ["--systems-file", str(bad), "--force"]) != 0  # --force: out holds the first corpus
        err = " ".join(capsys.readouterr().err.split())  # rich wraps long lines
        assert said in err and str(bad.name) in err and "Traceback" not in err


def test_the_cli_says_what_went_wrong_without_a_traceback(tiny, tmp_path, capsys):
    from eaglelab.cli import main

    _, _, path = tiny
    rc = main(["synthesize", "--model", str(path), "--out", str(tmp_path / "s"), "--temperature", "0",
               "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc != 0 and "temperature" in err and "Traceback" not in err


@pytest.mark.slow
def test_the_default_model_writes_whole_user_turns(default_target):
    """The method's premise, on the real target: from the template's text before a user message alone,
    SmolLM2-135M-Instruct ends most sampled turns itself, and most of those pass the screen."""
    s = SynthSettings(count=8, batch_size=8, max_new_tokens=96, seed=1)
    texts, ended, _ = Synthesizer(default_target.model, default_target.tokenizer, s).sample_batch(0)
    kept = [t for t, e in zip(texts, ended) if screen(t, e, s.min_words) is None]
    assert sum(ended) >= 5 and len(kept) >= 4, list(zip(texts, ended))
    assert len(set(kept)) == len(kept)


def test_running_out_of_memory_names_the_batch_size(tiny, tmp_path, monkeypatch, capsys):
    from eaglelab.cli import main

    _, _, path = tiny

    def oom(self, number):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9.00 GiB")

    monkeypatch.setattr(Synthesizer, "sample_batch", oom)
    rc = main(["synthesize", "--model", str(path), "--out", str(tmp_path / "s"), "--batch-size", "4096",
               "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc != 0 and "--batch-size" in err and "4096" in err and "Traceback" not in err
