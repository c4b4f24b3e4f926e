"""The wiring probe: slot matching, static + numerical check against the real default target, live check.

The numerical cases use SmolLM2-135M (30 layers, hidden 576) and SpecForge-format data captured
from it at hs[2], hs[15], hs[27] (SpecForge's defaults: SGLang ids [1, 14, 26], vLLM ids
[2, 15, 27]). The target's forward is cached per token batch, so the whole module runs one or two
real forwards.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from eaglelab.engine.formats.draft_checkpoint import expected_tensor_shapes
from eaglelab.engine.formats.draft_export import save_draft_checkpoint, sglang_config, speculators_config
from eaglelab.engine.errors import CheckpointError
from eaglelab.engine.formats.specforge_data import Sample, list_samples, write_sample
from eaglelab.probes.wiring import Tolerance, check_wiring, live_check, match_slots, score

TEXTS = [
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "Paris is the capital of France; Berlin is the capital of Germany; Rome is the capital of Italy.",
    "To make bread you need flour, water, salt and yeast. Knead the dough and let it rise for an hour.",
    "In 1969 astronauts landed on the Moon, and millions of people watched the broadcast on television.",
    "The mitochondria is the powerhouse of the cell, producing energy in the form of ATP molecules.",
    "Please write a short poem about the sea, the wind, and a small boat sailing home at dusk.",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY name ASC LIMIT 10; -- list older users",
]
DEFAULT_HF = (2, 15, 27)


# ---- synthetic matching ------------------------------------------------------------------------------


def test_match_slots_finds_layers_and_margin():
    """Worked example: 5 random "layers" of width 8 over 40 tokens; aux = cat(c3, c1) -> (3, 1)."""
    g = torch.Generator().manual_seed(0)
    cands = [torch.randn(40, 8, generator=g) for _ in range(5)]
    aux = torch.cat([cands[3], cands[1] + 1e-4 * torch.randn(40, 8, generator=g)], dim=-1)  # [40, 16]
    m = match_slots(aux, cands, 8)
    assert [x.matched for x in m] == [3, 1]
    assert m[0].best.similarity == pytest.approx(1.0, abs=1e-9) and m[0].best.rel_error < 1e-9
    assert m[1].best.rel_error < 1e-3 and 0.8 < m[0].margin <= 1.2  # random vectors: runner-up cos ~ 0


def test_match_slots_refuses_near_misses():
    g = torch.Generator().manual_seed(1)
    cands = [torch.randn(64, 16, generator=g) for _ in range(3)]
    noisy = cands[2] + 0.1 * torch.randn(64, 16, generator=g)  # ~10% relative error
    m = match_slots(noisy, cands, 16)[0]
    assert m.matched is None and m.best.label == 2 and 0.05 < m.best.rel_error < 0.2
    assert match_slots(noisy, cands, 16, tol=Tolerance(0.99, 0.2))[0].matched == 2


def test_score_metrics():
    a = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    s = score(a * 1.01, a, 7)
    assert s.label == 7 and s.similarity == pytest.approx(1.0) and s.rel_error == pytest.approx(0.01)


# ---- fixtures from the real default model ---------------------------------------------------------------


@pytest.fixture(scope="module")
def lm():
    from eaglelab.engine.formats.loader import load_target

    return load_target("default", device="cpu", dtype=torch.float32)


class CachedStates:
    """all_hidden_states of a model, memoised per input batch (the module reuses the same tokens)."""

    def __init__(self, model):
        self.model, self.cache, self.calls = model, {}, 0

    def __call__(self, ids):
        key = (tuple(ids.shape), ids.numpy().tobytes())
        if key not in self.cache:
            self.calls += 1
            with torch.inference_mode():
                self.cache[key] = self.model.all_hidden_states(ids)
        return self.cache[key]


@pytest.fixture(scope="module")
def states(lm):
    return CachedStates(lm.model)


def batch_ids(lm) -> tuple[torch.Tensor, list[int]]:
    seqs = [lm.tokenizer.encode(t)[:32] for t in TEXTS]
    lengths = [len(s) for s in seqs]
    ids = torch.zeros(len(seqs), max(lengths), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
    return ids, lengths


def write_data(root: Path, hs, ids, lengths, hf_indices, dtype=torch.bfloat16) -> Path:
    """SpecForge-format samples whose aux slots are hs[i] for i in hf_indices (in that order)."""
    for b, t in enumerate(lengths):
        aux = torch.cat([hs[i][b : b + 1, :t] for i in hf_indices], dim=-1).to(dtype)  # [1, t, n*H]
        write_sample(root, b, Sample(ids[b, :t].clone(), torch.ones(t, dtype=torch.long),
                                     hs[-1][b : b + 1, :t].to(dtype), aux))
    return root


@pytest.fixture(scope="module")
def data(lm, states, tmp_path_factory):
    """Data directories: right (bf16), swapped slots, from perturbed weights, from a bf16 target."""
    root = tmp_path_factory.mktemp("wiring_data")
    ids, lengths = batch_ids(lm)
    hs = states(ids)
    out = {"ids": ids, "lengths": lengths}
    out["right"] = write_data(root / "right", hs, ids, lengths, DEFAULT_HF)
    out["swapped"] = write_data(root / "swapped", hs, ids, lengths, (15, 2, 27))
    out["hs3"] = write_data(root / "hs3", hs, ids, lengths, (3, 16, 28))
    out["perturbed"] = write_data(root / "perturbed", perturbed_states(lm.model, ids), ids, lengths, DEFAULT_HF)
    bf = copy.deepcopy(lm.model).to(torch.bfloat16)  # the same weights run in bf16, as SpecForge usually does
    bf.reset_buffers()
    with torch.inference_mode():
        hb = bf.all_hidden_states(ids[:2, :16])
    out["bf16_target"] = write_data(root / "bf16_target", hb, ids[:2, :16], [min(t, 16) for t in lengths[:2]], DEFAULT_HF)
    return out


def perturbed_states(model, ids):
    """all_hidden_states with layer 0's weights perturbed (20% of each tensor's std), then restored:
    every state after the embedding comes from "another model"."""
    g = torch.Generator().manual_seed(1)
    params = list(model.layers[0].parameters())
    saved = [p.detach().clone() for p in params]
    try:
        with torch.no_grad():
            for p in params:
                p.add_(torch.randn(p.shape, generator=g) * p.std() * 0.2)
        with torch.inference_mode():
            return [h.clone() for h in model.all_hidden_states(ids)]
    finally:
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


def drafter(path: Path, *, ids, num_fc: int = 3, fmt: str = "sglang", target_hidden: int = 576) -> Path:
    """A small random drafter (hidden 64) for SmolLM2's 576-wide states."""
    cfg = sglang_config(hidden_size=64, vocab_size=49152, draft_vocab_size=256, aux_layer_ids=ids, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=128, target_hidden_size=target_hidden)
    if fmt == "speculators":
        cfg = speculators_config(cfg, aux_layer_ids=ids)
    shapes = expected_tensor_shapes(hidden_size=64, aux_hidden_size=target_hidden, num_aux=num_fc, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=49152,
                                    draft_vocab_size=256)
    g = torch.Generator().manual_seed(0)
    tensors = {k: torch.randn(s, generator=g) for k, s in shapes.items() if k not in ("d2t", "t2d")}
    tensors["d2t"] = torch.zeros(256, dtype=torch.long)
    t2d = torch.zeros(49152, dtype=torch.bool)
    t2d[:256] = True
    tensors["t2d"] = t2d
    return save_draft_checkpoint(path, cfg, tensors)


