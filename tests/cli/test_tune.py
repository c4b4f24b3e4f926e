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
    assert rc == 2 and "--draft" in err and "EAGLE-3" in err and "does not apply" in err


@pytest.mark.slow
def test_tune_on_the_real_model_predicts_the_winners_accepted_length_within_10_percent(tmp_path, default_target, one_thread):
    """A small pass on SmolLM2-135M with the shipped drafter (CPU): the measured winner's predicted accepted length
    is within 10% of what its real run measures on the same prompts; the record it wrote gives the same
    acceptance table through --from; the profile it would write holds the measured winner."""
    out, rec, again = tmp_path / "tune.json", tmp_path / "tune.jsonl", tmp_path / "again.json"
    rc = main(["tune", "--device", "cpu", "--candidates", "1/1/2,2/1/3,3/2/5", "--prompts", "3", "--max-new-tokens",
               "32", "--cost-tokens", "6", "--confirm", "2", "--lookup-tokens", "4", "--record", str(rec), "--json",
               str(out), "--no-save"])
    assert rc == 0
    report = json.loads(out.read_text())
    plain, *spec = report["confirmation"]
    spec, branches = spec[:2], spec[2:]
    assert plain["steps"] == 0 and plain["measured_tok_per_s"] > 0 and len(branches) == 2
    # each confirmed tree again, a lookup branch of 4 beside it: measured, not predicted
    for tree, branch in zip(spec, branches):
        assert (branch["steps"], branch["topk"], branch["draft_tokens"], branch["lookup_tokens"]) == (
            tree["steps"], tree["topk"], tree["draft_tokens"], 4)
        assert branch["predicted_tok_per_s"] is None and branch["measured_tok_per_s"] > 0
        assert branch["measured_accept_len"] >= 1.0
    winner = max(spec, key=lambda r: r["measured_tok_per_s"])  # measured, not predicted
    predicted, measured = winner["predicted_accept_len"], winner["measured_accept_len"]
    assert abs(predicted - measured) <= 0.10 * measured, (predicted, measured)
    winner = max([*spec, *branches], key=lambda r: r["measured_tok_per_s"])
    bucket = report["profile"]["buckets"][0]
    assert (bucket["steps"], bucket["topk"], bucket["draft_tokens"], bucket.get("lookup_tokens", 0)) == (
        winner["steps"], winner["topk"], winner["draft_tokens"], winner["lookup_tokens"])
    assert report["profile"]["saved"] is False
    assert main(["tune", "--from", str(rec), "--json", str(again)]) == 0
    assert json.loads(again.read_text())["acceptance"] == report["acceptance"]


def test_tune_measures_in_runs_regime_by_default():
    """On CUDA with the H200 profile (every kernel on): tune's systems are bench's plain-compile-gemv-attn and
    spec-compile-gemv-attn, as `run` decodes; --no-compile and the kernel flags change them; a CPU runs eager."""
    from types import SimpleNamespace

    import torch

    from eaglelab.bench.setup import run_regime
    from eaglelab.bench.tune import TuneSettings, config_for
    from eaglelab.cli import build_parser
    from eaglelab.engine.runtime.spec_config import SpecConfig
    from eaglelab.profiles import BucketChoice, DeviceProfile

    h200 = DeviceProfile("NVIDIA H200", "bfloat16", "ab" * 32, (BucketChoice(1, 5, 4, 24),), compile=True, gemv=True,
                         decode_attn=True, kernels_reason="measured")
    parse = build_parser().parse_args
    gpu, spec = SimpleNamespace(device=torch.device("cuda")), SpecConfig("eagle3")

    def names(flags, device="cuda"):
        args = parse(["tune", *flags])
        regime = run_regime(args, device, h200, compile_asked=args.compile)
        settings = TuneSettings({1: ((3, 1, 4),)}, 32, 8, 1, regime)
        return config_for(gpu, settings, None).name, config_for(gpu, settings, spec).name, regime

    plain, spec_name, regime = names([])
    assert (plain, spec_name) == ("plain-compile-gemv-attn", "spec-compile-gemv-attn") and regime.one_graph
    assert any("as measured on NVIDIA H200" in r for r in regime.reasons)
    assert names(["--no-decode-attn"])[:2] == ("plain-compile-gemv", "spec-compile-gemv")
    plain, spec_name, regime = names(["--no-compile"])
    assert (plain, spec_name) == ("plain-graphs-gemv-attn", "spec-graphs-gemv-attn") and not regime.compile
    assert names([], device="cpu")[:2] == ("plain-eager", "spec-decode")


