"""``eaglelab bench --tp 2`` over 2 gloo ranks on CPU (float32, the tiny scale model): the same
tokens as ``--tp 1``, greedy speculation equal to plain decoding, and the TP figures in the report."""

from __future__ import annotations

import json

import pytest

from eaglelab.cli import build_parser, main
from tests.tp_harness import RankFailure, spawn_ranks

QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a haiku about the sea."]},
    {"question_id": 2, "category": "math", "turns": ["What is 12 times 12?"]},
]
CONFIGS = "plain-eager,spec-decode"


def _argv(questions: str, tp: int, json_out: str) -> list[str]:
    return ["bench", "--tp", str(tp), "--scale-model", "tiny", "--device", "cpu", "--dtype", "float32",
            "--questions", questions, "--configs", CONFIGS, "--batch-sizes", "1,2", "--prompts", "2",
            "--max-new-tokens", "8", "--repeats", "1", "--no-micro", "--json", json_out]


def _bench_rank(tp, argv: list[str]):
    from eaglelab.cmd_bench import bench

    report, outputs = bench(build_parser().parse_args(argv), tp)
    return report, outputs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench_tp")
    questions = tmp / "question.jsonl"
    questions.write_text("\n".join(json.dumps(q) for q in QUESTIONS) + "\n")
    one = _bench_rank(None, _argv(str(questions), 1, str(tmp / "tp1.json")))
    two = spawn_ranks(_bench_rank, 2, _argv(str(questions), 2, str(tmp / "tp2.json")), timeout_s=240.0)
    for r in two:
        assert not isinstance(r, RankFailure), r
    return one, two, json.loads((tmp / "tp2.json").read_text())


def test_bench_tp2_gives_the_tokens_of_tp1(runs):
    """Each configuration and batch size: every rank of --tp 2 emits the --tp 1 tokens (float32)."""
    (_, want), two, _ = runs
    for rank, (_, got) in enumerate(two):
        for cfg in CONFIGS.split(","):
            for b in (1, 2):
                assert len(want[cfg][b]) == 2 and all(len(row) == 8 for row in want[cfg][b])  # every prompt
                assert got[cfg][b] == want[cfg][b], (rank, cfg, b)


def test_bench_tp2_speculation_equals_plain(runs):
    """Greedy speculative decoding under TP emits plain decoding's tokens (the report's agreement)."""
    _, _, rep = runs
    rows = {(r["config"], r["batch"]): r for r in rep["rows"]}
    for b in (1, 2):
        assert rows[("spec-decode", b)]["same_tokens_as_plain_eager"] == 1.0
        assert rows[("plain-eager", b)]["tokens"] == 2 * 8  # both prompts


def test_bench_tp2_reports_where_the_allreduces_go(runs):
    """The no-op comparison, the probe's sites and the arrival skew are in rank 0's JSON.

    The tiny model has 4 layers: 2 all-reduces per layer + the logits all-gather = 9 collectives per
    step; the embedding is replicated (no "embed" site) and the drafter runs none (no "draft" phase)."""
    _, _, rep = runs
    tp = rep["tp"]
    assert tp["world_size"] == 2 and tp["backend"] == "gloo" and tp["embedding"].startswith("replicated")
    assert {(r["batch"], r["step"]) for r in tp["share"]} == {(1, "decode"), (1, "verify"), (2, "decode"), (2, "verify")}
    for r in tp["share"]:
        assert r["collectives"] == 9 and r["with_ms"] > 0 and r["without_ms"] > 0 and not r["graphs"]
        assert r["share"] == pytest.approx((r["with_ms"] - r["without_ms"]) / r["with_ms"])
    for row in rep["rows"]:
        ar = row["allreduce"]
        sites = {s["site"] for s in ar["sites"]}
        assert sites == {"attn", "mlp", "head"}, sites
        assert all(s["calls"] > 0 and s["transfer_ms"] >= 0 and s["wait_ms"] >= 0 for s in ar["sites"])
        phases = {s["phase"] for s in ar["sites"]}
        assert "draft" not in phases and "draft_extend" not in phases
        assert set(ar["per_layer"]) == {"0", "1", "2", "3", "4"}  # 4 layers, the head as layer 4
        groups = {g["where"]: g for g in ar["arrival_skew"]}
        assert set(groups) == {"first of forward", "layers", "logits all-gather"}
        calls = sum(s["calls"] for s in ar["sites"])
        assert sum(g["calls"] for g in groups.values()) == calls
        assert groups["first of forward"]["calls"] == sum(s["calls"] for s in ar["sites"] if s["site"] == "head")
        assert all(0 < v <= 1 for v in ar["phase_share"].values())
        assert "of the summed skew" in ar["skew_verdict"]


def test_bench_tp_without_torchrun_is_a_user_error(capsys, monkeypatch):
    """--tp 2 outside torchrun: no traceback, the error names --tp and says how to launch."""
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    rc = main(["bench", "--tp", "2", "--scale-model", "tiny", "--device", "cpu"])
    err = capsys.readouterr().err
    assert rc != 0 and "--tp" in err and "torchrun" in err and "Traceback" not in err


