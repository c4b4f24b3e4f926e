"""``eaglelab bench --profile`` with a speculative configuration: each phase of a speculative cycle (draft,
verify, accept, draft_extend, advance) under torch.profiler, operator by operator on CPU."""

from __future__ import annotations

import json

import pytest
import torch

from eaglelab.bench.harness import BenchContext
from eaglelab.bench.profile import PhaseMeasure, PhaseProbe, SpecKernelSet, profile_spec_phases
from eaglelab.cli import build_parser, main
from eaglelab.engine.model.layers import EAGER_KERNELS
from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3
from eaglelab.engine.runtime.compile import CompileLog, PhaseCompiler
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.engine.runtime.spec_config import SpecConfig

QUESTIONS = [{"question_id": i, "category": "writing", "turns": [t]}
             for i, t in enumerate(["Write a haiku about the sea.", "Name three rivers of Europe."])]
PHASES = ["draft", "verify", "accept", "draft_extend", "advance"]
TREE = ["--steps", "3", "--topk", "2", "--draft-tokens", "6"]


@pytest.fixture
def questions(tmp_path):
    q = tmp_path / "q.jsonl"
    q.write_text("".join(json.dumps(x) + "\n" for x in QUESTIONS))
    return q


def _argv(questions, *extra) -> list[str]:
    return ["bench", "--scale-model", "tiny", "--device", "cpu", "--dtype", "float32", "--questions", str(questions),
            "--prompts", "2", "--max-new-tokens", "8", "--repeats", "1", "--no-micro", *TREE, *extra]


def test_bench_profile_shows_each_phase_of_a_speculative_cycle(tmp_path, questions, capsys):
    """spec-decode on the tiny model (4 layers) with its random drafter, tree of 3 steps / top-2 / 6 tokens:
    after the decode steps the profile holds, per batch size, the five phases in cycle order, each with real
    operators: the draft runs 2 drafter forwards (steps - 1: the root's logp comes from the last extend),
    so 2 log-softmaxes and 2 attentions; verify one attention per target layer; each phase's time per
    cycle beside the bench's measured phase time; printed at 80 columns."""
    out = tmp_path / "b.json"
    rc = main(_argv(questions, "--configs", "plain-eager,spec-decode", "--batch-sizes", "1,2", "--profile",
                    "--json", str(out)))
    printed = capsys.readouterr().out
    assert rc == 0
    prof = json.loads(out.read_text())["profile"]
    assert [(p["phase"], p["batch"]) for p in prof] == [("decode", 1), ("decode", 2)] + [
        (ph, b) for b in (1, 2) for ph in [*PHASES, "decode"]]
    assert not prof[0]["configs"] and not prof[1]["configs"]  # the plain decode steps; the others the spec set's
    for p in prof[2:]:
        assert (p["layers"], p["status"], p["configs"]) == ("eager", "ran", ["spec-decode"])
        assert p["kernels"] and all(k["name"].startswith("aten::") for k in p["kernels"]), p["kernels"]
        assert p["device_us"] == pytest.approx(sum(p["by_category"].values()))
        assert p["launches"] >= sum(k["calls_per_step"] for k in p["kernels"]) > 0 and p["step_ms"] > 0
        calls = {k["name"]: k["calls_per_step"] for k in p["kernels"]}
        if p["phase"] == "draft":
            assert p["detail"] == "3 steps, top-2, 6 tokens"
            # the table lists the costliest operators: a log-softmax of the tiny vocabulary may miss it under load
            assert calls.get("aten::_log_softmax", 2) == 2
            assert calls["aten::_scaled_dot_product_flash_attention_for_cpu"] == 2
        if p["phase"] == "verify":
            assert calls["aten::_scaled_dot_product_flash_attention_for_cpu"] == 4 and p["by_category"]["matmul"] > 0
        if p["phase"] == "decode":  # beside the verify, at its context: one attention per target layer
            assert calls["aten::_scaled_dot_product_flash_attention_for_cpu"] == 4 and p["by_category"]["matmul"] > 0
            assert p["detail"] == "1 token, plain, the verify's context" and p["measured_ms"] is None
        elif p["phase"] == "advance":  # timed by the bench as part of accept
            assert p["measured_ms"] is None
        else:
            assert p["measured_ms"] > 0 and "spec-decode: eager" in p["measured_by"], p["measured_by"]
    assert "speculative cycle, phase by phase" in printed
    flat = " ".join(printed.split())
    assert "draft b=1 eager (3 steps, top-2, 6 tokens): " in flat and " us measured (spec-decode: eager" in flat
    assert "verify (6 tokens) against a decode step of the same kernels, b=2, eager layers" in flat
    assert max(len(line) for line in printed.splitlines()) <= 80