def test_the_default_candidates_are_few_and_hold_the_profiles_tree():
    """A compiled tree shape costs a compile per batch size: a handful per batch size, the profile's tree among them
    (a tune can only confirm or beat it); --candidates names them; a tree that cannot be is a user error."""
    from eaglelab.bench.tune import default_candidates
    from eaglelab.cmd_tune import parse_candidates
    from eaglelab.draft_registry import TreeShape
    from eaglelab.engine.errors import EagleLabError

    trees = {1: TreeShape(6, 8, 40), 8: TreeShape(4, 4, 12), 32: TreeShape(4, 4, 12)}
    got = default_candidates((1, 8, 32), True, lambda b: trees[b])
    assert (6, 8, 40) in got[1] and (4, 4, 12) in got[8] and (4, 4, 12) in got[32]
    assert all(2 <= len(c) <= 5 for c in got.values()) and any(k == 1 for _, k, _ in got[32])
    assert default_candidates((1,), False, None) == {1: ((2, 1, 3), (3, 1, 4), (3, 2, 6), (4, 1, 5))}
    assert parse_candidates("5/4/24, 3/1/4") == ((3, 1, 4), (5, 4, 24))
    for bad in ("3/1/5", "2/2/9", "x/1/2", "3/1"):
        with pytest.raises(EagleLabError) as e:
            parse_candidates(bad)
        assert e.value.field == "--candidates" and bad in str(e.value)


def test_the_confirmation_measures_lookup_branches_beside_every_confirmed_tree():
    """On CUDA a branch of 16 at batch 1 and of 8 at larger batches rides beside each tree confirmed (none on a CPU
    unless asked); the trees as predicted come first, then each of them with each branch, in that order."""
    from eaglelab.bench.tune import default_lookup, with_branches

    assert default_lookup((1, 8, 32), True) == {1: (16,), 8: (8,), 32: (8,)}
    assert default_lookup((2, 64), True) == {2: (16,), 64: (8,)} and default_lookup((1,), False) == {}
    assert with_branches([(5, 4, 24), (4, 4, 12)], (8, 16)) == [
        (5, 4, 24), (4, 4, 12), (5, 4, 24, 8), (5, 4, 24, 16), (4, 4, 12, 8), (4, 4, 12, 16)]
    assert with_branches([(5, 4, 16), (5, 4, 24)], (0, 16)) == [(5, 4, 16), (5, 4, 24), (5, 4, 16, 16), (5, 4, 24, 16)]
    assert with_branches([(3, 1, 4)], ()) == [(3, 1, 4)] and with_branches([], (16,)) == []


