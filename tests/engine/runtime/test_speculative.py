"""Speculation never changes what the target produces: greedy speculative output equals plain greedy
output token for token (float32), for chains and trees, batch 1 and > 1, both verify attention
modes and both drafters, including a randomly initialised EAGLE-3 drafter.
"""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglelab.engine.runtime.drafters import Eagle3Drafter, NgramDrafter
from eaglelab.engine.model.eagle3 import Eagle3Config, Eagle3Network
from eaglelab.engine.formats.drafter_loader import load_eagle3
from eaglelab.engine.errors import CheckpointError, EagleLabError
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.conftest import CycleCollector, random_model, tiny_config

CFG = tiny_config(num_hidden_layers=6)
TAPS = (2, 3, 4)  # HF indices of a 6-layer target (SGLang ids 1, 2, 3)


@pytest.fixture(scope="module")
def target():
    return random_model(CFG, seed=21)


def random_drafter(target, seed: int, draft_vocab: int = 48) -> Eagle3Network:
    torch.manual_seed(seed)
    cfg = Eagle3Config(hidden_size=64, target_hidden_size=64, num_aux=3, num_heads=4, num_kv_heads=2, head_dim=16,
                       intermediate_size=96, vocab_size=CFG["vocab_size"], draft_vocab_size=draft_vocab)
    net = Eagle3Network(cfg, target.embed_tokens)
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.normal_(0, 0.2) if "norm" not in name else p.fill_(1.0)
        ids = torch.randperm(CFG["vocab_size"])[:draft_vocab].sort().values
        net.d2t.copy_(ids - torch.arange(draft_vocab))
        net.t2d.zero_()
        net.t2d[ids] = True
    net.reset_buffers()
    return net.eval()


PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [9, 10], [11, 12, 13, 11, 12, 13, 11, 12]]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 1000),
    shape=st.sampled_from([(1, 3, 0), (1, 1, 0), (2, 3, 5), (3, 2, 6), (4, 3, 10)]),  # (topk, steps, tokens)
    mode=st.sampled_from(["decode", "prefill"]),
    batch=st.sampled_from([1, 3]),
)
def test_eagle3_greedy_equals_plain(target, seed, shape, mode, batch):
    topk, steps, ndt = shape
    spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=ndt, attention_mode=mode)
    prompts = PROMPTS[:batch]
    plain = Engine(target, eos_token_ids=(3,)).generate(prompts, 18)
    drafter = Eagle3Drafter(random_drafter(target, seed), spec, TAPS)
    spec_out = Engine(target, eos_token_ids=(3,), drafter=drafter, spec=spec).generate(prompts, 18)
    assert spec_out.tokens == plain.tokens
    assert spec_out.stop_reasons == plain.stop_reasons
    assert drafter.cache.tokens is None  # no lookup branch: the drafter's cache keeps no history


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1000), shape=st.sampled_from([(1, 2, 0), (2, 3, 5), (4, 3, 10)]),
       lookup=st.integers(1, 9), mode=st.sampled_from(["decode", "prefill"]), batch=st.sampled_from([1, 3]))
def test_a_lookup_branch_keeps_greedy_equal_to_plain_and_accepts_past_the_drafter(target, seed, shape, lookup, mode,
                                                                                   batch):
    """Beside a random drafter's tree (a chain too), the lookup branch: the same tokens as plain greedy decoding,
    no path deeper than the deeper of the two. (That the branch is accepted: test_default_model's lookup test.)"""
    topk, steps, ndt = shape
    spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=ndt, attention_mode=mode,
                      lookup_tokens=lookup)
    prompts = ([[20, 21, 22, 23, 24] * 4, [30, 31, 32], [5, 6, 7, 8, 5, 6, 7]])[:batch]
    plain = Engine(target, eos_token_ids=(3,)).generate(prompts, 30)
    drafter = Eagle3Drafter(random_drafter(target, seed), spec, TAPS)
    out = Engine(target, eos_token_ids=(3,), drafter=drafter, spec=spec).generate(prompts, 30)
    assert out.tokens == plain.tokens and out.stop_reasons == plain.stop_reasons
    assert drafter.cache.tokens is not None and drafter.cache.tokens.shape[0] == batch
    lens = [a for cyc in out.accept_lens for a in cyc]
    assert max(lens) <= max(steps, lookup) + 1


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 1000), shape=st.sampled_from([(2, 3, 5), (4, 3, 10)]), lookup=st.integers(1, 6),
       mode=st.sampled_from(["decode", "prefill"]))
