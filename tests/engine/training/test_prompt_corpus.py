"""Training prompts at scale: the count asked, all distinct, every source present, nothing that
overlaps MT-bench or HumanEval (checked against the real question files), a compact file that
reads back; and the CLI chain prompts -> distill -> train --online with acceptance evaluation."""

from __future__ import annotations

import gzip
import json

import pytest

from eaglelab.engine.training import prompt_corpus as pc


def test_evaluation_sets_are_the_real_ones(evaluation):
    """MT-bench: 80 questions x 2 turns; HumanEval: 164 problems."""
    texts = pc.evaluation_texts()
    assert len(texts["mt_bench"]) == 160 and len(texts["humaneval"]) == 164
    assert evaluation.names == ("mt_bench", "humaneval") and len(evaluation.grams) > 5000


def test_overlap_catches_a_benchmark_question_inside_a_prompt(evaluation):
    texts = pc.evaluation_texts()
    q, h = texts["mt_bench"][0], texts["humaneval"][3]
    assert evaluation.hits(q) and evaluation.hits("Please help me with this: " + q.upper())
    assert evaluation.hits(f"Complete this function:\n{h}")
    words = q.split()
    assert evaluation.hits(" ".join(words[2:15]))  # any 13-word window
    assert not evaluation.hits("Explain photosynthesis to a beginner. Keep it under 100 words.")


def test_corpus_count_distinct_sources_and_no_overlap(few_modules, evaluation):
    corpus = pc.build_corpus(3000, evaluation, seed=1)
    texts = [p.text for p in corpus.prompts]
    assert len(texts) == 3000 and len({pc.normalise(t) for t in texts}) == 3000
    assert sum(corpus.counts.values()) == 3000 and all(corpus.counts[s] > 0 for s in pc.SOURCES)
    assert not any(evaluation.hits(t) for t in texts)
    assert [p.text for p in pc.build_corpus(3000, evaluation, seed=1).prompts] == texts  # deterministic


def test_a_benchmark_question_planted_in_a_source_is_dropped(few_modules, evaluation, monkeypatch):
    q = pc.evaluation_texts()["mt_bench"][10]
    planted = lambda rng: iter([pc.CorpusPrompt(q, "self_instruct", "x"), pc.CorpusPrompt("Say hi.", "self_instruct", "x")])
    monkeypatch.setitem(pc.GENERATORS, "self_instruct", planted)
    corpus = pc.build_corpus(200, evaluation, seed=0)
    assert corpus.overlaps["self_instruct"] == 1 and q not in [p.text for p in corpus.prompts]
    assert len(corpus.prompts) == 200


def test_written_corpus_reads_back_with_its_manifest(few_modules, evaluation, tmp_path):
    corpus = pc.build_corpus(500, evaluation, seed=0)
    path = pc.write_corpus(corpus, tmp_path, evaluation)
    recs = pc.read_corpus(tmp_path)
    assert [r["prompt"] for r in recs] == [p.text for p in corpus.prompts] and recs[7]["index"] == 7
    m = json.loads((tmp_path / "manifest.json").read_text())
    assert m["count"] == 500 and sum(m["sources"].values()) == 500
    assert m["overlap_check"]["against"] == ["mt_bench", "humaneval"] and m["overlap_check"]["ngram_words"] == 13
    with gzip.open(path, "rt") as f:
        assert json.loads(f.readline())["source"] in pc.SOURCES


def test_the_docstrings_are_read_in_a_child_that_keeps_its_imports_to_itself():
    """The child gives the entries this process would, and what it imports stays there: importing
    ``torch.distributed.debug`` in the caller registered a handler whose C++ destructor aborted the interpreter at
    exit (``pytest tests/cli`` ended in rc 134 after every test passed)."""
    import sys

    got = pc.doc_entries_in_child(["json", "textwrap"])
    assert got == pc.gather_doc_entries(["json", "textwrap"])
    assert any(q.startswith("json.") for q, _ in got) and any(q.startswith("textwrap.") for q, _ in got)
    before = "torch.distributed.debug" in sys.modules
    pc.doc_entries_in_child(["torch.distributed.debug"])
    assert ("torch.distributed.debug" in sys.modules) == before


def test_a_child_that_fails_is_a_clear_error(monkeypatch):
    import sys

    from eaglelab.engine.errors import EagleLabError

    monkeypatch.setattr(sys, "executable", "false")
    with pytest.raises(EagleLabError, match="docstrings source's child process .* failed: exit status 1"):
        pc.doc_entries_in_child(["json"])


def test_a_prompts_file_without_prompts_is_a_clear_error(tmp_path):
    from eaglelab.engine.errors import ConfigError

    bad = tmp_path / "p.jsonl"
    bad.write_text('{"text": 1}\n')
    with pytest.raises(ConfigError, match="line 1 has no prompt"):
        pc.read_corpus(bad)
    with pytest.raises(ConfigError, match="no such prompts file"):
        pc.read_corpus(tmp_path / "missing.jsonl.gz")