def test_what_run_takes_now_is_confirmed_whatever_its_prediction():
    """With the default candidates each batch size's current choice (the device profile's tree and branch, here
    5/4/24 + 16 as the shipped H200 profile holds) joins the confirmation unless it is there already, so a tune
    measures what it would replace; named candidates (--candidates, a grid) or --confirm 0 add nothing."""
    from types import SimpleNamespace

    from eaglelab.bench.configs import Regime
    from eaglelab.bench.tune import confirmed_configs
    from eaglelab.cmd_tune import _settings
    from eaglelab.draft_registry import TreeShape

    assert confirmed_configs([(5, 4, 16), (4, 4, 12)], (16,), (5, 4, 24, 16)) == [
        (5, 4, 16), (4, 4, 12), (5, 4, 16, 16), (4, 4, 12, 16), (5, 4, 24, 16)]
    assert confirmed_configs([(5, 4, 16), (5, 4, 24)], (16,), (5, 4, 24, 16)) == [
        (5, 4, 16), (5, 4, 24), (5, 4, 16, 16), (5, 4, 24, 16)]
    assert confirmed_configs([(3, 1, 4)], (), (3, 1, 4)) == [(3, 1, 4)]
    assert confirmed_configs([(3, 1, 4)], (), None) == [(3, 1, 4)]

    shapes = {1: TreeShape(5, 4, 24, 16), 8: TreeShape(4, 4, 12, 8), 32: TreeShape(2, 1, 0)}
    args = SimpleNamespace(max_new_tokens=None, cost_tokens=None, confirm=2, passes=3, screen=True)
    got = _settings(args, True, Regime(graphs=True, compile=True), shapes.__getitem__, ((1, 8, 32), None, None))
    assert got.incumbent == {1: (5, 4, 24, 16), 8: (4, 4, 12, 8), 32: (2, 1, 3)}
    assert (5, 4, 24) in got.candidates[1] and (2, 1, 3) in got.candidates[32]
    named = _settings(args, True, Regime(graphs=True), shapes.__getitem__, ((1,), {1: ((3, 1, 4),)}, None))
    assert named.incumbent == {}
    args.confirm = 0
    assert _settings(args, True, Regime(graphs=True), shapes.__getitem__, ((1,), None, None)).incumbent == {}


def test_a_tree_beside_a_lookup_branch_that_measured_fastest_goes_into_the_profile_with_it(tmp_path):
    """The branch row is measured, not predicted: the winner, the profile's bucket (its label and figure) and the
    confirmation table carry the branch; its predicted columns read "-"."""
    import io

    from rich.console import Console

    from eaglelab.bench.tune import TuneSettings, tuned_profile, winners
    from eaglelab.cmd_tune import _confirm_table, _error_lines

    rep = _report(tmp_path)
    for r in rep["confirmation"]:
        r.update(predicted_tok_per_s=r["measured_tok_per_s"], predicted_accept_len=None, measured_accept_len=None)
    rep["confirmation"].insert(3, dict(batch=1, steps=3, topk=1, draft_tokens=4, lookup_tokens=8,
                                       measured_tok_per_s=38.0, passes=[38.0, 38.0], predicted_tok_per_s=None,
                                       predicted_accept_len=None, measured_accept_len=3.1))
    assert winners(rep["confirmation"])[1]["lookup_tokens"] == 8
    profile = tuned_profile(rep, TuneSettings({1: ((3, 1, 4),)}, 32, 8, 2), "cpu", "float32", "ab" * 32, "today")
    first = profile.buckets[0]
    assert (first.steps, first.topk, first.draft_tokens, first.lookup_tokens) == (3, 1, 4, 8)
    assert first.label == "3 steps, topk 1, 4 draft tokens, lookup 8" and "lookup branch of 8" in first.measured
    assert profile.buckets[1].lookup_tokens == 0
    out = io.StringIO()
    Console(file=out, width=200).print(_confirm_table(rep["confirmation"]))
    line = next(row for row in out.getvalue().splitlines() if "lookup 8" in row)
    assert "3/1/4 + lookup 8" in line and "38.0" in line and "1.90x" in line and line.count(" - ") >= 2
    assert "(in use)" not in out.getvalue()
    rep["confirmation"][3]["incumbent"] = True  # the row of what run took before the tune is marked
    out = io.StringIO()
    Console(file=out, width=200).print(_confirm_table(rep["confirmation"]))
    assert "3/1/4 + lookup 8 (in use)" in out.getvalue()
    assert not any("WARNING" in x for x in _error_lines(rep["confirmation"]))