def test_a_lookup_branch_spilling_into_the_tree_keeps_greedy_equal_to_plain(target, seed, shape, lookup, mode):
    """With lookup_spill, rows whose last token is new verify the drafter's wider tree instead of the branch
    (the third prompt's tokens never repeat until the output does): still plain greedy's tokens and stops."""
    topk, steps, ndt = shape
    spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=ndt, attention_mode=mode,
                      lookup_tokens=lookup, lookup_spill=True)
    prompts = [[20, 21, 22, 23, 24] * 4, [5, 6, 7, 8, 5, 6, 7], [40, 41, 42, 43]]
    plain = Engine(target, eos_token_ids=(3,)).generate(prompts, 30)
    drafter = Eagle3Drafter(random_drafter(target, seed), spec, TAPS)
    out = Engine(target, eos_token_ids=(3,), drafter=drafter, spec=spec).generate(prompts, 30)
    assert out.tokens == plain.tokens and out.stop_reasons == plain.stop_reasons


@pytest.mark.parametrize("mode", ["decode", "prefill"])
@pytest.mark.parametrize("steps", [1, 4])
def test_ngram_greedy_equals_plain_and_accepts_repeats(target, mode, steps):
    spec = SpecConfig("ngram", num_steps=steps, attention_mode=mode)
    prompts = [[20, 21, 22, 23, 24] * 4, [30, 31, 32]]
    plain = Engine(target).generate(prompts, 24)
    out = Engine(target, drafter=NgramDrafter(spec), spec=spec).generate(prompts, 24)
    assert out.tokens == plain.tokens
    assert all(1 <= a <= steps + 1 for cyc in out.accept_lens for a in cyc)


def test_accepted_tokens_past_the_limit_are_dropped(target):
    """max_new_tokens falling inside an accepted run ends the row exactly at the limit."""
    spec = SpecConfig("ngram", num_steps=4)
    prompts = [[20, 21, 22, 23, 24] * 4]
    for limit in (1, 2, 5, 7):
        plain = Engine(target).generate(prompts, limit).tokens
        assert Engine(target, drafter=NgramDrafter(spec), spec=spec).generate(prompts, limit).tokens == plain


def test_eos_inside_an_accepted_run_ends_the_row_there(target):
    prompts = [[20, 21, 22, 23, 24] * 4]
    free = Engine(target).generate(prompts, 20).tokens[0]
    eos = free[5]
    spec = SpecConfig("ngram", num_steps=4)
    plain = Engine(target, eos_token_ids=(eos,)).generate(prompts, 20)
    out = Engine(target, eos_token_ids=(eos,), drafter=NgramDrafter(spec), spec=spec).generate(prompts, 20)
    assert out.tokens == plain.tokens and out.tokens[0][-1] == eos and out.stop_reasons == ["eos"]


def test_drafter_incremental_state_equals_full_recompute(target):
    """The drafter's logits during drafting equal one causal pass over the same (features, tokens):
    its KV cache, positions and draft-extend bookkeeping are right, not merely lossless."""
    spec = SpecConfig("eagle3", num_steps=1, topk=1, one_graph_cycle=False)  # phases: the cycle calls propose
    net = random_drafter(target, 3)
    prop = Eagle3Drafter(net, spec, TAPS)
    seen: list[torch.Tensor] = []
    original = prop.propose

    def spy(st, runner):
        seen.append(prop.next_logits[0].clone())
        return original(st, runner)

    prop.propose = spy
    prompt = [5, 6, 7, 8, 9]
    out = Engine(target, drafter=prop, spec=spec).generate([prompt], 10).tokens[0]
    seq = torch.tensor([prompt + out])
    aux = target.taps(seq, TAPS)  # [1, T, 3H]
    T = seq.shape[1]
    with torch.no_grad():
        _, logits = net(seq[:, 1:], net.fuse(aux[:, :-1]), torch.arange(T - 1)[None])
    full = logits[0]  # row p predicts token p + 2
    assert len(seen) >= 3, f"propose ran {len(seen)} times: the spy watched nothing"
    for i, root_logits in enumerate(seen):  # cycle i drafts for the root at position len(prompt) + i
        p = len(prompt) + i - 1
        assert torch.allclose(root_logits, full[p], atol=1e-4), f"cycle {i}"