def _ctx(model, taps_net, spec) -> BenchContext:
    net, taps = taps_net
    prompts = [[5, 9, 11, 3, 7, 2, 8], [4, 4, 1, 6, 30, 2]]
    return BenchContext(target=model, spec=spec, make_drafter=lambda sp: Eagle3Drafter(net, sp, taps), prompts=prompts,
                        max_new_tokens=12, batch_sizes=(2,))


@pytest.mark.parametrize("compiled", [False, True])
def test_a_profiled_run_emits_the_tokens_of_an_unprofiled_run(compiled):
    """Every phase of the first cycle is repeated under the profiler (accept's KV compaction and advance's
    emit are not idempotent): the run then goes on and emits what an unprofiled run emits. Compiled
    (dynamo's trace, backend eager), every phase compiles whole (fullgraph) and runs compiled."""
    torch._dynamo.reset()
    model = build_scale_model("tiny", seed=0).model
    spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=6)
    ctx = _ctx(model, random_eagle3(model, seed=1), spec)
    compiler = PhaseCompiler(CompileLog(None), backend="eager") if compiled else None
    kset = SpecKernelSet(("spec-compile",), EAGER_KERNELS, compiler, EAGER_KERNELS.eager_pieces() if compiled else None)
    found, tokens = profile_spec_phases(ctx, kset, compiled, 2, steps=2, warmup=1, max_new=12)
    assert [(p.phase, p.layers, p.status) for p in found] == [(ph, "compiled" if compiled else "eager", "ran")
                                                              for ph in [*PHASES, "decode"]]
    if compiled:
        assert [p.reason for p in compiler.made] == [None] * 6
    drafter = ctx.make_drafter(spec)
    plain = Engine(model, drafter=drafter, spec=spec, runner=EagerRunner(model, drafter.net)).generate(ctx.prompts, 12)
    assert tokens == plain.tokens and all(len(t) == 12 for t in tokens)


def test_the_probe_restores_the_caches_and_state_a_profiled_phase_writes():
    """A phase that adds 1 to every cache slot, to the loop state and to its input, probed (warm-up, timing
    and profiled calls: many runs) then run once: the cache, the state and the input show one run."""
    model = build_scale_model("tiny", seed=0).model
    probe = PhaseMeasure(batch=1, steps=3, warmup=2, top=10, rank0=True)
    runner = PhaseProbe(model, None, 64, EAGER_KERNELS, probe)
    cache = runner.make_cache(1, 32)
    x, n_out = torch.zeros(1), torch.zeros(1, dtype=torch.long)

    def bump(x, n_out):
        cache.k.add_(1)
        n_out += 1
        x.add_(1)
        return (x.clone(),)

    with torch.inference_mode():
        runner.phase("accept", bump, {"x": x}, (cache,), state={"n_out": n_out})
        runner.phase("accept", bump, {"x": x}, (cache,), state={"n_out": n_out})  # probed once per phase: runs
    assert cache.k.shape[3] == 64 and bool((cache.k == 2).all()) and n_out.tolist() == [2] and x.tolist() == [2.0]
    (p,) = probe.found
    assert p.phase == "accept" and p.steps == 3 and {k.name for k in p.kernels} >= {"aten::add_"}


def test_profile_with_micro_only_is_refused_before_the_model_builds(questions, capsys):
    rc = main(_argv(questions, "--configs", "spec-decode", "--profile", "--micro-only"))
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "--micro-only" in err and "nothing would be profiled" in err and "what to do" in err, err
    assert "building tiny" not in err and "Traceback" not in err


def test_profile_of_named_speculative_configs_without_a_drafter_is_refused(questions, capsys):
    rc = main(_argv(questions, "--configs", "plain-eager,spec-decode", "--profile", "--draft", "none"))
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "'--draft'" in err and "found: none" in err and "spec-decode" in err, err
    assert "building tiny" not in err and "Traceback" not in err