def _report(tmp_path):
    """A tune's report, as plain data: at batch 1 the predicted best (3/1/4) measured slower than 2/1/3."""
    conf = [dict(batch=1, steps=0, topk=0, draft_tokens=1, measured_tok_per_s=20.0, passes=[20.0, 20.0]),
            dict(batch=1, steps=3, topk=1, draft_tokens=4, measured_tok_per_s=30.0, passes=[30.0, 30.0]),
            dict(batch=1, steps=2, topk=1, draft_tokens=3, measured_tok_per_s=34.0, passes=[34.0, 34.0]),
            dict(batch=8, steps=0, topk=0, draft_tokens=1, measured_tok_per_s=100.0, passes=[100.0, 100.0]),
            dict(batch=8, steps=2, topk=1, draft_tokens=3, measured_tok_per_s=120.0, passes=[120.0, 120.0])]
    return {"confirmation": conf, "hardware": {"device": "cpu", "cpu": "x86_64", "torch": "2.13.0+cpu"},
            "settings": {"prompts": 4}}


def test_tune_writes_the_profile_that_run_bench_and_the_fixtures_then_find(tmp_path, monkeypatch, default_target):
    """The confirmed-fastest tree per batch size (measured, not predicted), with its figure, goes into the eaglelab
    cache, never into the drafter's directory; find_profile then returns it before the shipped one, and the drafter
    registry (what run, bench, the TUI and the fixtures ask) drafts its tree at each batch size."""
    from types import SimpleNamespace

    import torch

    from eaglelab.bench.tune import TuneSettings
    from eaglelab.cmd_tune import _save_profile
    from eaglelab.draft_registry import Where, choose_drafter, shipped_drafter_dir
    from eaglelab.profiles import SHIPPED_NAME, cache_profile_path, drafter_digest, find_profile

    shipped = shipped_drafter_dir()
    before = (shipped / SHIPPED_NAME).read_bytes()
    monkeypatch.setenv("EAGLELAB_CACHE", str(tmp_path / "cache"))  # after the model loaded from the real cache
    settings = TuneSettings({1: ((2, 1, 3), (3, 1, 4)), 8: ((2, 1, 3),)}, 32, 8, 2)
    tt = SimpleNamespace(draft_path=str(shipped), dtype="float32")
    args = SimpleNamespace(save=False)
    assert _save_profile(args, _report(tmp_path), settings, tt, torch.device("cpu"))["saved"] is False
    sha = drafter_digest(shipped)
    path = cache_profile_path(tmp_path / "cache", sha)
    assert not path.exists(), "--no-save writes nothing"
    args.save = True
    saved = _save_profile(args, _report(tmp_path), settings, tt, torch.device("cpu"))
    assert saved["path"] == str(path) and path.is_file() and (shipped / SHIPPED_NAME).read_bytes() == before
    found = find_profile("cpu", "float32", shipped, tmp_path / "cache")
    assert found is not None and found.path == str(path)
    assert [(b.max_batch, b.steps, b.topk, b.draft_tokens) for b in found.buckets] == [(1, 2, 1, 3), (8, 2, 1, 3)]
    assert found.bucket(1).measured.startswith("1.70x over plain decoding (34.0 vs 20.0 tok/s; 4 MT-bench first "
                                               "turns, 32 tokens, batch 1, 3 interleaved passes")
    choice = choose_drafter("default", "default", default_target.model, where=Where("cpu", "float32", 1))
    assert choice.profile == found and (choice.spec.num_steps, choice.spec.topk) == (2, 1)
    assert any(str(path) in n for n in choice.notes), choice.notes
    assert (choice.tree_for(8).steps, choice.tree_for(8).draft_tokens) == (2, 3)
    only8 = _report(tmp_path)  # a later tune of batch 8 alone: batch 1's tree stays
    only8["confirmation"] = [r for r in only8["confirmation"] if r["batch"] == 8]
    only8["confirmation"][1]["steps"], only8["confirmation"][1]["draft_tokens"] = 3, 4
    saved = _save_profile(args, only8, TuneSettings({8: ((3, 1, 4),)}, 32, 8, 2), tt, torch.device("cpu"))
    assert saved["kept"] == [1] and saved["dropped"] == []
    found = find_profile("cpu", "float32", shipped, tmp_path / "cache")
    assert [(b.max_batch, b.steps, b.draft_tokens) for b in found.buckets] == [(1, 2, 3), (8, 3, 4)]
    from eaglelab.bench.configs import Regime
    from eaglelab.cmd_tune import _profile_lines

    graphs = TuneSettings({8: ((3, 1, 4),)}, 32, 8, 2, regime=Regime(graphs=True, compile=True))
    saved = _save_profile(args, only8, graphs, tt, torch.device("cpu"))  # another regime: replaced whole, said
    assert saved["kept"] == [] and saved["dropped"] == [1]
    assert [b.max_batch for b in find_profile("cpu", "float32", shipped, tmp_path / "cache").buckets] == [8]
    assert "held batch <= 1, measured in another regime" in " ".join(_profile_lines(saved))