def test_sampling_with_speculation_is_seeded_and_valid(target):
    from eaglelab.engine.runtime.sampling import SamplingParams

    spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=5)
    drafter = Eagle3Drafter(random_drafter(target, 5), spec, TAPS)
    eng = Engine(target, drafter=drafter, spec=spec)
    params = SamplingParams(temperature=0.9, top_p=0.95)
    a = eng.generate(PROMPTS, 12, params, torch.Generator().manual_seed(1)).tokens
    b = eng.generate(PROMPTS, 12, params, torch.Generator().manual_seed(1)).tokens
    assert a == b and all(len(r) == 12 for r in a)
    assert all(0 <= t < CFG["vocab_size"] for r in a for t in r)


# ---- SpecForge-format checkpoints built from the documented format ------------------------------

def _write_specforge(path, target, *, ids=(1, 2, 3), fc_in=None, d2t=True, vocab=None, arch="LlamaForCausalLMEagle3"):
    from safetensors.torch import save_file

    net = random_drafter(target, 7)
    cfg = {
        "architectures": [arch], "model_type": "llama", "num_hidden_layers": 1,
        "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "vocab_size": vocab or CFG["vocab_size"], "draft_vocab_size": 48,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(ids), "use_aux_hidden_state": True},
    }
    tensors = {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}
    if fc_in is not None:
        tensors["fc.weight"] = torch.randn(64, fc_in)
    if not d2t:
        del tensors["d2t"]
        del tensors["t2d"]
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(cfg))
    return path, net


def test_specforge_checkpoint_loads_and_runs_losslessly(target, tmp_path):
    path, net = _write_specforge(tmp_path / "draft", target, ids=(1, 2, 3))
    loaded, taps, reason = load_eagle3(path, target)
    assert taps == (2, 3, 4) and "sglang" in reason  # SGLang convention: id k = hs[k + 1]
    for (n1, a), (n2, b) in zip(net.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and torch.equal(a, b), n1
    spec = SpecConfig("eagle3", num_steps=3, topk=2, num_draft_tokens=6)
    out = Engine(target, drafter=Eagle3Drafter(loaded, spec, taps), spec=spec).generate(PROMPTS, 10)
    assert out.tokens == Engine(target).generate(PROMPTS, 10).tokens


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(d2t=False), "d2t"),
        (dict(fc_in=64 * 2), "fc"),
        (dict(vocab=200), "vocab"),
        (dict(ids=(1, 2, 9)), "eagle_aux_hidden_state_layer_ids"),
    ],
)
def test_bad_checkpoints_name_the_field(target, tmp_path, kwargs, field):
    path, _ = _write_specforge(tmp_path / "bad", target, **kwargs)
    with pytest.raises(EagleLabError) as e:
        load_eagle3(path, target)
    assert field in (e.value.field or "") + str(e.value)


