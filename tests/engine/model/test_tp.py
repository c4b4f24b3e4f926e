"""Tensor parallel over 2 gloo ranks on CPU: same logits and same greedy tokens as one process,
and a failing rank makes every rank raise instead of hanging."""

from __future__ import annotations

import time

import pytest
import torch

from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.runtime.drafters import Eagle3Drafter, NgramDrafter
from eaglelab.engine.model.eagle3 import Eagle3Config, Eagle3Network
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.formats.loader import load_random
from eaglelab.engine.model.model import Transformer
from eaglelab.engine.model.moe import kimi_like_config
from eaglelab.engine.core.tp_group import TPError
from tests.tp_harness import RankFailure, spawn_ranks
from eaglelab.engine.runtime.spec_config import SpecConfig

DENSE = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 101, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": True,
}
UNEVEN = dict(DENSE, num_attention_heads=3, num_key_value_heads=3, head_dim=8, intermediate_size=51)  # 2+1 heads
MQA = dict(DENSE, num_attention_heads=4, num_key_value_heads=1, head_dim=8)  # the one KV head on both ranks
MOE = kimi_like_config(
    "cpu", hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    n_routed_experts=8, moe_intermediate_size=16, num_experts_per_tok=3, num_hidden_layers=3, vocab_size=101,
    n_group=4, topk_group=2, first_k_dense_replace=1,
)
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [40, 41, 42, 40, 41]]


def build(cfg_dict: dict, tp, replicate_embedding: bool = True) -> Transformer:
    model = Transformer(ModelConfig.from_dict(cfg_dict), tp, replicate_embedding)
    load_random(model, seed=1, std=0.2)  # large enough that logits are far from ties
    return model.eval()


def random_drafter(target: Transformer) -> Eagle3Drafter:
    cfg = target.config
    dcfg = Eagle3Config(hidden_size=cfg.hidden_size, target_hidden_size=cfg.hidden_size, num_aux=3, num_heads=4,
                        num_kv_heads=2, head_dim=8, intermediate_size=48, vocab_size=cfg.vocab_size,
                        draft_vocab_size=cfg.vocab_size)
    net = Eagle3Network(dcfg, target.embed_tokens)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2 if p.dim() > 1 else torch.ones(p.shape))
    spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=6)
    return Eagle3Drafter(net.eval(), spec, (1, 2, 3))


def greedy_runs(target: Transformer) -> dict[str, list[list[int]]]:
    """Plain greedy, n-gram speculation and EAGLE-3 (tree) speculation, 10 tokens for 2 prompts."""
    ngram = SpecConfig("ngram", num_steps=3)
    eagle = random_drafter(target)
    engines = {
        "plain": Engine(target),
        "ngram": Engine(target, drafter=NgramDrafter(ngram), spec=ngram),
        "eagle3": Engine(target, drafter=eagle, spec=eagle.spec),
    }
    return {k: e.generate(PROMPTS, 10).tokens for k, e in engines.items()}


def _equivalence(tp) -> dict:
    out = {}
    for name, d in (("dense", DENSE), ("uneven", UNEVEN), ("mqa", MQA), ("moe", MOE)):
        single, sharded = build(d, None), build(d, tp)
        ids = torch.randint(0, 101, (2, 40), generator=torch.Generator().manual_seed(3))  # 240 pairs: sorted MoE path
        pos = torch.arange(40).expand(2, 40)
        with torch.no_grad():
            ref = single.logits(single(ids, pos)[0])  # [2, 40, V]
            got = sharded.logits(sharded(ids, pos)[0])
            short = sharded.logits(sharded(ids[:, :3], pos[:, :3])[0])  # 18 pairs: gathered MoE path
        out[name] = {
            "max_diff": float((ref - got).abs().max()),
            "max_diff_short": float((ref[:, :3] - short).abs().max()),
            "logit_scale": float(ref.abs().max()),
            "local_heads": (sharded.layers[0].self_attn.local_heads, sharded.layers[0].self_attn.local_kv_heads),
            "local_vocab": (sharded.embed_tokens.weight.shape[0], sharded.lm_head.weight.shape[0]),
            "tied": sharded.lm_head.weight is sharded.embed_tokens.weight,
            "single_tied": single.lm_head.weight is single.embed_tokens.weight,
            "checksum": float(got.double().sum()),
            "tokens_single": greedy_runs(single)["plain"],
            "tokens_tp": greedy_runs(sharded),
        }
        if name == "moe":
            out[name]["local_expert_width"] = sharded.layers[1].mlp.experts.gate_proj.shape[1]
    single, vocab_parallel = build(DENSE, None), build(DENSE, tp, replicate_embedding=False)  # all-reduce, not a copy
    with torch.no_grad():
        ref, got = single.logits(single(ids, pos)[0]), vocab_parallel.logits(vocab_parallel(ids, pos)[0])
    out["vocab_parallel"] = {"max_diff": float((ref - got).abs().max()),
                             "local_vocab": (vocab_parallel.embed_tokens.weight.shape[0], vocab_parallel.lm_head.weight.shape[0]),
                             "tied": vocab_parallel.lm_head.weight is vocab_parallel.embed_tokens.weight}
    return out