def test_a_tune_of_some_batch_sizes_keeps_the_others_from_the_profile_it_replaces():
    """tune --batch-sizes 8 after tune --batch-sizes 1,32: batch 1's and 32's trees stay (same regime), 8's is the
    new one; tilings measured on the same setup merge, the new choice winning; another regime replaces it all."""
    from dataclasses import replace

    from eaglelab.profiles import BucketChoice, DeviceProfile, GemvTilings, merge_tuned

    env = {"gpu": "NVIDIA H200", "dtype": "bfloat16", "torch": "2.11", "triton": "3.6"}
    old = DeviceProfile("NVIDIA H200", "bfloat16", "ab" * 32,
                        (BucketChoice(1, 5, 4, 24, "old 1", lookup_tokens=16), BucketChoice(8, 4, 4, 12, "old 8"),
                         BucketChoice(32, 2, 1, 3, "old 32")), compile=True, gemv=True, decode_attn=True,
                        gemv_tilings=GemvTilings.of({(576, 576, 1): (8, 512, 1, 4, 3), (576, 576, 4): (4, 128, 1, 4, 3)}, env))
    new = replace(old, buckets=(BucketChoice(8, 3, 2, 6, "new 8", lookup_tokens=8),),
                  gemv_tilings=GemvTilings.of({(576, 576, 4): (16, 128, 1, 4, 3)}, env))
    merged, kept = merge_tuned(old, new)
    assert [(b.max_batch, b.measured, b.lookup_tokens) for b in merged.buckets] == [
        (1, "old 1", 16), (8, "new 8", 8), (32, "old 32", 0)]
    assert [b.max_batch for b in kept] == [1, 32]
    assert dict(merged.gemv_tilings.chosen) == {(576, 576, 1): (8, 512, 1, 4, 3), (576, 576, 4): (16, 128, 1, 4, 3)}
    assert merge_tuned(old, replace(new, compile=False)) == (replace(new, compile=False), ())
    assert merge_tuned(None, new) == (new, ())
    assert merge_tuned(replace(old, drafter_sha256="cd" * 32), new) == (new, ())


def test_a_damaged_profile_file_is_said_and_the_tunes_report_kept(tmp_path, monkeypatch, capsys):
    """The cache file the profile would replace is not JSON: nothing is written over it, the tune still prints its
    report and a line naming the file and what to do; --json still gets the report."""
    from types import SimpleNamespace

    import torch

    from eaglelab.bench.tune import TuneSettings
    from eaglelab.cmd_tune import _profile_lines, _save_profile
    from eaglelab.draft_registry import shipped_drafter_dir
    from eaglelab.profiles import cache_profile_path, drafter_digest

    shipped = shipped_drafter_dir()
    monkeypatch.setenv("EAGLELAB_CACHE", str(tmp_path / "cache"))
    path = cache_profile_path(tmp_path / "cache", drafter_digest(shipped))
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    got = _save_profile(SimpleNamespace(save=True), _report(tmp_path), TuneSettings({1: ((2, 1, 3),)}, 32, 8, 2),
                        SimpleNamespace(draft_path=str(shipped), dtype="float32"), torch.device("cpu"))
    assert got["saved"] is False and str(path) in got["error"] and path.read_text() == "{not json"
    lines = _profile_lines(got)
    assert "profile not saved" in lines[0] and "delete it" in lines[0] and "2/1/3" in lines[1]


