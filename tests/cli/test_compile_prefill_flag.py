"""`--compile-prefill`: where it cannot act (no CUDA graphs, or no --compile) the run says so instead of ignoring it,
and the plain baseline of a speculative run gets the same setting as the speculative engine."""

from __future__ import annotations

import argparse


from eaglelab.session import add_engine_args, build_session, compile_prefill_note
from eaglelab.engine.runtime.spec_config import SpecConfig


def test_on_a_cpu_the_run_says_compile_prefill_is_off_and_why(tiny_dir, capsys):
    from eaglelab.cli import main

    rc = main(["run", "w1 w2 w3", "--model", str(tiny_dir), "--device", "cpu", "--max-new-tokens", "3",
               "--draft", "ngram", "--compile-prefill"])
    out = " ".join("".join(capsys.readouterr()).split())
    assert rc == 0
    assert "compile-prefill: off (no CUDA graphs on a CPU" in out


def test_the_plain_baseline_compiles_its_prompt_when_the_speculative_engine_does(tiny_dir):
    p = argparse.ArgumentParser()
    add_engine_args(p)
    for flag in ("--compile-prefill", "--no-compile-prefill"):
        session = build_session(p.parse_args(["--model", str(tiny_dir), "--device", "cpu", "--draft", "ngram", flag]),
                                log=lambda m: None)
        assert session.spec.plain().compile_prefill == session.spec.compile_prefill == (flag == "--compile-prefill")


def test_the_note_names_what_is_missing():
    on = SpecConfig(cuda_graphs=True, compile=True, compile_prefill=True)
    assert compile_prefill_note(on, "cuda").startswith("compile-prefill: the prompt's phases compiled too")
    off = SpecConfig(cuda_graphs=True, compile=False, compile_prefill=True)
    assert "without --compile" in compile_prefill_note(off, "cuda")
    assert "no CUDA graphs on a CPU" in compile_prefill_note(on, "cpu")


def test_the_plain_spec_keeps_every_mode_a_baseline_must_share():
    """The baseline of a speculative run: no speculation, the same graphs, compile and compiled prompt."""
    spec = SpecConfig("eagle3", num_steps=5, topk=4, num_draft_tokens=16, cuda_graphs=True, compile=True,
                      compile_prefill=True)
    assert spec.plain() == SpecConfig(cuda_graphs=True, compile=True, compile_prefill=True)
    assert not spec.plain().enabled and SpecConfig().plain() == SpecConfig()


def test_bench_says_what_compile_prefill_does_in_its_configurations(tiny_dir, tmp_path, capsys):
    """bench's session has no --compile or --cuda-graphs of its own (its configurations set them): the note the session
    would write ("without --compile and --cuda-graphs") is replaced by bench's, which names the compiled configurations."""
    import json

    from eaglelab.cli import build_parser, main
    from eaglelab.bench.setup import compile_prefill_note as bench_note

    on_cuda = bench_note("cuda")
    assert "*-compile* configurations compile the prompt" in on_cuda and "without --compile" not in on_cuda
    args = build_parser().parse_args(["bench", "--model", str(tiny_dir), "--device", "cpu", "--compile-prefill"])
    assert args.bench_compile_prefill and not getattr(args, "compile_prefill", False)  # the configs' flag alone
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["w1 w2 w3"]}) + "\n")
    out = tmp_path / "bench.json"
    rc = main(["bench", "--model", str(tiny_dir), "--device", "cpu", "--draft", "ngram", "--questions", str(questions),
               "--configs", "plain-eager", "--batch-sizes", "1", "--prompts", "1", "--max-new-tokens", "3",
               "--repeats", "1", "--no-micro", "--compile-prefill", "--json", str(out)])
    assert rc == 0, capsys.readouterr()
    notes = [n for n in json.loads(out.read_text())["notes"] if n.startswith("compile-prefill:")]
    assert notes == [bench_note("cpu")]