# ---- the arrival-skew reduction (pure functions) --------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from eaglelab.bench.tp import arrival_skew, skew_verdict  # noqa: E402


def test_arrival_skew_groups_calls_and_names_the_late_rank():
    """Two forwards of 2 layers over 2 ranks; rank 1 enters every forward's first collective 0.5 ms
    late (host work before it), then both leave together: worked example of every figure.

    rank 0 enters/leaves at  0/1, 1/2, 2/3, 3/4 (layer 0 attn, mlp, layer 1 attn, head), then 10/11 ...
    rank 1 enters at 0.5 on each first-of-forward call, leaves with rank 0."""
    def forward(t0: float, late: float):
        return [(t0 + late, t0 + 1, 0, "attn"), (t0 + 1, t0 + 2, 0, "mlp"), (t0 + 2, t0 + 3, 1, "attn"),
                (t0 + 3, t0 + 4, 1, "mlp"), (t0 + 4, t0 + 5, 2, "head")]
    r0 = forward(0, 0) + forward(10, 0)
    r1 = forward(0, 0.5) + forward(10, 0.5)
    groups = {g.where: g for g in arrival_skew([r0, r1])}
    first = groups["first of forward"]
    assert first.calls == 2 and first.mean_ms == pytest.approx(0.5) and first.last_rank == {1: 2}
    assert first.carried_ms == 0.0  # both left the previous collective together
    assert first.host_work_ms == pytest.approx(0.25)  # the second forward's gap differs by 0.5; the first has none
    assert groups["layers"].calls == 6 and groups["layers"].max_ms == 0.0
    assert groups["logits all-gather"].calls == 2
    verdict = skew_verdict(list(groups.values()), 2)
    assert verdict.startswith("100% of the summed skew is at the 'first of forward' collectives")


arrival = st.tuples(st.floats(0, 5), st.floats(0, 5))  # (host work before, time inside)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(arrival, min_size=6, max_size=6), min_size=2, max_size=4))
def test_arrival_skew_is_bounded_by_what_was_carried_plus_host_work(ranks):
    """Per call, entry spread <= spread of the previous exits + spread of the host work in between
    (enter = previous exit + work); so the group means obey it too, and every figure is >= 0."""
    sites = [(0, "attn"), (0, "mlp"), (1, "attn"), (1, "mlp"), (2, "head"), (0, "attn")]
    seqs = []
    for calls in ranks:
        t, seq = 0.0, []
        for (work, inside), (layer, site) in zip(calls, sites):
            seq.append((t + work, t + work + inside, layer, site))
            t += work + inside
        seqs.append(seq)
    groups = arrival_skew(seqs)
    assert sum(g.calls for g in groups) == 6
    for g in groups:
        slack = 1e-9 * max(1.0, g.max_ms)  # a mean of equal values may round one ulp above them
        assert 0 <= g.median_ms <= g.max_ms + slack and 0 <= g.mean_ms <= g.max_ms + slack
        assert g.mean_ms <= g.carried_ms + g.host_work_ms + 1e-9 or g.where == "first of forward"
        assert sum(g.last_rank.values()) == g.calls


# ---- on CUDA: the no-op comparison with graphs ------------------------------------------------------

def _share_on_cuda(tp):
    import torch

    from eaglelab.bench.tp import allreduce_share
    from eaglelab.engine.model.scale_models import build_scale_model

    sm = build_scale_model("tiny", device=torch.device("cuda", tp.local_rank), dtype=torch.bfloat16, tp=tp)
    rows = allreduce_share(sm.model, tp, (1, 2), 4, context=32, warmup=2, iters=5)
    return [(r.batch, r.step, r.graphs, r.collectives, r.with_ms, r.without_ms) for r in rows]


@pytest.mark.gpu
def test_allreduce_share_captures_graphs_with_and_without_collectives():
    """NCCL ranks (2 GPUs if there, else 1): decode and verify, eager and from graphs, with and without
    their collectives; graphs captured inside collectives_off replay without any."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    world = min(2, torch.cuda.device_count())
    results = spawn_ranks(_share_on_cuda, world, backend="nccl", timeout_s=180)
    for r in results:
        assert not isinstance(r, RankFailure), r
        assert {(b, s, g) for b, s, g, *_ in r} == {(b, s, g) for b in (1, 2) for s in ("decode", "verify")
                                                    for g in (False, True)}
        assert all(n == 9 and w > 0 and wo > 0 for *_, n, w, wo in r)


def _fallbacks_rank(tp):
    from types import SimpleNamespace

    from eaglelab.bench.harness import compile_fallbacks

    phases = [SimpleNamespace(reason=None), SimpleNamespace(reason="eager: verify [b=1] did not compile (X)")]
    return compile_fallbacks(SimpleNamespace(tp=tp), phases if tp.rank == 1 else phases[:1])


def test_a_compile_fallback_on_another_rank_is_reported_by_rank_0():
    """A phase that compiled on rank 0 but fell back to eager on rank 1 shows in rank 0's report."""
    got = spawn_ranks(_fallbacks_rank, 2, timeout_s=60.0)
    assert got == [("rank 1: eager: verify [b=1] did not compile (X)",)] * 2