@pytest.mark.parametrize("flags, field", [
    (["--candidates", "3/2/99"], "--candidates"),
    (["--candidates", "3/1/4", "--steps", "2"], "--candidates"),
    (["--passes", "0"], "--passes"),
    (["--confirm", "-1"], "--confirm"),
    (["--lookup-tokens", "40"], "--lookup-tokens"),
    (["--lookup-tokens", "8,x"], "--lookup-tokens"),
])
def test_tune_refuses_a_bad_flag_before_the_model_loads(flags, field, monkeypatch, capsys):
    """A mistake in tune's own flags is said (exit 2, naming the flag) before the target and drafter load."""
    from eaglelab.bench import tune as TP

    def load(*a, **kw):
        raise AssertionError("the model loaded before the flags were checked")

    monkeypatch.setattr(TP, "load_tune_target", load)
    rc = main(["tune", "--device", "cpu", *flags])
    err = capsys.readouterr().err
    assert rc == 2 and field in err, err


RESULTS_C = "benchmarks/results/h200_2026-12-03b/C/"


@pytest.mark.parametrize("argv, said", [
    ([], "needs two files"),
    (["missing.jsonl", RESULTS_C + "h200_tune.json"], "cannot read the run record"),
    ([RESULTS_C + "h200_tune.json", RESULTS_C + "h200_tune.json"], "no wide tree in this record"),
    ([RESULTS_C + "h200_tune.jsonl", RESULTS_C + "h200_tune.jsonl"], "not valid JSON"),
    ([RESULTS_C + "h200_tune.jsonl", "{tmp}/no_confirmation.json"], "no confirmation rows in this report"),
])
def test_the_replay_table_script_refuses_wrong_files_with_a_message(argv, said, tmp_path, capsys):
    """``python -m eaglelab.bench.tune_predict RECORD REPORT``: arguments missing, a record that is not a tune's,
    a report that is not JSON or has no confirmation end in exit 2 naming the problem, no traceback, no table."""
    from eaglelab.bench.tune_predict import print_replay_table
    from eaglelab.errors import run_guarded

    (tmp_path / "no_confirmation.json").write_text(json.dumps({"schema": "eaglelab.tune/1"}))
    argv = [a.format(tmp=tmp_path) for a in argv]
    rc = run_guarded(print_replay_table, argv, argv)
    out, err = capsys.readouterr()
    text = " ".join((out + err).split())
    assert rc == 2 and said in text and "Traceback" not in text and "| batch |" not in out, text