@pytest.mark.usefixtures("one_thread")
def test_prompts_distill_train_online_through_the_cli(few_modules, tmp_path, capfd):
    """`eaglelab prompts`, `distill` (stopped by --limit, resumed), `train --online --eval-every`:
    a drafter with a training card that records data, acceptance (from step 0, the starting point, and what
    training added) and time, TensorBoard scalars of the simulated acceptance; a run warm-started from that
    drafter (--init-from, MLP widened) starts at its last evaluation."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from eaglelab.cli import main
    from eaglelab.engine.formats.drafter_loader import load_eagle3
    from eaglelab.engine.training.distill import read_manifest
    from tests.engine.training.test_train import TAPS, _tiny_model_dir

    model = _tiny_model_dir(tmp_path / "target")
    assert main(["prompts", "--out", str(tmp_path / "p"), "--count", "40"]) == 0
    distill = ["distill", "--prompts", str(tmp_path / "p"), "--out", str(tmp_path / "d"), "--model", str(tmp_path / "target"),
               "--max-new-tokens", "8", "--batch-size", "8", "--device", "cpu", "--max-prompt-tokens", "400"]
    assert main(distill + ["--limit", "16"]) == 0
    assert read_manifest(tmp_path / "d")["status"] == "complete" and read_manifest(tmp_path / "d")["counts"]["samples"] == 16
    assert main(distill) == 0
    m = read_manifest(tmp_path / "d")
    assert m["counts"]["samples"] + m["skipped_long_prompts"] == 40 and len(m["runs"]) == 2
    out = tmp_path / "drafter"
    train = ["train", "--online", "--data", str(tmp_path / "d"), "--layer-ids", "0,1,2", "--epochs", "1",
             "--batch-size", "4", "--ttt-length", "3", "--draft-vocab-size", "32", "--device", "cpu", "--eval-every", "2",
             "--eval-samples", "4", "--save-dtype", "float32", "--log-every", "1"]
    capfd.readouterr()
    assert main(train + ["--out", str(out), "--tensorboard", str(tmp_path / "tb")]) == 0
    said = "".join(capfd.readouterr().err.split())  # rich wraps long lines
    assert "evalstep0(thestartingpoint:randominitialisation)" in said
    net, taps, _ = load_eagle3(out, model)
    assert taps == TAPS
    card = json.loads((out / "eaglelab_training.json").read_text())
    assert card["online"] and card["heldout_samples"] == 4 and card["prompts"]["count"] == 40
    assert card["data_counts"]["samples"] == m["counts"]["samples"] and card["train_seconds"] > 0
    assert card["distill_seconds"] > 0 and card["parameters"] > 0 and card["size_bytes"] > 0
    assert len(card["acceptance"]["accept_len"]) == 3 and card["acceptance"]["anchors"] > 0
    assert card["acceptance_history"][-1] == card["acceptance"] and len(card["acceptance"]["cycle_per_position"]) == 3
    history = card["acceptance_history"]
    assert [h["step"] for h in history] == sorted({*range(0, card["steps"], 2), card["steps"]})
    gain = card["acceptance_gain"]
    assert (gain["from_step"], gain["to_step"]) == (0, card["steps"])
    for key in ("accept_len", "cycle_len"):
        want = [b - a for a, b in zip(history[0][key], card["acceptance"][key])]
        assert len(gain[key]) == 3 and gain[key] == pytest.approx(want, abs=1e-4)
    ev = EventAccumulator(str(tmp_path / "tb"))
    ev.Reload()
    tags = set(ev.Tags()["scalars"])
    assert {"eval/accept_len_chain3", "eval/accept_rate_pos0", "eval/accept_rate_pos2", "eval/cycle_rate_pos2", "train/loss"} <= tags
    chain3 = ev.Scalars("eval/accept_len_chain3")
    assert (chain3[0].step, chain3[0].value) == (0, pytest.approx(history[0]["accept_len"][2]))
    # warm-started from that drafter, its MLP widened (128 -> 160): step 0 is the drafter's own last evaluation
    assert main(train + ["--out", str(tmp_path / "warm"), "--init-from", str(out), "--intermediate-size", "160",
                         "--max-steps", "1"]) == 0
    said = "".join(capfd.readouterr().err.split())
    assert f"evalstep0(thestartingpoint:warmstartfrom{out})" in said
    warm = json.loads((tmp_path / "warm" / "eaglelab_training.json").read_text())
    assert warm["init_from"]["intermediate_size"] == 160 and warm["init_from"]["head_rows_new"] == 0
    assert warm["acceptance_history"][0] == {**card["acceptance"], "step": 0}
