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
                assert len(want[cfg][b]) == b and all(len(row) == 8 for row in want[cfg][b])
                assert got[cfg][b] == want[cfg][b], (rank, cfg, b)


def test_bench_tp2_speculation_equals_plain(runs):
    """Greedy speculative decoding under TP emits plain decoding's tokens (the report's agreement)."""
    _, _, rep = runs
    rows = {(r["config"], r["batch"]): r for r in rep["rows"]}
    for b in (1, 2):
        assert rows[("spec-decode", b)]["same_tokens_as_plain_eager"] == 1.0
        assert rows[("plain-eager", b)]["tokens"] == b * 8


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