def test_the_replay_table_script_prints_the_recorded_tunes_rows(capsys):
    """The recorded H200 tune: a header and one Markdown row per confirmed speculative tree (6), exit 0."""
    from eaglelab.bench.tune_predict import print_replay_table

    assert print_replay_table([RESULTS_C + "h200_tune.jsonl", RESULTS_C + "h200_tune.json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| batch | steps/topk/N |") and len(lines) == 2 + 6
    assert lines[2].startswith("| 1 | 5/4/24 | 3.30 | 2.97 | -9.8% |"), lines[2]


def test_a_tune_saves_each_batch_sizes_winner_as_its_confirmation_ends(tmp_path, monkeypatch):
    """A tune of batch 1 and 8 stopped in batch 8's confirmation (a time limit, Ctrl-C) keeps batch 1's winner: the
    confirmation hands its rows to the saving hook after each batch size; the last one is saved by the end of the
    run, so the hook leaves it; --no-save or a single batch size gets no hook."""
    from types import SimpleNamespace

    import torch

    from eaglelab.bench import tune as TP
    from eaglelab.cmd_tune import _save_profile, _saving_each_batch
    from eaglelab.draft_registry import shipped_drafter_dir
    from eaglelab.profiles import (BucketChoice, DeviceProfile, cache_profile_path, drafter_digest, read_profiles,
                                   write_profile)

    shipped = shipped_drafter_dir()
    monkeypatch.setenv("EAGLELAB_CACHE", str(tmp_path / "cache"))
    path = cache_profile_path(tmp_path / "cache", drafter_digest(shipped))
    settings = TP.TuneSettings({1: ((2, 1, 3),), 8: ((2, 1, 3),)}, 32, 8, 2)
    tt = SimpleNamespace(draft_path=str(shipped), dtype="float32")
    report = _report(tmp_path)
    report.update(predictions={"1": [], "8": []},
                  costs={str(b): dict(batch=b, decode_ms=10.0, prefill_ms=30.0, begin_ms=1.0) for b in (1, 8)})
    # before the tune: batch 32's tree measured in another regime (compiled), which this tune's saves replace
    write_profile(path, DeviceProfile("cpu", "float32", drafter_digest(shipped), (BucketChoice(32, 2, 1, 3, "old"),),
                                      compile=True))
    logged, replaced = [], {}
    hook = _saving_each_batch(SimpleNamespace(save=True), report, settings, tt, torch.device("cpu"), None,
                              logged.append, replaced)
    assert _saving_each_batch(SimpleNamespace(save=False), report, settings, tt, torch.device("cpu"), None,
                              logged.append) is None
    one = TP.TuneSettings({1: ((2, 1, 3),)}, 32, 8, 2)
    assert _saving_each_batch(SimpleNamespace(save=True), report, one, tt, torch.device("cpu"), None,
                              logged.append) is None

    rows = {r["batch"]: [] for r in report["confirmation"]}
    for r in report["confirmation"]:
        rows[r["batch"]].append(TP.Measured(r["steps"], r["topk"], r["draft_tokens"], r["batch"],
                                            r["measured_tok_per_s"], None, tuple(r["passes"]), 0))

    def measured(ctx, settings, systems, batch, configs, clock):
        if batch == 8:
            assert path.is_file() and [b.max_batch for b in read_profiles(path)[0].buckets] == [1], \
                "batch 1's winner was saved before batch 8 ran"
            raise KeyboardInterrupt  # the tune stopped here
        return rows[batch][: len(configs)]

    monkeypatch.setattr(TP, "confirm_batch", measured)
    monkeypatch.setattr(TP, "confirmed_configs", lambda trees, branches, incumbent: [(2, 1, 3), (3, 1, 4)])
    with pytest.raises(KeyboardInterrupt):
        TP.confirm(None, settings, report, lambda *a: None, None, on_batch=hook)
    saved = read_profiles(path)[0]
    assert [(b.max_batch, b.steps, b.draft_tokens) for b in saved.buckets] == [(1, 2, 3)]
    assert "1.70x over plain decoding" in saved.buckets[0].measured
    assert len(logged) == 1 and "saved the winners of batch 1" in logged[0] and str(path) in logged[0], logged
    hook(report["confirmation"])  # both batch sizes done: the run's end saves them, not the hook
    assert len(logged) == 1 and [b.max_batch for b in read_profiles(path)[0].buckets] == [1]
    final = _save_profile(SimpleNamespace(save=True), report, settings, tt, torch.device("cpu"), None, replaced)
    assert [b.max_batch for b in read_profiles(path)[0].buckets] == [1, 8]
    assert final["dropped"] == [32] and final["kept"] == [], "the tune's last save reports what the tune replaced"
