"""``eaglelab bench`` with no flags: the headline alone (plain and speculative decoding as ``run`` decodes here, and
HF), the configurations interleaved pass by pass, and no headline ratio when the passes or the machine say the
figures cannot be trusted."""

from __future__ import annotations

import json

import pytest

from eaglelab.bench import harness as H
from eaglelab.bench import report as R
from eaglelab.bench.configs import CONFIGS, Regime, regime_config
from eaglelab.bench.timing import MachineLoad
from eaglelab.cli import main

pytestmark = pytest.mark.usefixtures("one_thread", "idle_machine")
TINY = ["bench", "--scale-model", "tiny", "--device", "cpu", "--max-new-tokens", "4", "--prompts", "2"]


def test_no_flags_measure_the_headline_alone_in_interleaved_passes(tmp_path, questions, monkeypatch, capsys):
    """On a CPU: plain-eager, spec-decode (the tree and kernels `run` would use) and HF at batch 1; each pass runs
    every configuration once before the next pass starts (the HF peer in the first pass only); no micro-measure
    and no observed pass; the output says what ran and how to get the full sweep."""
    order = []
    real = H.Contender.run_pass

    def spy(self, ctx):
        order.append((self.cfg.name, self.batch))
        real(self, ctx)

    monkeypatch.setattr(H.Contender, "run_pass", spy)
    out = tmp_path / "bench.json"
    assert main([*TINY, "--questions", str(questions), "--repeats", "3", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["settings"]["configs"] == ["plain-eager", "spec-decode", "hf"]
    assert rep["settings"]["measured"] == "the headline" and rep["settings"]["batch_sizes"] == [1]
    assert order == [("plain-eager", 1), ("spec-decode", 1), ("hf", 1)] + [("plain-eager", 1), ("spec-decode", 1)] * 2
    rows = {r["config"]: r for r in rep["rows"]}
    assert len(rows["spec-decode"]["pass_speedups"]) == 3 and rows["hf"]["pass_speedups"] == []
    spec = rows["spec-decode"]
    assert spec["speedup"] == pytest.approx(sorted(spec["pass_speedups"])[1])  # the median pass's ratio
    for p, s, b in zip(spec["pass_speedups"], spec["sweeps_tok_per_s"], rows["plain-eager"]["sweeps_tok_per_s"]):
        assert p == pytest.approx(s / b)  # each pass against plain in the same pass
    assert rep["micro"] == [] and spec["decode_ms"] is None and spec["verify_ms"] is None  # end to end only
    assert rep["settings"]["trees"]["1"]["num_steps"] >= 1
    flat = " ".join(capsys.readouterr().out.split())
    assert "measured: the headline (plain-eager, spec-decode, hf; batch 1" in flat
    assert "eaglelab bench --full" in flat and "run's regime here: eager" in flat
    assert "phase costs, ms per cycle" not in flat


def test_full_and_named_configurations_keep_the_sweep(questions):
    """--full: every configuration but the Triton ones, at the full sweep's batch sizes; --configs as named."""
    from eaglelab.bench.setup import CPU_DEFAULTS, defaults_for, observes
    from eaglelab.bench.suite import configs_for, micro_on
    from eaglelab.cli import build_parser

    parse = build_parser().parse_args
    cpu = Regime(graphs=False)
    full = parse(["bench", "--full"])
    names = [c.name for c in configs_for(full, None, cpu)]
    assert names[0] == "plain-eager" and names[-1] == "hf" and "spec-prefill" in names and "plain-graphs" in names
    assert defaults_for(full, "cpu") is CPU_DEFAULTS and micro_on(full) and observes(full)
    named = parse(["bench", "--configs", "plain-eager,spec-decode"])
    assert [c.name for c in configs_for(named, None, cpu)] == ["plain-eager", "spec-decode"]
    assert defaults_for(named, "cpu") is CPU_DEFAULTS and observes(named)
    head = parse(["bench"])
    assert not micro_on(head) and not observes(head) and defaults_for(head, "cuda")["batch_sizes"] == "1,8"
    assert micro_on(parse(["bench", "--micro"])) and observes(parse(["bench", "--phase-costs"]))


def test_the_headline_on_cuda_decodes_as_run_with_the_profiles_kernels():
    """On CUDA the headline's two configurations are graphs of compiled phases with the kernels the device profile
    measured (here: the GEMV off, the decode attention on), each with its reason; flags change them."""
    from eaglelab.bench.setup import run_regime
    from eaglelab.bench.suite import configs_for
    from eaglelab.cli import build_parser
    from eaglelab.profiles import BucketChoice, DeviceProfile

    profile = DeviceProfile("NVIDIA H200", "bfloat16", "ab" * 32, (BucketChoice(1, 3, 1, 4),), compile=True,
                            gemv=False, decode_attn=True, kernels_reason="measured in a test")
    args = build_parser().parse_args(["bench"])
    regime = run_regime(args, "cuda", profile)
    assert (regime.graphs, regime.compile, regime.gemv, regime.attn) == (True, True, False, True)
    assert any("--gemv: off by default, as measured on NVIDIA H200" in r for r in regime.reasons)
    assert [c.name for c in configs_for(args, None, regime)] == ["plain-compile-attn", "spec-compile-attn", "hf"]
    flagged = run_regime(build_parser().parse_args(["bench", "--gemv", "--no-decode-attn"]), "cuda", profile)
    assert (flagged.gemv, flagged.attn) == (True, False) and "--gemv: on (as flagged)" in flagged.reasons
    full = [c.name for c in configs_for(build_parser().parse_args(["bench", "--full"]), None, regime)]
    assert "plain-compile-attn" in full and "spec-compile-attn" in full and full[-1] == "hf"
    assert regime_config(True, Regime(graphs=True, compile=True, gemv=True, attn=True)) is CONFIGS["spec-compile-gemv-attn"]


def test_each_batch_size_drafts_the_profiles_tree_for_it():
    """A speculative configuration at batch 8 drafts the tree the drafter's choice gives for 8 rows."""
    import torch

    from eaglelab.draft_registry import TreeShape
    from eaglelab.engine.runtime.spec_config import SpecConfig

    trees = {1: TreeShape(5, 4, 24), 8: TreeShape(4, 4, 12)}
    ctx = H.BenchContext(target=torch.nn.Linear(2, 2), spec=SpecConfig("eagle3", num_steps=3, topk=1),
                         make_drafter=None, prompts=[[1, 2]], max_new_tokens=4, batch_sizes=(1, 8),
                         tree_for=lambda b: trees[1 if b < 8 else 8])
    for b, (s, k, n) in ((1, (5, 4, 24)), (8, (4, 4, 12))):
        spec = H.engine_spec(CONFIGS["spec-decode"], ctx, b)
        assert (spec.num_steps, spec.topk, spec.draft_tokens) == (s, k, n)
    assert not H.engine_spec(CONFIGS["plain-eager"], ctx, 8).enabled


def _rows(plain: tuple[float, ...], spec: tuple[float, ...]) -> list[H.BenchRow]:
    rows = [H.BenchRow("plain-eager", 1, tok_per_s=sorted(plain)[len(plain) // 2], sweeps_tok_per_s=plain),
            H.BenchRow("spec-decode", 1, tok_per_s=sorted(spec)[len(spec) // 2], sweeps_tok_per_s=spec)]
    return H.finish_rows(rows, {})


def test_passes_that_disagree_by_more_than_10_percent_give_a_warning_and_no_headline():
    """The issue's CPU run: configurations measured one after another while the load changed read 8.42x; pass by
    pass, ratios of 1.20x and 1.50x (25% apart) are a warning, not a headline."""
    from eaglelab.cmd_bench import _headline_lines

    rows = _rows((100.0, 80.0, 90.0), (120.0, 120.0, 108.0))  # ratios 1.20, 1.50, 1.20
    spec = rows[1]
    assert spec.pass_speedups == pytest.approx((1.2, 1.5, 1.2)) and spec.speedup == pytest.approx(1.2)
    warnings = R.trust_warnings(rows, {}, "plain-eager")
    assert warnings == ["spec-decode at batch 1: its passes read 1.20x .. 1.50x over plain-eager (25% apart, "
                        "more than 10%)"]
    head = R.headline(rows, [], 0, 0.0)
    head["warnings"] = warnings
    text = " ".join(_headline_lines(head))
    assert "no headline" in text and "1.20x .. 1.50x" in text and "speedup over" not in text
    agree = _rows((100.0, 80.0, 90.0), (120.0, 100.0, 108.0))  # 1.20, 1.25, 1.20: within 10%
    assert R.trust_warnings(agree, {}, "plain-eager") == []
    head = R.headline(agree, [], 0, 0.0)
    head["warnings"] = []
    assert "spec-decode speedup over plain-eager: b1: 1.20x (1.20..1.25 over 3 passes)" in " ".join(_headline_lines(head))


def test_a_busy_machine_gives_a_warning_with_its_figures():
    rows = _rows((100.0, 100.0), (150.0, 150.0))
    busy = {"start": MachineLoad(3.0, 2, 0.0), "end": MachineLoad(2.5, 2, 2.0)}
    got = R.trust_warnings(rows, busy, "plain-eager")
    assert got == ["the machine was busy at the start: load average 3.00 on 2 cores (1.50 per core) before it began"]
    assert busy["end"].other_per_core == pytest.approx(0.25) and not busy["end"].busy


def test_configurations_that_cannot_run_here_are_named_once_in_one_line():
    from eaglelab.cmd_bench import _not_run_lines

    rows = [H.BenchRow(c, b, skipped="CUDA graphs need a CUDA device") for c in ("plain-graphs", "spec-decode-graphs")
            for b in (1, 2)] + [H.BenchRow("hf", b, skipped="no peer") for b in (1, 2)]
    assert _not_run_lines(R.not_run(rows)) == [
        "not run here: plain-graphs, spec-decode-graphs (CUDA graphs need a CUDA device)", "not run here: hf (no peer)"]


def test_torchs_sync_debug_notice_is_not_shown_and_other_warnings_are():
    import warnings

    from eaglelab.bench.timing import quiet_torch_notices

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_torch_notices():
            warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all "
                          "synchronizing operations", UserWarning)
            warnings.warn("something the user can act on", UserWarning)
    assert [str(w.message) for w in seen] == ["something the user can act on"]