@pytest.fixture(scope="module")
def equivalence() -> list[dict]:
    results = spawn_ranks(_equivalence, 2)
    for r in results:
        assert not isinstance(r, RankFailure), r
    return results


@pytest.mark.parametrize("name", ["dense", "uneven", "mqa", "moe"])
def test_tp_logits_equal_single_process(equivalence, name):
    """Batch 2 x 40 tokens (and x 3): TP=2 logits equal one process's in float32, on both ranks, within 5e-6 of the
    logits' largest magnitude (~4 here: the bound ~2e-5; the shards' sums come in another order, and an AMD EPYC's
    MKL read 1.08e-5 on the MoE where an Intel Xeon stayed under 1e-5).

    The embedding is replicated (all 101 rows on each rank); the head's vocabulary (101, odd) splits
    51 + 50 (and a zero pad row), a tied model's head keeping its own shard of the table; heads split
    by GQA group: 4 heads / 2 KV -> 2+2 / 1+1; 3 / 3 (like SmolLM2's 9 / 3) -> 2+1 / 2+1; 4 / 1 ->
    2+2, KV copied."""
    for rank in equivalence:
        r = rank[name]
        assert r["logit_scale"] > 0.5  # the comparison is not between zeros
        bound = 5e-6 * r["logit_scale"]
        assert r["max_diff"] < bound and r["max_diff_short"] < bound, r
        assert r["local_vocab"] == (101, 51)
        assert not r["tied"] and r["single_tied"] == (name != "moe")  # one process still shares the table
    heads = [rank[name]["local_heads"] for rank in equivalence]
    assert heads == {"dense": [(2, 1), (2, 1)], "uneven": [(2, 2), (1, 1)], "mqa": [(2, 1), (2, 1)],
                     "moe": [(2, 1), (2, 1)]}[name]
    assert equivalence[0][name]["checksum"] == equivalence[1][name]["checksum"]  # ranks agree bitwise
    if name == "moe":
        assert equivalence[0]["moe"]["local_expert_width"] == 8  # 16 split over 2 ranks


def test_tp_vocab_parallel_embedding_equals_single_process(equivalence):
    """The vocab-parallel lookup (51 + 50 rows and an all-reduce) stays exact, and ties its head."""
    for rank in equivalence:
        r = rank["vocab_parallel"]
        assert r["max_diff"] < 1e-5 and r["local_vocab"] == (51, 51) and r["tied"], r


@pytest.mark.parametrize("name", ["dense", "uneven", "mqa", "moe"])
def test_tp_greedy_tokens_equal_single_process(equivalence, name):
    """Plain, n-gram and EAGLE-3 tree speculation under TP=2 emit the single-process greedy tokens."""
    want = equivalence[0][name]["tokens_single"]
    assert [len(t) for t in want] == [10, 10]
    for rank in equivalence:
        for algo, tokens in rank[name]["tokens_tp"].items():
            assert tokens == want, (rank, algo)


def _fail_before_forward(tp) -> str:
    """Rank 1 raises before any collective; rank 0 goes on into a forward and blocks in an all-reduce."""
    model = build(DENSE, tp)
    with tp.guard("generate"):
        if tp.rank == 1:
            raise ValueError("boom on rank 1")
        Engine(model).generate(PROMPTS, 5)
    return "finished"


def _fail_inside_forward(tp) -> str:
    """Rank 0 (the store's host) raises in layer 1's MLP, after layer 0's all-reduces."""
    model = build(MOE, tp)
    if tp.rank == 0:
        def broken(x, **kw):
            raise RuntimeError("expert kernel exploded")
        model.layers[1].mlp.forward = broken
    with tp.guard("generate"):
        Engine(model).generate(PROMPTS, 5)
    return "finished"


@pytest.mark.parametrize("scenario, failing, message", [
    (_fail_before_forward, 1, "ValueError: boom on rank 1"),
    (_fail_inside_forward, 0, "RuntimeError: expert kernel exploded"),
], ids=["before-forward", "inside-forward"])
def test_failing_rank_makes_every_rank_raise(scenario, failing, message):
    """The failing rank raises its own error; the other raises TPError naming it; nobody hangs."""
    t0 = time.monotonic()
    results = spawn_ranks(scenario, 2, timeout_s=60)
    assert time.monotonic() - t0 < 30
    own, other = results[failing], results[1 - failing]
    assert isinstance(own, RankFailure) and not own.is_tp_error
    assert message.split(": ", 1)[1] in own.message
    assert isinstance(other, RankFailure) and other.is_tp_error, other
    assert f"rank {failing} of 2 failed during generate: {message}" in other.message


