"""``eaglelab tune``: predictions from a record (nothing run), user errors, and on the real model,
predicted against measured accepted length."""

from __future__ import annotations

import json

import pytest

from eaglelab.cli import main
from eaglelab.probes import tuning as T
from eaglelab.probes.events import PhaseCost, RunStarted, Step
from eaglelab.probes.record import RecordWriter

# Row-cycles of a wide tree (3 steps, topk 2): (ranks of the accepted path, last node expanded)
ROWS = [((1, 1, 1), False)] * 4 + [((1, 1), True)] * 2 + [((1,), True)] * 2 + [((2,), True), ((), True), ((2, 1), True)]


def _write(path, *, ranks: bool = True, costs: bool = True) -> None:
    with RecordWriter(path) as w:
        w(RunStarted("SmolLM2-test", "d", "cuda:0 (NVIDIA H200)", "bfloat16", 1,
                     {"algorithm": "eagle3", "num_steps": 3, "topk": 2, "num_draft_tokens": 11}, {}, {}))
        for i, (r, is_open) in enumerate(ROWS):
            w(Step(index=i, kind="spec", phase_ms={"verify": 1.0}, accept_len=(len(r) + 1,),
                   accepted_positions=((1,) * len(r),), num_draft_tokens=11,
                   accepted_ranks=(r,) if ranks else (), path_open=(is_open,) if ranks else ()))
        if costs:
            w(PhaseCost("decode", 1, 10.0))
            w(PhaseCost("prefill", 1, 30.0))
            for n in range(2, 9):
                w(PhaseCost("verify", 1, 10.0 + 0.5 * n, tokens=n))
            for s in (1, 2, 3):
                for k in (1, 2):
                    for phase, ms in (("draft", 1.0 + 1.5 * (s - 1) * k), ("draft_extend", 2.0), ("accept", 0.5)):
                        w(PhaseCost(phase, 1, ms, steps=s, topk=k))


def test_tune_from_a_record_predicts_without_running(tmp_path, capsys):
    rec, out = tmp_path / "wide.jsonl", tmp_path / "tune.json"
    _write(rec)
    assert main(["tune", "--from", str(rec), "--json", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    report = json.loads(out.read_text())
    # depth 1 offered by all 11 row-cycles: 8 top-1, 2 second; depth 2 offered by the 10 whose depth-1
    # node was expanded (all that reached depth 1), 7 of them top-1 ((1, 1, 1) x4, (1, 1) x2, (2, 1))
    rates = report["acceptance"]["rates"]
    assert rates[0] == pytest.approx([8 / 11, 2 / 11])
    assert rates[1] == pytest.approx([7 / 10, 0.0])
    assert report["acceptance"]["offered"] == [11, 10, 7]  # depth 3: (1, 1, 1) x4, (1, 1) x2, (2, 1)
    table = T.AcceptanceTable(tuple(tuple(r) for r in rates))
    preds = report["predictions"]["1"]
    best = preds[0]
    assert best["accept_len"] == pytest.approx(T.expected_accept_len(table, best["steps"], best["topk"], best["draft_tokens"]))
    assert [p["tok_per_s"] for p in preds] == sorted((p["tok_per_s"] for p in preds), reverse=True)
    assert {(p["steps"], p["topk"]) for p in preds} == {(s, k) for s in (1, 2, 3) for k in (1, 2)}
    assert f"--speculative-num-steps {best['steps']} --speculative-eagle-topk {best['topk']}" in text
    assert '"method": "eagle3"' in text and "nothing was run" in text
    assert report["confirmation"] == []


def test_tune_from_a_record_without_costs_ranks_by_accepted_length(tmp_path, capsys):
    rec, out = tmp_path / "wide.jsonl", tmp_path / "tune.json"
    _write(rec, costs=False)
    assert main(["tune", "--from", str(rec), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["predictions"] == {}
    lens = [r["accept_len"] for r in report["by_accept_len"]]
    assert lens == sorted(lens, reverse=True) and lens[0] > 1.0
    assert "no phase costs" in " ".join(capsys.readouterr().out.split())


def test_tune_from_a_record_without_ranks_is_a_user_error(tmp_path, capsys):
    rec = tmp_path / "old.jsonl"
    _write(rec, ranks=False)
    rc = main(["tune", "--from", str(rec)])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "old.jsonl" in err and "accepted ranks" in err and "Traceback" not in err


def test_tune_refuses_the_ngram_drafter(capsys):
    rc = main(["tune", "--draft", "ngram", "--device", "cpu"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "--draft" in err and "EAGLE-3" in err


@pytest.mark.slow
def test_tune_on_the_real_model_predicts_the_winners_accepted_length_within_10_percent(tmp_path, default_target, one_thread):
    """A small pass on SmolLM2-135M with the shipped drafter (CPU): the chosen configuration's
    predicted accepted length is within 10% of what its real run measures on the same prompts;
    the record it wrote gives the same acceptance table through --from."""
    out, rec, again = tmp_path / "tune.json", tmp_path / "tune.jsonl", tmp_path / "again.json"
    rc = main(["tune", "--device", "cpu", "--steps", "1,2,3", "--topk", "1,2", "--draft-tokens", "2,3,4,6",
               "--prompts", "3", "--max-new-tokens", "32", "--cost-tokens", "6", "--confirm", "1",
               "--record", str(rec), "--json", str(out)])
    assert rc == 0
    report = json.loads(out.read_text())
    plain, winner = report["confirmation"]
    assert plain["steps"] == 0 and plain["measured_tok_per_s"] > 0
    best = report["predictions"]["1"][0]
    assert (winner["steps"], winner["topk"], winner["draft_tokens"]) == (best["steps"], best["topk"], best["draft_tokens"])
    predicted, measured = winner["predicted_accept_len"], winner["measured_accept_len"]
    assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)
    assert main(["tune", "--from", str(rec), "--json", str(again)]) == 0
    assert json.loads(again.read_text())["acceptance"] == report["acceptance"]


def test_tune_compile_measures_the_bench_compile_configs():
    """--compile on CUDA: tune's systems are bench's plain-compile / spec-compile (graphs of compiled
    phases); on CPU, where there are no graphs to compile, it is off (and a note says so)."""
    from types import SimpleNamespace

    import torch

    from eaglelab.bench.tune import config_for
    from eaglelab.cli import build_parser
    from eaglelab.cmd_tune import _settings
    from eaglelab.engine.runtime.spec_config import SpecConfig

    args = build_parser().parse_args(["tune", "--compile"])
    on_gpu, _ = _settings(args, cuda=True)
    on_cpu, _ = _settings(args, cuda=False)
    assert on_gpu.compile and not on_cpu.compile
    assert not _settings(build_parser().parse_args(["tune"]), cuda=True)[0].compile
    gpu, cpu, spec = SimpleNamespace(device=torch.device("cuda")), SimpleNamespace(device=torch.device("cpu")), SpecConfig("eagle3")
    assert (config_for(gpu, on_gpu, None).name, config_for(gpu, on_gpu, spec).name) == ("plain-compile", "spec-compile")
    assert config_for(gpu, on_gpu, spec).compile and config_for(gpu, on_gpu, spec).graphs
    assert (config_for(gpu, on_cpu, spec).name, config_for(gpu, on_cpu, spec).compile) == ("spec-decode-graphs", False)
    assert (config_for(cpu, on_cpu, None).name, config_for(cpu, on_cpu, None).graphs) == ("plain-eager", False)