def run(lm, states, draft_dir, data_dir, **kw):
    return check_wiring(draft_dir, target_config=lm.config, hidden_states_fn=states, data_dir=data_dir, **kw)


def slot_layers(report):
    return [s.matched_hf_index for s in report.slots]


# ---- the numerical cases ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_right_wiring(lm, states, data, tmp_path):
    r = run(lm, states, drafter(tmp_path / "d", ids=[1, 14, 26]), data["right"])
    assert r.verdict == "ok" and r.exit_code == 0, r.conclusion
    assert slot_layers(r) == [2, 15, 27] and [s.config_hf_index for s in r.slots] == [2, 15, 27]
    assert all(s.similarity > 0.9999 and s.rel_error < 0.01 and s.margin > 0.01 for s in r.slots)
    assert r.expected_ids == {"sglang": [1, 14, 26], "vllm": [2, 15, 27]}
    assert r.fixes == () and r.final_state.matches and r.final_state.best_hf_index == 30
    j = r.to_json()
    assert j["verdict"] == "ok" and [s["matched_hf_index"] for s in j["slots"]] == [2, 15, 27]
    assert r.data.samples == 8 and r.data.dtype == "bfloat16"


@pytest.mark.slow
def test_data_from_bf16_target_still_matches(lm, states, data, tmp_path):
    r = run(lm, states, drafter(tmp_path / "d", ids=[1, 14, 26]), data["bf16_target"])
    assert r.verdict == "ok" and slot_layers(r) == [2, 15, 27]
    assert all(s.rel_error < 0.04 for s in r.slots)