def test_unknown_format_is_rejected(target, tmp_path):
    path, _ = _write_specforge(tmp_path / "odd", target, arch="MedusaModel")
    cfg = json.loads((path / "config.json").read_text())
    del cfg["eagle_config"], cfg["draft_vocab_size"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(EagleLabError, match="(?i)format|architecture"):
        load_eagle3(path, target)


# ---- the real default model -------------------------------------------------------------------

@pytest.mark.slow
def test_default_model_ngram_is_lossless(default_target):
    tok = default_target.tokenizer
    ids = tok.chat_ids("Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat.")
    eos = tok.eos_token_ids
    plain = Engine(default_target.model, eos_token_ids=eos).generate([ids], 40)
    spec = SpecConfig("ngram", num_steps=4)
    out = Engine(default_target.model, eos_token_ids=eos, drafter=NgramDrafter(spec), spec=spec).generate([ids], 40)
    assert out.tokens == plain.tokens
    assert out.mean_accept_len > 1.5  # the prompt repeats itself, so lookups hit


@pytest.mark.slow
@pytest.mark.parametrize("topk, steps, ndt", [(1, 3, 0), (4, 5, 8)])
def test_shipped_drafter_is_lossless_and_beats_chance(default_target, topk, steps, ndt):
    """The drafter shipped in the package loads with its SGLang ids and accepts more than a random one."""
    from eaglelab.draft_registry import shipped_drafter_dir

    path = shipped_drafter_dir()
    assert path is not None, "the package ships eaglelab/drafters/smollm2-135m-eagle3"
    net, taps, _ = load_eagle3(path, default_target.model)
    assert taps == (2, 15, 27)
    tok = default_target.tokenizer
    ids = [tok.chat_ids("Summarize the key ideas of open source software in a few bullet points.")]
    eos = tok.eos_token_ids
    spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=ndt)
    out = Engine(default_target.model, eos_token_ids=eos, drafter=Eagle3Drafter(net, spec, taps), spec=spec).generate(ids, 40)
    plain = Engine(default_target.model, eos_token_ids=eos).generate(ids, 40)
    assert out.tokens == plain.tokens
    assert out.mean_accept_len > 1.8


@pytest.mark.slow
def test_a_lookup_branch_beside_the_shipped_drafter_accepts_copied_text_in_fewer_cycles(default_target):
    """An answer that copies its prompt's names: with the lookup branch beside the shipped drafter's 5/4/24 tree,
    the plain greedy tokens, paths longer than the drafter's five steps, and fewer cycles than the tree alone."""
    from eaglelab.draft_registry import shipped_drafter_dir

    net, taps, _ = load_eagle3(shipped_drafter_dir(), default_target.model)
    tok = default_target.tokenizer
    ids = [tok.chat_ids("Rewrite this list as a JSON array of objects with name and city fields: Alice Smith, Paris; "
                        "Bob Jones, Rome; Carla Diaz, Madrid; David Lee, Seoul; Erin Walsh, Dublin.")]
    plain = Engine(default_target.model, eos_token_ids=()).generate(ids, 64)
    runs = {}
    for lookup, spill in ((0, False), (8, False), (8, True)):
        spec = SpecConfig("eagle3", num_steps=5, topk=4, num_draft_tokens=24, lookup_tokens=lookup, lookup_spill=spill)
        runs[lookup, spill] = Engine(default_target.model, eos_token_ids=(), drafter=Eagle3Drafter(net, spec, taps),
                                     spec=spec).generate(ids, 64)
        assert runs[lookup, spill].tokens == plain.tokens
    branch, alone = runs[8, False], runs[0, False]
    assert max(a for cyc in branch.accept_lens for a in cyc) > 6
    assert branch.cycles < alone.cycles


def test_cycles_report_sibling_ranks_of_the_accepted_path(target):
    """A full tree (topk 4, 3 steps, all 37 nodes kept): depth-1 nodes are the root's children
    in rank order, so the first accepted node index is its rank; a path as deep as the tree cannot
    go deeper (closed); a path that accepted nothing was offered depth 1 (open)."""
    obs = CycleCollector()
    spec = SpecConfig("eagle3", num_steps=3, topk=4, num_draft_tokens=1 + 4 + 2 * 16)
    drafter = Eagle3Drafter(random_drafter(target, 5, draft_vocab=CFG["vocab_size"]), spec, TAPS)
    Engine(target, drafter=drafter, spec=spec, observer=obs).generate(PROMPTS, 40)
    rows = [(a, pos, r, o) for c in obs.cycles if c.kind == "spec"
            for a, pos, r, o in zip(c.accept_len, c.accepted_positions, c.accepted_ranks, c.path_open)]
    assert sum(a > 1 for a, *_ in rows) >= 3 and any(r and r[0] > 1 for _, _, r, _ in rows)
    for a, pos, ranks, is_open in rows:
        assert len(ranks) == a - 1 and all(1 <= r <= 4 for r in ranks)
        if ranks:
            assert ranks[0] == pos[0]
        if a == 1:
            assert is_open
        if a == 4:
            assert not is_open
