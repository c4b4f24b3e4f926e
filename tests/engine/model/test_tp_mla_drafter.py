"""The MLA EAGLE-3 drafter (``Eagle3DeepseekV2ForCausalLM``) under tensor parallelism, 2 gloo ranks on CPU.

Like the Llama-layout drafter, the MLA drafter is replicated on every rank (``engine/model/tp_layers.py``
says why): each rank loads the whole checkpoint through the loader a TP run uses, caches the whole latent
row, and drafts with no collective, from inputs that are identical on every rank (token ids, the replicated
embedding, the target's taps, full width after its all-reduces). The target is HF transformers'
``DeepseekV3ForCausalLM`` (MLA + MoE, YaRN) saved by ``save_pretrained``, its heads split 2 + 2.

Pinned here: the drafter's logits on each rank equal one process's (float32, 1e-5) and the two ranks'
agree bitwise; a draft step issues no collective; EAGLE-3 and EAGLE-3.1 speculation, chain and tree, at
TP=2 emit plain TP=1 greedy's tokens with TP=1 speculation's accept lengths; ``--tp-check`` passes.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from eaglelab.engine.formats.drafter_loader import load_eagle3
from eaglelab.engine.formats.loader import load_target
from eaglelab.engine.model.eagle3 import Eagle3Config
from eaglelab.engine.model.eagle3_mla import Eagle3MLANetwork, eagle3_network
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.engine.runtime.timing import observe_allreduce
from eaglelab.engine.training.train import save_drafter
from tests.conftest import draw_drafter_weights
from tests.engine.model.test_mla import BASE, YARN
from tests.tp_harness import RankFailure, spawn_ranks

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [40, 41, 42, 40, 41]]
SHAPES = {"chain": (1, 3, 0), "tree": (2, 3, 5)}  # (topk, steps, draft tokens)
FLAGS = {"eagle3": {}, "eagle3.1": dict(fc_norm=True, norm_output=True)}
SGLANG_IDS = [0, 1, 2]  # the 4-layer target's taps hs[1, 2, 3]


def save_target(tmp):
    """transformers' own random DeepseekV3ForCausalLM (MLA, YaRN, 3 MoE layers after a dense one), saved."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.DeepseekV3Config(**{**BASE, "num_hidden_layers": 4, "rope_scaling": YARN})
    hf = transformers.DeepseekV3ForCausalLM(cfg)
    path = tmp / "target"
    hf.eval().save_pretrained(path)
    return path


def save_mla_drafter(target, out, flags: dict):
    """An MLA drafter for ``target`` (its MLA sizes and YaRN rope), random then fitted to the target's greedy
    continuations of PROMPTS (so speculation accepts drafts), written by the trainer's exporter."""
    tc = target.config
    cfg = Eagle3Config(hidden_size=tc.hidden_size, target_hidden_size=tc.hidden_size, num_aux=3,
                       num_heads=tc.num_heads, num_kv_heads=1, head_dim=tc.mla.cache_dim, intermediate_size=40,
                       vocab_size=tc.vocab_size, draft_vocab_size=tc.vocab_size, rms_norm_eps=1e-6,
                       rope_theta=tc.rope_theta, rope_scaling=tc.rope_scaling, mla=tc.mla, **flags)
    net = draw_drafter_weights(eagle3_network(cfg, target.embed_tokens), torch.Generator().manual_seed(7))
    fit_first_step(net, target)
    return save_drafter(net, out, target=tc, sglang_layer_ids=SGLANG_IDS, dtype=torch.float32)


