"""The last causes of the hostile-input sweep (issue #39, round 2): a prompt past the target's context window
in check-wiring --texts and bench, distill's writer lock, corpora and bench reports overwritten without
--force, and lone surrogates in a prompt typed on the command line. Each test failed before its fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.cli.hostile_inputs import assert_handled, flat, Inputs, make_inputs, run_cli
from tests.conftest import add_word_tokenizer, tiny_config


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> Inputs:
    inputs = make_inputs(tmp_path_factory.mktemp("hostile_leftovers"))
    add_word_tokenizer(inputs.target, vocab=tiny_config()["vocab_size"])
    return inputs


# ---- 1. the context window ------------------------------------------------------------------------------


def test_check_wiring_refuses_a_text_past_the_window(valid, tmp_path, capsys):
    """A --texts line of 300 tokens for a 256-token target: exit 2 naming the file, the line, the count, the window."""
    texts = tmp_path / "texts.txt"
    texts.write_text("w1 w2 w3 w4\n" + " ".join(f"w{i % 90}" for i in range(300)) + "\n")
    argv = ["check-wiring", str(valid.drafter), "--target", str(valid.target), "--search", "--texts", str(texts)]
    o = run_cli(argv, capsys)
    assert_handled(o, argv)
    text = flat(o.out + o.err)
    assert o.rc == 2, text
    assert "texts.txt" in text and "--texts line 2" in text and "300 tokens" in text and "<= 256" in text


def test_bench_refuses_new_tokens_that_fill_the_window(valid, capsys):
    argv = ["bench", "--model", str(valid.target), "--draft", "none", "--device", "cpu", "--configs", "plain-eager",
            "--batch-sizes", "1", "--prompts", "1", "--max-new-tokens", "300", "--repeats", "1", "--no-micro"]
    o = run_cli(argv, capsys)
    assert_handled(o, argv)
    text = flat(o.out + o.err)
    assert o.rc == 2 and "--max-new-tokens" in text and "<= 256" in text, text


def test_bench_cuts_a_long_question_to_the_window_and_says_so(valid, tmp_path, capsys):
    """A 400-token MT-bench question, --max-prompt-tokens 512, a 256-token target: cut to 256 - 8 with a note."""
    questions = tmp_path / "question.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "writing",
                                     "turns": [" ".join(f"w{i % 90}" for i in range(400))]}) + "\n")
    out = tmp_path / "bench.json"
    argv = ["bench", "--model", str(valid.target), "--draft", "none", "--device", "cpu", "--questions", str(questions),
            "--configs", "plain-eager", "--batch-sizes", "1", "--prompts", "1", "--max-new-tokens", "8",
            "--repeats", "1", "--no-micro", "--json", str(out)]
    o = run_cli(argv, capsys)
    assert_handled(o, [a for a in argv if a != "--json"])  # bench's --json names a file: nothing on stdout
    assert o.rc == 0, o.err
    rep = json.loads(out.read_text())
    assert any("prompts cut at 248 tokens" in n and "window of 256" in n for n in rep["notes"]), rep["notes"]


def test_prompt_tokens_in_window():
    from types import SimpleNamespace

    from eaglelab.bench.setup import prompt_tokens_in_window

    cfg = SimpleNamespace(max_position_embeddings=256)
    assert prompt_tokens_in_window(cfg, 100, 32) == (100, None)
    keep, note = prompt_tokens_in_window(cfg, 512, 32)
    assert keep == 224 and "--max-new-tokens 32" in note


# ---- 2. distill's writer lock ---------------------------------------------------------------------------


def test_distill_refuses_an_out_another_writer_holds(valid, tmp_path, capsys, no_model):
    out = tmp_path / "distilled"
    out.mkdir()
    (out / ".eaglelab.lock").write_text(f"{os.getpid()} distill\n")  # this process: alive
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"index": 0, "source": "x", "kind": "x", "prompt": "w1 w2"}) + "\n")
    argv = ["distill", "--prompts", str(prompts), "--out", str(out), "--model", str(valid.target)]
    o = run_cli(argv, capsys)
    assert_handled(o, argv)
    text = flat(o.out + o.err)
    assert o.rc == 2 and "another eaglelab command is writing" in text and "distilled" in text, text
    assert (out / ".eaglelab.lock").read_text() == f"{os.getpid()} distill\n"  # the holder's lock is kept


# ---- 3. prompts / synthesize --out over an earlier corpus ---------------------------------------------------


@pytest.mark.parametrize("command", ["prompts", "synthesize"])
def test_corpus_out_is_not_overwritten_without_force(command, tmp_path, capsys, no_model):
    out = tmp_path / "corpus"
    out.mkdir()
    (out / "prompts.jsonl.gz").write_bytes(b"hours of sampling")
    argv = [command, "--out", str(out), "--count", "1"]
    o = run_cli(argv, capsys)
    assert_handled(o, argv)
    text = flat(o.out + o.err)
    assert o.rc == 2 and "prompts.jsonl.gz" in text and "--force" in text, text
    assert (out / "prompts.jsonl.gz").read_bytes() == b"hours of sampling"


def test_corpus_out_is_replaced_with_force(tmp_path, capsys):
    out = tmp_path / "corpus"
    out.mkdir()
    (out / "manifest.json").write_text("{}")
    argv = ["prompts", "--out", str(out), "--count", "20", "--force"]
    o = run_cli(argv, capsys)
    assert_handled(o, argv)
    assert o.rc == 0, o.err
    assert json.loads((out / "manifest.json").read_text())["count"] == 20


# ---- 4. bench --json over a file that is not a bench report ---------------------------------------------


@pytest.mark.parametrize("content", ["not json at all\n", '{"schema": "someone.else/1"}\n', "[1, 2]\n", "\xff"])
def test_bench_json_refuses_a_foreign_file_before_the_run(content, tmp_path, capsys, no_model):
    out = tmp_path / "notes.json"
    out.write_text(content, encoding="latin-1")
    argv = ["bench", "--scale-model", "tiny", "--device", "cpu", "--json", str(out)]
    o = run_cli(argv, capsys)
    assert_handled(o, argv[:-2])  # bench's --json names a file: nothing on stdout
    text = flat(o.out + o.err)
    assert o.rc == 2 and "notes.json" in text and "--force" in text, text
    assert out.read_text(encoding="latin-1") == content


def test_bench_json_check_passes_a_bench_report_and_force(tmp_path):
    """An earlier bench report may be replaced; anything else with --force only; a new file always. The flags
    are checked as the CLI checks them: parsed by bench's own parser (which registers --force), then validated."""
    from eaglelab.cli import build_parser
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.flags import validate

    path = tmp_path / "b.json"
    check = lambda *extra: validate(build_parser().parse_args(["bench", "--json", str(path), *extra]))  # noqa: E731
    check()  # absent
    path.write_text(json.dumps({"schema": "eaglelab.bench/1", "rows": []}))
    check()
    path.write_text("mine")
    with pytest.raises(EagleLabError, match="--force"):
        check()
    check("--force")