@pytest.mark.slow
def test_off_by_one_between_conventions(lm, states, data, tmp_path):
    d = drafter(tmp_path / "d", ids=[1, 14, 26])  # SGLang ids, served on vLLM
    r = run(lm, states, d, data["right"], serving="vllm")
    assert r.verdict == "mismatch" and r.exit_code == 1
    assert slot_layers(r) == [2, 15, 27] and [s.config_hf_index for s in r.slots] == [1, 14, 26]
    assert {s.verdict for s in r.slots} == {"wrong layer"}
    assert [(f.field, f.current, f.new) for f in r.fixes] == [("eagle_aux_hidden_state_layer_ids", None, [2, 15, 27])]
    # vLLM ids written into a SGLang config, served on SGLang: taps hs[3, 16, 28]
    r2 = run(lm, states, drafter(tmp_path / "e", ids=[2, 15, 27]), data["right"])
    assert r2.verdict == "mismatch" and [s.config_hf_index for s in r2.slots] == [3, 16, 28]
    assert [(f.field, f.current, f.new) for f in r2.fixes] == [("eagle_config.eagle_aux_hidden_state_layer_ids", [2, 15, 27], [1, 14, 26])]
    assert "other_convention" in {f.code for f in r2.findings}


@pytest.mark.slow
def test_embedding_capture_added(lm, states, data, tmp_path):
    r = run(lm, states, drafter(tmp_path / "d", ids=[-1, 1, 14, 26]), data["right"])
    assert r.verdict == "mismatch" and r.exit_code == 1
    assert {"embedding_capture", "fc_width"} <= {f.code for f in r.findings if f.severity == "error"}
    assert slot_layers(r) == [2, 15, 27] and [s.config_hf_index for s in r.slots] == [0, 2, 15]
    assert r.expected_ids["sglang"] == [1, 14, 26]
    assert r.fixes[0].current == [-1, 1, 14, 26] and r.fixes[0].new == [1, 14, 26]


@pytest.mark.slow
def test_slots_swapped(lm, states, data, tmp_path):
    r = run(lm, states, drafter(tmp_path / "d", ids=[1, 14, 26]), data["swapped"])
    assert r.verdict == "mismatch" and slot_layers(r) == [15, 2, 27]
    assert [s.verdict for s in r.slots] == ["wrong layer", "wrong layer", "ok"]
    assert "layer order" in r.conclusion and r.fixes[0].field == "fc.weight"


@pytest.mark.slow
def test_data_from_other_weights(lm, states, data, tmp_path):
    r = run(lm, states, drafter(tmp_path / "d", ids=[1, 14, 26]), data["perturbed"])
    assert r.verdict == "mismatch" and r.exit_code == 1
    assert slot_layers(r) == [None, None, None] and r.expected_ids is None
    assert all(s.similarity < 0.999 for s in r.slots)
    assert "did not come from this target" in r.conclusion and not r.final_state.matches


@pytest.mark.slow
def test_truncated_data_file(lm, states, data, tmp_path):
    import shutil

    bad = tmp_path / "data"
    shutil.copytree(data["right"], bad)
    victim = list_samples(bad)[3]
    victim.write_bytes(victim.read_bytes()[:500])
    with pytest.raises(CheckpointError) as exc:
        run(lm, states, drafter(tmp_path / "d", ids=[1, 14, 26]), bad)
    assert exc.value.file == str(victim)


@pytest.mark.slow
def test_missing_eagle_config(lm, states, data, tmp_path):
    d = drafter(tmp_path / "d", ids=None)
    r = run(lm, states, d, data["right"])  # engines' defaults = what the data holds
    assert r.verdict == "ok" and "missing_ids" in {f.code for f in r.findings}
    assert r.fixes[0].new == [1, 14, 26] and r.fixes[0].current is None  # make it explicit
    r2 = run(lm, states, d, data["hs3"])  # trained on other layers: the defaults are wrong
    assert r2.verdict == "mismatch" and slot_layers(r2) == [3, 16, 28]
    assert [s.config_hf_index for s in r2.slots] == [2, 15, 27] and r2.expected_ids["sglang"] == [2, 15, 27]