def _bench_rank(tp, argv):
    from eaglelab.cmd_bench import bench

    report, outputs = bench(build_parser().parse_args(argv), tp)
    return report.get("profile"), outputs["spec-decode"]


def test_bench_tp2_profiles_the_spec_phases_on_rank_0_with_their_collectives(tmp_path, questions):
    """--tp 2 (gloo, tiny model: 4 layers): every rank runs the profiled phases (they hold collectives),
    rank 0 profiles them: verify holds the target's 8 all-reduces and its logits all-gather per cycle, the
    replicated drafter's phases none; both ranks emit the same tokens."""
    from tests.tp_harness import RankFailure, spawn_ranks

    out = tmp_path / "tp2.json"
    argv = _argv(questions, "--tp", "2", "--configs", "spec-decode", "--batch-sizes", "1", "--profile", "--json", str(out))
    ranks = spawn_ranks(_bench_rank, 2, argv, timeout_s=300.0)
    assert not any(isinstance(r, RankFailure) for r in ranks), ranks
    assert ranks[1][0] == [] and ranks[0][1] == ranks[1][1]  # rank 1 ran the phases unprofiled
    prof = json.loads(out.read_text())["profile"]
    assert [p["phase"] for p in prof] == ["decode", *PHASES, "decode"]
    calls = {p["phase"]: {k["name"]: k["calls_per_step"] for k in p["kernels"]} for p in prof[:-1]}
    assert calls["verify"].get("c10d::allreduce_") == 8 and calls["verify"].get("c10d::_allgather_base_") == 1
    beside = {k["name"]: k["calls_per_step"] for k in prof[-1]["kernels"]}  # the decode beside the verify
    assert beside.get("c10d::allreduce_") == 8 and beside.get("c10d::_allgather_base_") == 1
    assert not any("c10d" in name for name in calls["draft"])


def test_on_cuda_each_kernel_set_is_profiled_as_its_configs_run():
    """Grouping, on a CUDA context (stubbed: no GPU needed): spec-decode-graphs and spec-compile share the plain
    kernel set, profiled eager and compiled by the compiled set's PhaseCompiler; spec-compile-gemv-attn is its
    own set, with the Triton GEMV and decode attention in its eager layers and inside its compiled phases."""
    from types import SimpleNamespace

    from eaglelab.bench.harness import BenchRow
    from eaglelab.bench.profile import spec_kernel_sets
    from eaglelab.engine.model.layers import Kernels

    compiler, gemv, attn = object(), object(), object()

    def kernels(compile_, gemv_=False, attn_=False):
        return Kernels(compiled=compile_, compile_phase=compiler if compile_ else None,
                       gemv=gemv if gemv_ else None, attention=attn if attn_ else None)

    ctx = SimpleNamespace(device=torch.device("cuda"), kernels=kernels)
    rows = [BenchRow(c, 1, skipped="CUDA graphs need a CUDA device" if c == "spec-compile-gemv" else None)
            for c in ("plain-graphs", "spec-decode-graphs", "spec-compile", "spec-compile-gemv", "spec-compile-gemv-attn")]
    plain, triton = spec_kernel_sets(ctx, rows)
    assert plain.configs == ("spec-decode-graphs", "spec-compile") and triton.configs == ("spec-compile-gemv-attn",)
    assert plain.compiler is compiler and plain.kernels.gemv is None and plain.compiled_kernels.attention is None
    assert triton.compiler is compiler and not triton.kernels.compiled
    for k in (triton.kernels, triton.compiled_kernels):
        assert k.gemv is gemv and k.attention is attn
    eager_only = spec_kernel_sets(ctx, [BenchRow("spec-decode-graphs", 1)])
    assert [(s.configs, s.compiler) for s in eager_only] == [(("spec-decode-graphs",), None)]