def _replica_check(tp, diverge: bool) -> list[list[int]]:
    """EAGLE-3 under TP with the debug replica check on; with ``diverge`` rank 1's drafter differs."""
    model = build(DENSE, tp)
    eagle = random_drafter(model)
    if diverge and tp.rank == 1:
        with torch.no_grad():
            eagle.net.fc.weight.mul_(-1.0)
    tp.check_replicas = True
    return Engine(model, drafter=eagle, spec=eagle.spec).generate(PROMPTS, 10).tokens


def test_replica_check_passes_when_drafts_agree_and_names_the_divergence():
    """--tp-check: replicated drafters that agree pass (and still give the single-process tokens);
    a rank whose drafter differs makes every rank raise at the first cycle, naming the draft tokens."""
    ok = spawn_ranks(_replica_check, 2, False)
    assert ok[0] == ok[1] and not isinstance(ok[0], RankFailure), ok
    assert ok[0] == greedy_runs(build(DENSE, None))["plain"]
    bad = spawn_ranks(_replica_check, 2, True)
    for r in bad:
        assert isinstance(r, RankFailure) and r.type_name == "AssertionError", r
        assert "draft tokens of cycle 1 differ across ranks" in r.message  # the first cycle, as its stats number it


def test_tp_error_is_a_user_facing_error():
    """TPError prints through the CLI's EagleLabError path (no traceback)."""
    from eaglelab.engine.errors import EagleLabError

    assert issubclass(TPError, EagleLabError)


def _cuda_timing(tp) -> dict:
    """One NCCL rank on one GPU: eager all-reduces timed by CUDA events (read at flush), and a
    captured decode forward whose all-reduce events, captured with it, are read after each replay."""
    from eaglelab.engine.runtime.timing import observe_allreduce

    dev = torch.device("cuda", tp.local_rank)
    model = build(DENSE, tp).to(dev)
    seen: list = []
    observe_allreduce(tp, type("Obs", (), {"on_allreduce": lambda self, s: seen.append(s)})())
    ids = torch.tensor([[5, 6, 7]], device=dev)
    pos = torch.arange(3, device=dev)[None]
    with torch.no_grad(), tp.in_phase("prefill"):
        eager = model.logits(model(ids, pos)[0])
    n_pending = len(tp._pending)
    tp.flush_timings()
    eager_stats = [(s.layer, s.site, s.nbytes, s.phase, s.in_graph, s.ms) for s in seen]
    seen.clear()
    stream, graph = torch.cuda.Stream(dev), torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream(dev))
    with torch.no_grad(), tp.capture("decode"):
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: not timed
                model.logits(model(ids, pos)[0])
        torch.cuda.current_stream(dev).wait_stream(stream)
        with torch.cuda.graph(graph, stream=stream):
            out = model.logits(model(ids, pos)[0])
    torch.cuda.synchronize(dev)
    warmup_pending = len(tp._pending)
    replays = []
    for _ in range(2):
        with tp.in_phase("decode"):
            graph.replay()
            tp.replayed("decode")
        torch.cuda.synchronize(dev)
        tp.flush_timings()
        replays.append([(s.layer, s.site, s.nbytes, s.phase, s.in_graph, s.ms) for s in seen])
        seen.clear()
    return {"eager": eager_stats, "n_pending": n_pending, "warmup_pending": warmup_pending, "replays": replays,
            "same": bool(torch.allclose(out, eager, atol=1e-5, rtol=1e-5))}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_event_timing_eager_and_inside_graph_replays():
    """Per forward: 2 per layer + head (the embedding is replicated), eager (CUDA events) and from each graph replay
    (events captured into the graph, in_graph=True, phase of the replay); warm-up untimed."""
    (r,) = spawn_ranks(_cuda_timing, 1, backend="nccl", timeout_s=120)
    assert not isinstance(r, RankFailure), r
    want = [(i, s, 3 * 32 * 4) for i in range(3) for s in ("attn", "mlp")] + [(3, "head", 3 * 101 * 4)]
    assert r["n_pending"] == len(want)
    assert [e[:3] for e in r["eager"]] == want
    assert all(e[3] == "prefill" and not e[4] and e[5] > 0 for e in r["eager"])
    assert r["warmup_pending"] == 0
    for rep in r["replays"]:
        assert [e[:3] for e in rep] == want
        assert all(e[3] == "decode" and e[4] and 0 < e[5] < 1000 for e in rep)
    assert r["same"]