@pytest.mark.slow
def test_fc_width_disagrees_with_ids(lm, states, data, tmp_path):
    r = run(lm, states, drafter(tmp_path / "d", ids=[1, 14, 26], num_fc=4), data["right"])
    assert r.verdict == "mismatch" and r.exit_code == 1
    assert {"fc_width", "data_vs_fc"} <= {f.code for f in r.findings}
    assert slot_layers(r) == [2, 15, 27]  # the taps agree with the data; the weights do not


@pytest.mark.slow
def test_speculators_format_follows_vllm(lm, states, data, tmp_path):
    r = run(lm, states, drafter(tmp_path / "d", ids=[2, 15, 27], fmt="speculators"), data["right"])
    assert r.serving == "vllm" and r.verdict == "ok"
    r2 = run(lm, states, drafter(tmp_path / "e", ids=[2, 15, 27], fmt="speculators"), data["right"], serving="sglang")
    assert r2.verdict == "mismatch" and r2.fixes[0].field == "eagle_config.eagle_aux_hidden_state_layer_ids"


@pytest.mark.slow
def test_one_target_forward_per_token_batch(states):
    """check_wiring runs the target once per check; the module's data share two token batches."""
    assert states.calls == len(states.cache) <= 2


# ---- live check -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_live_check(lm, data):
    """The right engine is the target's own ``taps``; miswired ones tap other HF indices (computed
    from one cached pass per sample, as ``taps`` would)."""
    ok = live_check(lambda ids: lm.model.taps(ids, DEFAULT_HF), data["right"], max_samples=2)
    assert ok.verdict == "ok" and ok.exit_code == 0 and [s.engine_slot for s in ok.slots] == [0, 1, 2]
    assert ok.samples == 2 and all(s.similarity > 0.9999 for s in ok.slots)
    per_sample = CachedStates(lm.model)

    def engine(hf):
        return lambda ids: torch.cat([per_sample(ids)[i] for i in hf], dim=-1)

    emb = live_check(engine((0, 2, 15, 27)), data["right"], max_samples=2)
    assert emb.verdict == "mismatch" and emb.engine_slots == 4 and [s.engine_slot for s in emb.slots] == [1, 2, 3]
    assert "feeds 4 states" in emb.conclusion
    off = live_check(engine((1, 14, 26)), data["right"], max_samples=2)
    assert off.verdict == "mismatch" and [s.engine_slot for s in off.slots] == [None, None, None]
    swapped = live_check(engine((15, 2, 27)), data["right"], max_samples=2)
    assert [s.verdict for s in swapped.slots] == ["wrong slot", "wrong slot", "ok"]
    assert per_sample.calls == 2


def test_live_check_synthetic(tmp_path):
    """No model: the "engine" returns stored states; the data says which it should."""
    g = torch.Generator().manual_seed(0)
    layers = torch.randn(4, 1, 10, 8, generator=g)  # 4 candidate states for 10 tokens
    write_sample(tmp_path, 0, Sample(torch.arange(10), torch.ones(10), layers[3], torch.cat([layers[1], layers[2]], -1)))
    good = live_check(lambda ids: torch.cat([layers[1], layers[2]], -1), tmp_path)
    bad = live_check(lambda ids: torch.cat([layers[0], layers[1]], -1), tmp_path)
    assert good.verdict == "ok" and bad.verdict == "mismatch"
    assert [s.engine_slot for s in bad.slots] == [1, None]


@pytest.mark.slow
def test_data_from_a_model_of_another_width_or_vocab(lm, tmp_path):
    """Caught before any forward: hidden width 64 (not 576), or token ids beyond the vocabulary."""

    def never(ids):
        raise AssertionError("no forward expected")

    d = drafter(tmp_path / "d", ids=[1, 14, 26])
    narrow = tmp_path / "narrow"
    write_sample(narrow, 0, Sample(torch.arange(10), torch.ones(10), torch.randn(1, 10, 64), torch.randn(1, 10, 192)))
    r = check_wiring(d, target_config=lm.config, hidden_states_fn=never, data_dir=narrow)
    assert r.verdict == "mismatch" and r.slots == () and "another model" in r.conclusion
    big = tmp_path / "big"
    write_sample(big, 0, Sample(torch.arange(10) + 60000, torch.ones(10), torch.randn(1, 10, 576), torch.randn(1, 10, 1728)))
    r = check_wiring(d, target_config=lm.config, hidden_states_fn=never, data_dir=big)
    assert r.verdict == "mismatch" and "another tokenizer" in r.conclusion