def fit_first_step(net, target, steps: int = 60) -> None:
    """Teacher-forced fit of the drafter's first step on the target's own greedy sequences: at position p it
    reads token t_{p+1} and the target's features f_p and learns t_{p+2} (the draft vocabulary is the target's)."""
    seqs = [torch.tensor([p + g]) for p, g in zip(PROMPTS, Engine(target).generate(PROMPTS, 12).tokens)]  # [1, T]
    with torch.no_grad():
        auxes = [target.taps(seq[:, :-2], (1, 2, 3)) for seq in seqs]  # [1, T-2, 3H]
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = torch.zeros(())
        for seq, aux in zip(seqs, auxes):
            _, logits = net(seq[:, 1:-1], net.fuse(aux), torch.arange(seq.shape[1] - 2)[None])  # [1, T-2, V]
            loss = loss + torch.nn.functional.cross_entropy(logits[0], seq[0, 2:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()


def _run(tp, target_dir, drafter_dirs: dict) -> dict:
    """On one rank (or one process with ``tp=None``): drafter logits, collectives per draft step, and greedy
    tokens (plain, then speculative per drafter flavour and tree shape, with their accept lengths)."""
    target = load_target(target_dir, tp=tp, with_tokenizer=False).model
    out: dict = {"plain": Engine(target).generate(PROMPTS, 12).tokens,
                 "local_heads": target.layers[0].self_attn.local_heads}
    for flavour, path in drafter_dirs.items():
        net, taps, _ = load_eagle3(path, target, dtype=torch.float32)
        assert isinstance(net, Eagle3MLANetwork) and taps == (1, 2, 3), (type(net), taps)
        seq = torch.tensor([PROMPTS[0] + out["plain"][0]])  # [1, 20]
        seen: list = []
        if tp is not None:
            observe_allreduce(tp, type("Obs", (), {"on_allreduce": lambda self, s: seen.append((s.layer, s.site))})())
        with torch.no_grad():
            with tp.in_phase("verify") if tp is not None else contextlib.nullcontext():  # the probe sees it
                feats = net.fuse(target.taps(seq[:, :-1], taps))  # [1, 19, H]: the target's (collectives here)
            target_collectives = len(seen)
            seen.clear()
            with tp.in_phase("draft") if tp is not None else contextlib.nullcontext():
                _, logits = net(seq[:, 1:], feats, torch.arange(seq.shape[1] - 1)[None])  # [1, 19, V_draft]
        if tp is not None:
            observe_allreduce(tp, None)
        out[flavour] = {"logits": logits, "draft_collectives": list(seen), "target_collectives": target_collectives}
        for shape, (topk, steps, ndt) in SHAPES.items():
            spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=ndt)
            res = Engine(target, drafter=Eagle3Drafter(net, spec, taps), spec=spec).generate(PROMPTS, 12)
            out[flavour][shape] = (res.tokens, res.accept_lens)
        if tp is not None:  # --tp-check: every cycle asserts the ranks drafted the same tree
            tp.check_replicas = True
            spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=5)
            out[flavour]["checked"] = Engine(target, drafter=Eagle3Drafter(net, spec, taps), spec=spec).generate(
                PROMPTS, 12).tokens
            tp.check_replicas = False
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict, list[dict]]:
    """(one process's results, each TP=2 rank's) for the same target and drafters on disk."""
    tmp = tmp_path_factory.mktemp("tp_mla_drafter")
    target_dir = save_target(tmp)
    single = load_target(target_dir, with_tokenizer=False).model
    drafters = {name: save_mla_drafter(single, tmp / name, flags) for name, flags in FLAGS.items()}
    ranks = spawn_ranks(_run, 2, target_dir, drafters, timeout_s=300)
    for r in ranks:
        assert not isinstance(r, RankFailure), r
    return _run(None, target_dir, drafters), ranks