def test_every_command_whose_output_check_reads_force_registers_it():
    """The output checks that let --force replace a file read ``args.force``: each command they run for
    (run, bench, prompts, synthesize) must register the flag, or a parsed command line would lack it."""
    from eaglelab.cli import build_parser
    from eaglelab.flags import OUTPUT_CHECKS

    reads_force = {"_record_output", "_bench_json", "_corpus_out"}
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    commands = {c for c, checks in OUTPUT_CHECKS.items() if reads_force & {f.__name__ for f in checks}}
    assert commands == {"run", "bench", "prompts", "synthesize"}
    for command in commands:
        assert any("--force" in a.option_strings for a in sub.choices[command]._actions), command


# ---- 5. lone surrogates in a prompt typed on the command line -----------------------------------------------


@pytest.mark.parametrize("argv", [
    ["run", "\udcff"],
    ["trace", "\udcffhello", "--logdir", "LOGDIR"],
    ["bench", "--scale-model", "tiny", "--questions", "q\udcff.jsonl"],
])
def test_lone_surrogate_in_a_prompt_is_a_user_error(argv, tmp_path, capsys, no_model):
    argv = [str(tmp_path / "logs") if a == "LOGDIR" else a for a in argv]
    o = run_cli(argv, capsys)
    assert_handled(o, argv)
    text = flat(o.out + o.err)
    assert o.rc == 2 and "not valid UTF-8" in text and ("PROMPT" in text or "--questions" in text), text
