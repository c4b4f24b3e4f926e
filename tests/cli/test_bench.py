"""``eaglelab bench`` end to end on CPU with the tiny scale model (graphs off there)."""

from __future__ import annotations

import json

import pytest
import torch

from eaglelab.cli import main

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku about the sea.", "again"]},
    {"question_id": 2, "category": "math", "turns": ["What is 12 times 12?"]},
    {"question_id": 3, "category": "coding", "turns": ["Reverse a list in Python."]},
]


@pytest.fixture()
def questions(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    return path


pytestmark = pytest.mark.usefixtures("one_thread", "idle_machine")


def test_bench_runs_on_cpu_and_writes_the_report(tmp_path, questions, capsys):
    out = tmp_path / "bench.json"
    rc = main([
        "bench", "--scale-model", "tiny", "--device", "cpu", "--questions", str(questions),
        "--configs", "plain-eager,plain-graphs,spec-prefill,spec-decode,hf", "--batch-sizes", "1,2",
        "--prompts", "2", "--max-new-tokens", "6", "--repeats", "1", "--micro-context", "16", "--json", str(out),
    ])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert rep["schema"] == "eaglelab.bench/1"
    assert {"hardware", "settings", "notes", "rows", "micro", "captures", "headline"} <= set(rep)
    assert rep["hardware"]["device"] == "cpu" and rep["hardware"]["dtype"] == "float32"
    assert rep["settings"]["speedup_baseline"] == "plain-eager"  # no graphs on CPU
    rows = {(r["config"], r["batch"]): r for r in rep["rows"]}
    assert len(rows) == 10
    assert rep["not_run"] == {"plain-graphs": "CUDA graphs need a CUDA device"}
    for b in (1, 2):
        assert rows[("plain-graphs", b)]["skipped"] == "CUDA graphs need a CUDA device"
        plain = rows[("plain-eager", b)]
        assert plain["speedup"] == 1.0 and plain["tok_per_s"] > 0 and plain["tokens"] == 2 * 6  # every prompt
        assert plain["decode_ms"] > 0 and plain["graph"] == {"decode": "eager: CUDA graphs off"}
        assert plain["busy_rows"] == 1.0  # every row of a group runs 6 tokens: busy every step
        assert 0.0 < plain["prefill_share"] < 1.0
        for cfg in ("spec-prefill", "spec-decode"):
            r = rows[(cfg, b)]
            assert r["tokens"] == 2 * 6 and 1.0 <= r["mean_accept_len"] <= 4.0
            assert r["verify_ms"] > 0 and r["draft_ms"] > 0 and r["extend_ms"] > 0
            assert r["verify_over_decode"] == pytest.approx(r["verify_ms"] / plain["decode_ms"])
            assert r["speedup"] == pytest.approx(r["tok_per_s"] / plain["tok_per_s"])
            assert r["same_tokens_as_plain_eager"] == 1.0  # float32: speculation is exact
            assert r["prefill_ms"] > 0 and r["begin_ms"] > 0  # per request: the prompt, the drafter's extend over it
        assert plain["prefill_ms"] > 0 and plain["begin_ms"] is None  # no drafter
        assert rows[("hf", b)]["tok_per_s"] > 0 and rows[("hf", b)]["tokens"] == b * 6  # the first group
    assert rows[("spec-prefill", 1)]["graph"]["verify"] == "eager: CUDA graphs off"
    # micro: per batch size, the decode and N = 2..8 in both attention modes (eager only on CPU)
    assert len(rep["micro"]) == 1 * (1 + 7 * 2)  # CPU default: micro at batch 1 only
    assert all(m["ms"] > 0 for m in rep["micro"])
    assert {m["over_decode"] for m in rep["micro"] if m["tokens"] == 1} == {1.0}
    head = rep["headline"]
    plain1 = rows[("plain-eager", 1)]
    assert set(head["verify_over_decode_batch1"]) == {"decode-eager", "prefill-eager"}
    assert head["plain_vs_hf_batch1"]["ratio"] == pytest.approx(rows[("plain-eager", 1)]["tok_per_s"] / rows[("hf", 1)]["tok_per_s"])
    assert "bandwidth_bound_batch1" not in head  # an HBM bound means nothing on CPU unless --hbm-tbps is given
    captured = capsys.readouterr()
    printed, capsys_err = captured.out, captured.err
    assert "headline" in printed and "spec-decode speedup over plain-eager" in printed
    flat = " ".join(printed.split())
    assert flat.count("plain-graphs") == 1, "a configuration that cannot run here is named once"
    assert "not run here: plain-graphs (CUDA graphs need a CUDA device)" in flat
    for cfg in ("spec-prefill", "spec-decode"):  # batch 1: a speedup per prompt, each against plain on that prompt
        r = rows[(cfg, 1)]
        assert len(r["group_speedups"]) == 2 and len(r["group_tok_per_s"]) == 2 and all(r["group_accept_len"])
        assert r["group_speedups"][0] == pytest.approx(r["group_tok_per_s"][0] / plain1["group_tok_per_s"][0])
        spread = head["spec_speedup_spread"][cfg]["1"]  # JSON keys
        assert spread["groups"] == 2 and spread["min"] <= spread["median"] <= spread["max"]
    assert len(rows[("spec-decode", 2)]["group_speedups"]) == 1  # both prompts in one group: no spread to show
    assert rows[("spec-decode", 1)]["prefills"] == 2 and rows[("spec-decode", 2)]["prompts_per_prefill"] == 2.0
    assert "2" not in head["spec_speedup_spread"]["spec-decode"]
    assert "b1, prompt group by group (2)" in " ".join(printed.split())
    assert "per request, ms" in printed
    logged = " ".join(capsys_err.split())
    for b in (1, 2):  # each speculative configuration's first line names the tree it drafts
        assert f"spec-decode, batch {b}: speculative, decode-mode verify, eager; tree: 3 steps, topk 1, 4 draft tokens" in logged


def test_the_request_table_gives_a_requests_wall_time():
    """A request's wall time = a group's tokens / tok/s: 2 groups of 64 tokens at 2,000 tok/s -> 32.0 ms;
    the prompt's and the drafter's per-request phases beside it; a row never observed is left out."""
    from rich.console import Console

    from eaglelab.bench.harness import BenchRow
    from eaglelab.cmd_bench import _request_table

    rows = [BenchRow(config="spec-compile-gemv-attn", batch=1, tok_per_s=2000.0, tokens=128,
                     group_tok_per_s=(1900.0, 2100.0), prefill_ms=3.25, begin_ms=0.41, busy_rows=0.797,
                     prefill_share=0.113),
            BenchRow(config="hf", batch=1, tok_per_s=12.0, tokens=64, group_tok_per_s=(12.0,))]
    console = Console(width=80, record=True)
    console.print(*_request_table(rows))
    text = console.export_text()
    assert "32.0" in text and "3.25" in text and "0.41" in text and "hf" not in text
    assert "80%" in text and "11%" in text  # rows x cycles that made tokens; the pass's time in prompt forwards
    assert _request_table(rows[1:]) == []


def test_bench_rejects_an_unknown_config(questions, capsys):
    rc = main(["bench", "--scale-model", "tiny", "--device", "cpu", "--configs", "plain-eager,warp-drive",
               "--questions", str(questions)])
    assert rc == 2
    assert "warp-drive" in capsys.readouterr().err


def test_unknown_scale_model_is_a_user_error(questions, capsys):
    rc = main(["bench", "--scale-model", "gpt-5", "--device", "cpu", "--questions", str(questions)])
    assert rc == 2
    assert "unknown scale model" in capsys.readouterr().err


def _bench_with_second_batch(tmp_path, questions, monkeypatch, at_second):
    """A tiny two-batch-size bench whose second batch size first calls ``at_second()`` -> (rc, batches run, JSON path)."""
    from eaglelab.bench import harness

    real, ran = harness.run_batch, []

    def second(cfgs, ctx, batch, systems, **kw):
        ran.append(batch)
        if len(ran) == 2:
            at_second()
        return real(cfgs, ctx, batch, systems, **kw)

    monkeypatch.setattr(harness, "run_batch", second)
    out = tmp_path / "bench.json"
    rc = main(["bench", "--scale-model", "tiny", "--device", "cpu", "--questions", str(questions),
               "--configs", "plain-eager,spec-decode", "--batch-sizes", "1,2", "--prompts", "2", "--max-new-tokens", "4",
               "--repeats", "1", "--no-micro", "--json", str(out)])
    return rc, ran, out


def test_a_bench_cut_short_keeps_the_partial_report(tmp_path, questions, monkeypatch, capsys):
    """The second batch size fails: the JSON holds the first's rows, marked partial."""
    def fails():
        raise RuntimeError("the machine went away")

    rc, ran, out = _bench_with_second_batch(tmp_path, questions, monkeypatch, fails)
    assert rc != 0 and ran == [1, 2]
    rep = json.loads(out.read_text())
    assert rep["partial"] is True and [(r["config"], r["batch"]) for r in rep["rows"]] == [("plain-eager", 1),
                                                                                          ("spec-decode", 1)]
    assert rep["rows"][0]["speedup"] == 1.0 and "profile" not in rep and "tp" not in rep


def test_a_bench_stopped_by_sigterm_keeps_the_partial_report_and_exits_130(tmp_path, questions, monkeypatch, capsys):
    """`timeout` sends SIGTERM during the second batch size: the run ends as Ctrl-C does (exit 130, "interrupted",
    no traceback), the JSON holding the first's rows, marked partial."""
    import os
    import signal

    def terminated():
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, "SIGTERM would kill the run (and pytest)"
        os.kill(os.getpid(), signal.SIGTERM)

    rc, ran, out = _bench_with_second_batch(tmp_path, questions, monkeypatch, terminated)
    err = capsys.readouterr().err
    assert rc == 130 and ran == [1, 2] and "Traceback" not in err
    flat = " ".join(err.split())
    assert f'interrupted: what was measured (2 rows) is in {out} ("partial": true)' in flat, flat
    assert flat.count("interrupted") == 1, "one line says it"
    rep = json.loads(out.read_text())
    assert rep["partial"] is True and [r["batch"] for r in rep["rows"]] == [1, 1]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_bench_stopped_in_its_observed_pass_keeps_the_timed_passes_figures(tmp_path, questions, monkeypatch, capsys):
    """SIGTERM while the phase costs are observed, after every timed pass of the batch size: the partial JSON holds
    each configuration's row with its tok/s and speedup (the figures the passes measured), no phase costs; exit 130.
    It once printed "interrupted" and kept nothing of a batch size whose passes had all run."""
    import os
    import signal

    from eaglelab.bench import harness

    def terminated(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(harness, "observe_phases", terminated)
    out = tmp_path / "bench.json"
    rc = main(["bench", "--scale-model", "tiny", "--device", "cpu", "--questions", str(questions),
               "--configs", "plain-eager,spec-decode", "--batch-sizes", "1", "--prompts", "2", "--max-new-tokens", "4",
               "--repeats", "2", "--no-micro", "--json", str(out)])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 130 and "Traceback" not in err and 'what was measured (2 rows)' in err, err
    rep = json.loads(out.read_text())
    rows = {r["config"]: r for r in rep["rows"]}
    assert rep["partial"] is True and sorted(rows) == ["plain-eager", "spec-decode"]
    spec, plain = rows["spec-decode"], rows["plain-eager"]
    assert len(spec["sweeps_tok_per_s"]) == 2 and spec["tok_per_s"] > 0 and plain["speedup"] == 1.0
    ratios = [a / b for a, b in zip(spec["sweeps_tok_per_s"], plain["sweeps_tok_per_s"])]
    assert spec["speedup"] == pytest.approx(sum(ratios) / 2)  # the median of two passes' ratios
    assert spec["verify_ms"] is None and spec["mean_accept_len"] is not None


def test_a_bench_cut_short_after_the_profile_keeps_it_in_the_partial_report(tmp_path, questions, monkeypatch, capsys):
    """The micro-measure (after --profile) fails: the JSON holds the rows and the profile, marked partial."""
    from eaglelab.bench import micro

    def fails(*a, **k):
        raise RuntimeError("the machine went away")

    monkeypatch.setattr(micro, "micro_measure", fails)
    out = tmp_path / "bench.json"
    rc = main(["bench", "--scale-model", "tiny", "--device", "cpu", "--questions", str(questions),
               "--configs", "plain-eager", "--batch-sizes", "1", "--prompts", "2", "--max-new-tokens", "4",
               "--repeats", "1", "--profile", "--micro", "--json", str(out)])
    assert rc != 0
    rep = json.loads(out.read_text())
    assert rep["partial"] is True and [r["config"] for r in rep["rows"]] == ["plain-eager"]
    assert [p["batch"] for p in rep["profile"]] == [1] and rep["micro"] == []


def test_configs_none_with_nothing_else_to_measure_is_refused_before_the_model_builds(questions, capsys):
    # It once built the model, measured nothing and printed an empty headline, exit 0.
    rc = main(["bench", "--scale-model", "tiny", "--device", "cpu", "--questions", str(questions), "--configs", "none",
               "--no-micro"])
    printed = capsys.readouterr()
    err = " ".join(printed.err.split())
    assert rc == 2 and "--configs" in err and "nothing else to measure" in err and "--profile" in err, err
    assert "building tiny" not in err and "headline" not in printed.out


def test_the_scale_models_random_drafter_takes_the_draft_vocabulary_asked(tmp_path, questions, capsys):
    """--draft-vocab sizes the random drafter's head (the tree's top-k runs over it); fewer than --topk is refused."""
    out = tmp_path / "bench.json"
    args = ["bench", "--scale-model", "tiny", "--device", "cpu", "--questions", str(questions), "--configs",
            "spec-decode", "--batch-sizes", "1", "--prompts", "1", "--max-new-tokens", "4", "--no-micro",
            "--steps", "2", "--topk", "2", "--draft-tokens", "4"]
    assert main(args + ["--draft-vocab", "64", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert any("64-token draft vocabulary" in n for n in rep["notes"])
    assert rep["rows"][0]["tokens"] == 4
    capsys.readouterr()
    assert main(args + ["--draft-vocab", "1"]) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "--draft-vocab" in err and "at least --topk" in err and "Traceback" not in err
    assert "building tiny" not in err  # said before the model is built
    real = ["bench", "--model", "default", "--device", "cpu", "--questions", str(questions), "--draft-vocab", "64"]
    assert main(real) != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "random drafter of --scale-model" in err and "Traceback" not in err


def test_speedups_read_against_the_plain_configuration_that_ran():
    """plain-graphs first, then plain-eager, else the plain configuration with the most turned on: a bench of
    plain-compile-gemv-attn beside spec-compile-gemv-attn states its speedup (it said "over None")."""
    from eaglelab.bench.harness import BenchRow, baseline_name, finish_rows

    def rows(*names):
        return [BenchRow(config=n, batch=1, tok_per_s=100.0 * (i + 1), decode_ms=1.0 if n.startswith("plain") else None,
                         verify_ms=None if n.startswith("plain") else 1.2) for i, n in enumerate(names)]

    assert baseline_name(rows("plain-eager", "plain-graphs", "spec-decode")) == "plain-graphs"
    assert baseline_name(rows("plain-compile", "plain-eager")) == "plain-eager"
    assert baseline_name(rows("plain-compile", "plain-compile-gemv-attn", "spec-compile-gemv-attn")) == \
        "plain-compile-gemv-attn"
    assert baseline_name(rows("spec-compile", "hf")) is None
    done = finish_rows(rows("plain-compile-gemv-attn", "spec-compile-gemv-attn"), {})
    assert [r.speedup for r in done] == [1.0, 2.0] and done[1].verify_over_decode == pytest.approx(1.2)


def test_the_tables_read_whole_at_80_columns():
    """No header or figure cut to an ellipsis at 80 columns, the graph column included (a mixed status wraps)."""
    from rich.console import Console

    from eaglelab.bench.harness import BenchRow
    from eaglelab.cmd_bench import _rows_table

    graphs = {"draft": "replay", "verify": "eager: extend", "draft_extend": "replay"}
    rows = [BenchRow(config="plain-compile-gemv-attn", batch=1, tok_per_s=1183.8, decode_ms=0.813,
                     graph={"decode": "replay"}, speedup=1.0, tokens=3072, group_tok_per_s=(1180.0,) * 24,
                     prefill_ms=1.107),
            BenchRow(config="spec-compile-gemv-attn", batch=8, tok_per_s=2276.6, mean_accept_len=3.3, verify_ms=10.911,
                     draft_ms=0.361, extend_ms=0.063, speedup=1.92, verify_over_decode=1.12, graph=graphs,
                     tokens=3072, group_tok_per_s=(2270.0,) * 3, prefill_ms=12.345, begin_ms=0.987)]
    console = Console(width=80, record=True)
    console.print(_rows_table(rows, "plain-compile-gemv-attn"))
    text = console.export_text()
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    for word in ("graphs", "extend", "10.911", "0.063", "ver:E", "plain-compile-gemv-attn", "drafter's extend",
                 "whole request", "12.35", "0.99", "1.11"):
        assert word in text, word


def test_every_prompt_is_timed_at_every_batch_size():
    """A pass times every prompt (in groups of the batch size), not one group per repeat: at batch 1 with 8 prompts
    and 2 repeats, the old harness timed 2 prompts, so one prompt whose text fell into a loop moved the figure."""
    from types import SimpleNamespace

    from eaglelab.bench import harness as H

    prompts = [[i + 1] * (i + 2) for i in range(5)]
    timed: list[list[list[int]]] = []

    def generate(group, max_new):
        if max_new == 4:  # the timed calls (the warm-up asks for min(8, M) = 4 tokens here too: counted apart below)
            timed.append(group)
        return SimpleNamespace(tokens=[[7] * max_new for _ in group], accept_lens=[[2, 3]], setup_seconds=0.0)

    ctx = H.BenchContext(target=torch.nn.Linear(2, 2), spec=None, make_drafter=None, prompts=prompts,
                         max_new_tokens=4, batch_sizes=(1,), repeats=2)
    for batch, n_groups in ((1, 5), (2, 3)):
        timed.clear()
        row, outs = H.measure(generate, None, H.CONFIGS["plain-eager"], ctx, batch, repeats=2)
        assert len(timed) == 1 + 2 * n_groups  # the warm-up, then two passes over every group
        assert [p for g in timed[1:1 + n_groups] for p in g][:5] == prompts
        assert row.tokens == n_groups * batch * 4 and len(outs) == n_groups * batch
        assert len(row.sweeps_tok_per_s) == 2
        assert len(row.group_tok_per_s) == n_groups and row.group_accept_len == (2.5,) * n_groups  # per group, pass 1
        timed.clear()
        H.measure(generate, None, H.CONFIGS["plain-eager"], ctx, batch, repeats=1, first_group_only=True)
        assert len(timed) == 2  # the HF peer's way: the warm-up and the first group once


def test_continuous_serves_every_prompt_once_through_the_rows(tmp_path, questions, capsys):
    """``--continuous``: at batch 2 the three prompts go through two rows as one queue (three requests' tokens, none
    repeated to fill a batch), the same tokens as plain decoding, the report saying so; with --figures it is refused."""
    out = tmp_path / "bench.json"
    rc = main(["bench", "--scale-model", "tiny", "--device", "cpu", "--questions", str(questions), "--continuous",
               "--configs", "plain-eager,spec-decode", "--batch-sizes", "2", "--prompts", "3", "--max-new-tokens", "6",
               "--repeats", "1", "--no-micro", "--json", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert rep["settings"]["continuous"] is True
    rows = {r["config"]: r for r in rep["rows"]}
    assert rows["plain-eager"]["tokens"] == rows["spec-decode"]["tokens"] == 3 * 6  # not 4 x 6 (a wrapped batch)
    assert rows["spec-decode"]["same_tokens_as_plain_eager"] == 1.0
    assert len(rows["spec-decode"]["group_tok_per_s"]) == 1  # one queue
    said = [n for n in rep["notes"] if n.startswith("--continuous")]  # 3 prompts keep 2 rows busy: no "one batch"
    assert said == ["--continuous: free rows wait for 1 at batch 2 to be prefilled together"]
    assert rep["settings"]["refill_rows"] == {"2": 1}
    for r in rows.values():  # the first two prompts in one prompt forward, the third in a refill of its own
        assert r["prefills"] == 2 and r["prompts_per_prefill"] == 1.5
    capsys.readouterr()
    rc = main(["bench", "--figures", "--continuous", "--scale-model", "tiny", "--device", "cpu"])
    assert rc != 0
    err = " ".join(capsys.readouterr().err.split())
    assert "--continuous" in err and "--prompts 80" in err
    from argparse import Namespace

    from eaglelab.bench.setup import setup_bench
    from eaglelab.engine.errors import EagleLabError

    with pytest.raises(EagleLabError, match="tensor parallelism") as refused:  # --tp 2: said before any rank loads
        setup_bench(Namespace(continuous=True, tp=2, device="cpu"), lambda m: None, tp=object())
    assert refused.value.field == "--continuous"


@pytest.mark.parametrize("flag, flags, found", [
    ("--refill-rows", ["--refill-rows", "2"], "2 without --continuous"),  # for rows served continuously
    ("--refill-rows", ["--continuous", "--refill-rows", "0"], "0"),  # at least one
    ("--lookup-tokens", ["--draft", "ngram", "--lookup-tokens", "4"], "algorithm ngram"),  # beside EAGLE-3 only
    ("--lookup-tokens", ["--lookup-tokens", "99"], "99"),  # past its range
])
def test_a_flag_is_refused_where_it_means_nothing(questions, capsys, flag, flags, found):
    """A bench flag that cannot apply: the flag and what was found said, a non-zero exit, no traceback."""
    rc = main(["bench", "--scale-model", "tiny", "--device", "cpu", "--questions", str(questions), "--configs",
               "plain-eager,spec-decode", "--batch-sizes", "2", "--prompts", "3", "--max-new-tokens", "2",
               "--repeats", "1", "--no-micro", *flags])
    err = " ".join(capsys.readouterr().err.split())
    assert rc != 0 and flag in err and found in err and "Traceback" not in err


def test_refill_rows_reaches_the_engine(tmp_path, questions, monkeypatch):
    """``--continuous --refill-rows 5`` at batch 2: capped at the batch, both rows wait for each other in every served
    run, and the report says 2."""
    from eaglelab.engine.runtime import serving

    seen, serve = [], serving.serve
    monkeypatch.setattr(serving, "serve", lambda *a, **k: seen.append(a[-1]) or serve(*a, **k))
    out = tmp_path / "bench.json"
    rc = main(["bench", "--scale-model", "tiny", "--device", "cpu", "--questions", str(questions), "--continuous",
               "--refill-rows", "5", "--configs", "plain-eager", "--batch-sizes", "2", "--prompts", "3",
               "--max-new-tokens", "4", "--repeats", "1", "--no-micro", "--json", str(out)])
    assert rc == 0
    rep = json.loads(out.read_text())
    assert rep["settings"]["refill_rows"] == {"2": 2}
    assert seen and set(seen) == {2}


def test_continuous_with_no_more_prompts_than_rows_says_one_batch_and_no_refill(tmp_path, questions):
    """``--continuous`` at batch 4 with 3 prompts: one batch of 3 rows, said; no refill note (nothing is refilled)."""
    out = tmp_path / "bench.json"
    rc = main(["bench", "--scale-model", "tiny", "--device", "cpu", "--questions", str(questions), "--continuous",
               "--configs", "plain-eager", "--batch-sizes", "4", "--prompts", "3", "--max-new-tokens", "2",
               "--repeats", "1", "--no-micro", "--json", str(out)])
    assert rc == 0
    said = [n for n in json.loads(out.read_text())["notes"] if n.startswith("--continuous")]
    assert said == ["--continuous: the 3 prompts served through each batch size's rows; at batch 4 that is one batch "
                    "of 3 rows"]


def _engine_specs(questions, monkeypatch, configs: str, *flags: str) -> list:
    """A tiny scale model's bench at batch 1 and 2 with ``flags`` -> the SpecConfig of every engine it built."""
    from eaglelab.bench import harness

    seen = []
    real = harness.engine_spec

    def spy(cfg, ctx, batch=None):
        seen.append(real(cfg, ctx, batch))
        return seen[-1]

    monkeypatch.setattr(harness, "engine_spec", spy)
    rc = main(["bench", "--scale-model", "tiny", "--device", "cpu", "--questions", str(questions), "--configs",
               configs, "--batch-sizes", "1,2", "--prompts", "2", "--max-new-tokens", "4", "--repeats", "1",
               "--no-micro", *flags])
    assert rc == 0
    return seen


def test_a_lookup_branch_reaches_every_batch_sizes_engine(questions, monkeypatch):
    """``--lookup-tokens 3`` on a scale model: the spec of each batch size's engine carries it, and the report's
    tree says so."""
    seen = _engine_specs(questions, monkeypatch, "plain-eager,spec-decode", "--lookup-tokens", "3")
    spec = [s for s in seen if s.enabled]
    assert spec and all(s.lookup_tokens == 3 and s.tree_nodes == s.draft_tokens + 3 for s in spec)
    assert all(s.lookup_tokens == 0 for s in seen if not s.enabled)


@pytest.mark.parametrize("flag, spills", [(None, True), ("--no-lookup-spill", False), ("--lookup-spill", True)])
def test_a_scale_models_branch_spills_as_the_flag_says(questions, monkeypatch, flag, spills):
    """On a scale model too the branch spills by default where the tree holds its rows (3/2/6 + 3: 11 candidates
    for 9 rows), and --no-lookup-spill / --lookup-spill reach every engine (they once never left the registry)."""
    seen = _engine_specs(questions, monkeypatch, "spec-decode", "--steps", "3", "--topk", "2", "--draft-tokens", "6",
                         "--lookup-tokens", "3", *([flag] if flag else []))
    assert seen and all(s.spills is spills for s in seen)
    assert all(("spilling" in s.tree_label) is spills for s in seen)


def test_lookup_spill_without_a_branch_says_nothing_spills(questions, tmp_path):
    """--lookup-spill on a tree with no lookup branch is not an error (the branch may come from a profile at other
    batch sizes), but the report's notes say that nothing spills, and how to add a branch."""
    out = tmp_path / "b.json"
    rc = main(["bench", "--scale-model", "tiny", "--device", "cpu", "--questions", str(questions), "--configs",
               "spec-decode", "--batch-sizes", "1", "--prompts", "2", "--max-new-tokens", "4", "--repeats", "1",
               "--no-micro", "--lookup-spill", "--json", str(out)])
    assert rc == 0
    notes = json.loads(out.read_text())["notes"]
    assert ("--lookup-spill: the tree at batch 1 has no lookup branch, so nothing spills there "
            "(--lookup-tokens K adds one)") in notes


def test_the_tree_note_per_batch_size_names_the_profiles_lookup_branch():
    """A batch size whose profile bucket differs from batch 1's is noted with its whole tree, the branch included."""
    from eaglelab.bench.setup import tree_notes
    from eaglelab.draft_registry import DraftChoice
    from eaglelab.profiles import BucketChoice, DeviceProfile

    profile = DeviceProfile("NVIDIA H200", "bfloat16", "a" * 64, (
        BucketChoice(1, 5, 4, 24, "2.19x", lookup_tokens=16), BucketChoice(8, 4, 4, 12, "1.61x", lookup_tokens=8),
        BucketChoice(32, 2, 1, 3, "1.33x")))
    draft = DraftChoice("eagle3", None, None, (), profile=profile)
    assert tree_notes(draft, (1, 8, 32)) == [
        "tree at batch 8: 4 steps, topk 4, 12 draft tokens, lookup 8 (the profile's bucket for batch <= 8: 1.61x)",
        "tree at batch 32: 2 steps, topk 1, 3 draft tokens (the profile's bucket for batch <= 32: 1.33x)"]


def test_busy_rows_count_the_live_rows_of_each_cycle_against_the_rows_a_call_runs():
    """Speculative: the live rows the engine lists per cycle; plain: a row's tokens after its first (its prompt's
    forward makes that one); over the rows x steps the engine says each call ran (``row_cycles``: served, the batch's
    rows, not the queue's; a shed batch, fewer: tests/engine/runtime/test_serve.py and test_shrink.py)."""
    from types import SimpleNamespace

    from eaglelab.bench.harness import busy_row_cycles, prefill_share, sweep

    spec = SimpleNamespace(tokens=[[1] * 7, [1] * 4], accept_lens=[[3, 2], [3, 1], [0]], cycles=3,
                           setup_seconds=0.0, prefill_rows=[2])
    assert busy_row_cycles(spec) == 5  # 2 + 2 + 1 live rows
    plain = SimpleNamespace(tokens=[[1] * 6, [1] * 3], accept_lens=[], cycles=5, setup_seconds=0.0, prefill_rows=[2],
                            row_cycles=5 * 2)
    assert busy_row_cycles(plain) == 5 + 2
    assert busy_row_cycles(SimpleNamespace(tokens=[[1, 2]])) is None  # the HF peer: no cycles
    got = sweep(lambda g, m: plain, [[[1], [2]]], 6, torch.device("cpu"), clock=iter(range(10)).__next__)
    assert got.busy_rows == 7 / (5 * 2) and got.row_slots == 10
    twice = sweep(lambda g, m: plain, [[[1], [2]], [[3], [4]]], 6, torch.device("cpu"), clock=iter(range(10)).__next__)
    assert twice.busy_rows == 14 / 20 and twice.row_slots == 20  # summed over calls
    assert sweep(lambda g, m: SimpleNamespace(tokens=[[1]]), [[[1]]], 6, torch.device("cpu"),
                 clock=iter(range(10)).__next__).busy_rows is None
    assert prefill_share(10, 2.0, 0.5, 0.25) == pytest.approx(0.1)  # 10 x 2.5 ms of 250 ms
    assert prefill_share(0, 2.0, None, 1.0) is None and prefill_share(3, None, None, 1.0) is None