@pytest.mark.parametrize("flavour", sorted(FLAGS))
def test_drafter_logits_at_tp2_equal_one_process(runs, flavour):
    """19 positions, teacher-forced on the target's own features: each rank's drafter logits [1, 19, 97] are
    within 1e-5 (absolute and relative) of one process's (the features differ only by the target's all-reduce
    order), and the two ranks' are bitwise equal (replicas fed the same all-reduced features)."""
    single, ranks = runs
    ref = single[flavour]["logits"]
    assert ref.shape == (1, 19, 97) and ref.abs().max() > 1.0  # not a comparison of near-zeros
    for r in ranks:
        assert r["local_heads"] == 2  # the target's 4 heads split 2 + 2
        torch.testing.assert_close(r[flavour]["logits"], ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(ranks[0][flavour]["logits"], ranks[1][flavour]["logits"])


@pytest.mark.parametrize("flavour", sorted(FLAGS))
def test_a_draft_step_runs_no_collective(runs, flavour):
    """The replicated drafter over the replicated embedding: no all-reduce, no all-gather while drafting; the
    same probe saw the target's collectives in the forward just before (it is live, not merely silent)."""
    for r in runs[1]:
        assert r[flavour]["target_collectives"] > 0
        assert r[flavour]["draft_collectives"] == []


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("flavour", sorted(FLAGS))
def test_speculation_at_tp2_emits_plain_tp1_greedy(runs, flavour, shape):
    """EAGLE-3 / EAGLE-3.1 MLA drafter, chain (topk 1, 3 steps) and tree (topk 2, 3 steps, 5 tokens), 12 tokens
    for 2 prompts: every rank's tokens equal plain greedy in one process, accept lengths equal TP=1 speculation."""
    single, ranks = runs
    want = single["plain"]
    assert [len(t) for t in want] == [12, 12]
    tokens_1, accepts_1 = single[flavour][shape]
    assert tokens_1 == want
    assert max(max(a) for a in accepts_1) > 1  # drafts were accepted: the ranks had to draft what one process did
    for r in ranks:
        assert r["plain"] == want
        tokens, accepts = r[flavour][shape]
        assert tokens == want and accepts == accepts_1, (tokens, accepts, accepts_1)


@pytest.mark.parametrize("flavour", sorted(FLAGS))
def test_replica_check_passes_for_the_mla_drafter(runs, flavour):
    """--tp-check asserts each cycle that both ranks drafted the same tree: it passes, tokens unchanged."""
    single, ranks = runs
    for r in ranks:
        assert r[flavour]["checked"] == single["plain"]


def _graphs_rank(tp, cache_root: str) -> dict:
    """NCCL, float32: the kimi-like MLA + MoE target at TP=world with the replicated MLA drafter (EAGLE-3.1, a
    tree), eager, then from CUDA graphs (the cycle as one graph), then compiled inside them. -> per mode the
    tokens, accept lengths, graph statuses of the spec cycles, runner failures and compile fallbacks."""
    from pathlib import Path

    from eaglelab.engine.runtime.compile import compile_report, compiled_kernels
    from eaglelab.engine.model.layers import EAGER_KERNELS
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner
    from eaglelab.engine.runtime.runner import EagerRunner
    from tests.engine.model.test_eagle3_mla import TAPS, TCFG, mla_drafter
    from tests.engine.model.test_eagle3_mla import YARN as DRAFT_YARN
    from tests.engine.model.test_tp import build
    from tests.engine.runtime.test_cuda_graphs import Recorder

    dev = torch.device("cuda", tp.local_rank)
    target = build(TCFG, tp).to(dev)  # weights drawn per full tensor, then sharded: the same model at any TP
    shape = dict(num_steps=3, topk=2, num_draft_tokens=5)
    out = {"plain": Engine(target, runner=EagerRunner(target)).generate(PROMPTS, 16).tokens}
    for mode in ("eager", "graphs", "compiled"):
        spec = SpecConfig("eagle3", **shape, cuda_graphs=mode != "eager", compile=mode == "compiled",
                          one_graph_cycle=True)
        net = mla_drafter(target.embed_tokens, rope_scaling=DRAFT_YARN, fc_norm=True, norm_output=True).to(dev)
        d = Eagle3Drafter(net, spec, TAPS)
        kernels = compiled_kernels(Path(cache_root) / str(tp.rank)) if mode == "compiled" else EAGER_KERNELS
        graphs = None if mode == "eager" else CudaGraphRunner.for_engine(target, spec, d, max_len=96, buckets=(2,),
                                                                        kernels=kernels)
        eng = Engine(target, drafter=d, spec=spec, runner=graphs or EagerRunner(target, net), observer=Recorder())
        res = eng.generate(PROMPTS, 16)
        out[mode] = {"tokens": res.tokens, "accepts": res.accept_lens,
                     "graph": sorted({s for c in eng.observer.cycles if c.kind == "spec" for s in c.graph.values()}),
                     "failed": list(graphs._failed.values()) if graphs else [],
                     "fallbacks": compile_report(kernels)[1] if mode == "compiled" else []}
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mla_drafter_on_nccl_under_cuda_graphs_and_compile(tmp_path):
    """NCCL ranks (2 GPUs if there, else 1): the replicated MLA drafter's speculation from CUDA graphs (one graph
    per cycle) and compiled inside them emits plain greedy's tokens with the eager run's accept lengths, every
    spec cycle replays, nothing falls back, and the ranks agree. On an nvidia-h200-x2, about 2-4 minutes::

        python -m pytest -q -m gpu tests/engine/model/test_tp_mla_drafter.py
    """
    from tests.engine.runtime.test_cuda_graphs import REPLAY

    world = min(2, torch.cuda.device_count())
    ranks = spawn_ranks(_graphs_rank, world, str(tmp_path), backend="nccl", timeout_s=560)
    for r in ranks:
        assert not isinstance(r, RankFailure), r
        assert r["eager"]["tokens"] == r["plain"]
        for mode in ("graphs", "compiled"):
            got = r[mode]
            assert got["failed"] == [] and got["fallbacks"] == [], (mode, got)
            assert got["graph"] == [REPLAY], (mode, got["graph"])
            assert got["tokens"] == r["plain"] and got["accepts"] == r["eager"]["accepts"], mode
    assert all(r["plain"] == ranks[0]["plain"] and r["compiled"] == ranks[0]["compiled"] for r in ranks)