def test_each_phase_stands_beside_the_bench_time_of_its_matching_config():
    """The compiled profile beside spec-compile's replayed phase, the eager one beside spec-decode-graphs'
    (graphs of the eager layers); accept beside accept + advance (timed together); advance beside nothing."""
    from eaglelab.bench.harness import BenchRow
    from eaglelab.bench.profile import StepProfile, with_measured

    graph = {"draft": "replay", "verify": "replay", "draft_extend": "replay"}
    rows = [BenchRow("spec-decode-graphs", 1, draft_ms=0.9, accept_ms=0.2, graph=graph),
            BenchRow("spec-compile", 1, draft_ms=0.6, accept_ms=0.1, graph=graph)]
    kset = SpecKernelSet(("spec-decode-graphs", "spec-compile"), EAGER_KERNELS, None)
    made = {ph: StepProfile(1, "x", "ran", 2, 1.0, 1.0, 1.0, {}, None, [], phase=ph) for ph in ("draft", "accept", "advance")}
    for compiled, (draft, accept) in ((True, (0.6, 0.1)), (False, (0.9, 0.2))):
        got = {p.phase: p for p in with_measured(list(made.values()), rows, kset, compiled)}
        assert (got["draft"].measured_ms, got["accept"].measured_ms, got["advance"].measured_ms) == (draft, accept, None)
        name = "spec-compile" if compiled else "spec-decode-graphs"
        assert got["draft"].measured_by == f"{name}: replay"
        assert got["accept"].measured_by == f"accept + advance, {name}: replay"


def test_a_run_cut_while_profiling_keeps_the_profiles_measured_so_far(tmp_path, questions, monkeypatch):
    """The JSON is rewritten after each batch of profiles: a run stopped in the middle of the speculative phases
    (here: the second batch size fails) still holds the decode profile and the first batch size's phases."""
    import eaglelab.bench.profile as P

    real, calls = P.profile_spec_phases, []

    def cut_at_the_second(ctx, kset, compiled, b, **kw):
        calls.append(b)
        if len(calls) > 1:
            raise KeyboardInterrupt  # a timeout's SIGTERM ends the process the same way: mid-profile
        return real(ctx, kset, compiled, b, **kw)

    monkeypatch.setattr(P, "profile_spec_phases", cut_at_the_second)
    out = tmp_path / "b.json"
    rc = main(_argv(questions, "--configs", "spec-decode", "--batch-sizes", "1,2", "--profile", "--json", str(out)))
    assert rc != 0 and len(calls) == 2  # the CLI turns the interrupt into an exit code
    report = json.loads(out.read_text())
    assert report["partial"] is True
    assert [(p["phase"], p["batch"]) for p in report["profile"]] == [("decode", 1), ("decode", 2)] + [
        (ph, 1) for ph in [*PHASES, "decode"]]


def test_verify_over_decode_lines_up_the_kernels_of_the_two():
    """Named kernels summed per name, inductor's generated kernels per kind (their names differ between the two
    graphs), the costliest surplus first; a row per category and the total (its calls the launches)."""
    from eaglelab.bench.profile import verify_over_decode

    def prof(kernels, cats, launches):
        return {"kernels": [{"name": n, "calls_per_step": c, "us_per_step": us} for n, c, us in kernels],
                "by_category": cats, "launches": launches, "device_us": sum(cats.values())}

    decode = prof([("gemv_kernel", 10, 20.0), ("attention_kernel", 2, 4.0), ("triton_poi_fused_add_3", 2, 2.0)],
                  {"matmul": 20.0, "attention": 4.0, "compiled": 2.0}, 14)
    verify = prof([("gemv_kernel", 10, 30.0), ("attention_combine_kernel", 2, 3.0), ("triton_poi_fused_mul_9", 1, 1.5),
                   ("triton_poi_fused_add_cat_4", 2, 3.5), ("triton_per_fused_mean_1", 1, 1.0)],
                  {"matmul": 30.0, "attention": 3.0, "compiled": 6.0}, 16)
    rows = verify_over_decode(verify, decode)
    named = {r[0]: r[1:] for r in rows}
    assert rows[0][0] == "gemv_kernel" and named["gemv_kernel"] == (10, 20.0, 10, 30.0)
    assert named["inductor pointwise (triton_poi_*)"] == (2, 2.0, 3, 5.0)
    assert named["inductor persistent reduction (triton_per_*)"] == (0, 0.0, 1, 1.0)
    assert named["attention_kernel"] == (2, 4.0, 0, 0.0) and named["attention_combine_kernel"] == (0, 0.0, 2, 3.0)
    assert named["all matmul"][1::2] == (20.0, 30.0) and named["all attention"][1::2] == (4.0, 3.0)
    assert rows[-1] == ("total", 14, 26.0, 16, 39.0)
    surplus = [r[4] - r[2] for r in rows if not r[0].startswith("all ") and r[0] != "total"]
    assert surplus == sorted(surplus, reverse=True)
