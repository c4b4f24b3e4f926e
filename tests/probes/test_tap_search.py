"""The tap search without training data: the search itself on known score surfaces, and on the
default model with the shipped drafter (recovers its taps; catches the embedding-added and the
off-by-one configurations)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.probes.tap_search import TapScore, paired_t, search_taps, start_taps, verdict_from_search

SHIPPED = Path(__file__).resolve().parents[2] / "eaglelab" / "drafters" / "smollm2-135m-eagle3"


@settings(max_examples=40, deadline=None)
@given(true=st.lists(st.integers(0, 11), min_size=3, max_size=3), start=st.lists(st.integers(0, 11), min_size=3, max_size=3),
       weights=st.lists(st.floats(0.1, 3.0), min_size=3, max_size=3))
def test_search_finds_the_minimum_of_a_separable_loss(true, start, weights):
    """A loss that is a weighted sum of per-slot distances is found from any start, in at most 2 passes,
    each slot's runner-up one step from the optimum."""
    def score(taps):
        return TapScore(sum(w * abs(t - u) for w, t, u in zip(weights, taps, true)), 0.0)

    r = search_taps(score, start, range(12))
    assert r.best == tuple(true) and r.passes <= 2
    for s, scores in enumerate(r.slot_scores):
        ru = sorted(scores, key=lambda c: scores[c].loss)[1]
        assert abs(ru - true[s]) == 1


def test_ties_keep_the_start():
    """A flat loss never moves the taps (the config's taps win ties)."""
    r = search_taps(lambda taps: TapScore(1.0, 0.5), (2, 5, 9), range(12))
    assert r.best == (2, 5, 9) and r.passes == 1 and r.evaluations == 1 + 3 * 11


def test_start_taps_fill_and_trim():
    """4 config taps for 3 slots: the first 3; 2 taps: filled from the defaults (2, L//2, L-3)."""
    assert start_taps((0, 2, 15, 27), 3, 30) == (0, 2, 15)
    assert start_taps((5, 9), 3, 30) == (5, 9, 2)
    assert start_taps((), 3, 30) == (2, 15, 27)


class TextScorer:
    """A scorer with known per-text losses: 2 + ``signal`` x (layers away from ``true``, summed over
    slots) + ``noise`` x N(0, 1) drawn per (taps, text), for ``texts`` texts over a 12-layer target."""

    def __init__(self, true, texts, *, signal=0.05, noise=0.0, seed=0):
        self.true, self.k, self.signal, self.noise, self.seed = tuple(true), texts, signal, noise, seed
        self.tp, self.n = SimpleNamespace(num_layers=12), len(true)

    texts_scored = property(lambda self: self.k)
    tokens_scored = property(lambda self: 10 * self.k)

    def per_text(self, taps):
        g = torch.Generator().manual_seed(hash((self.seed, *taps)) % 2**31)
        away = sum(abs(t - u) for t, u in zip(taps, self.true))
        return 2.0 + self.signal * away + self.noise * torch.randn(self.k, generator=g, dtype=torch.float64)

    def __call__(self, taps):
        return TapScore(float(self.per_text(taps).mean()), 0.5)


def judge(scorer, config_hf):
    return verdict_from_search(scorer, serving="sglang", config_ids=tuple(c - 1 for c in config_hf), config_hf=config_hf,
                               fix_file="config.json", fix_field="eagle_aux_hidden_state_layer_ids", fix_current=None,
                               texts=scorer.k)


def test_paired_t_worked_example():
    """Differences (0.05, 0.03, 0.04, 0.04): mean 0.04, sd 0.00816, se 0.00408 -> t 9.80; one text: 0;
    a constant positive difference: inf; none: 0."""
    base = torch.tensor([2.0, 2.0, 2.0, 2.0], dtype=torch.float64)
    assert paired_t(base, base + torch.tensor([0.05, 0.03, 0.04, 0.04], dtype=torch.float64)) == pytest.approx(9.798, abs=1e-3)
    assert paired_t(base[:1], base[:1] + 1) == 0.0
    assert paired_t(base, base + 0.1) == float("inf") and paired_t(base, base) == 0.0


def test_verdict_ok_mismatch_inconclusive_on_known_losses():
    """8 texts with a clean signal: the right config is ok, the off-by-one a mismatch with the fix. The
    same losses on 2 texts: inconclusive both ways, naming the count of texts. A config tap 0.005 nats
    from the best (below min_gain): inconclusive, not ok."""
    ok, wrong = judge(TextScorer((2, 5, 9), 8), (2, 5, 9)), judge(TextScorer((2, 5, 9), 8), (3, 6, 10))
    assert ok.verdict == "ok" and ok.exit_code == 0 and ok.fix is None
    assert [s.contender_t for s in ok.slots] == [float("inf")] * 3 and ok.to_json()["slots"][0]["contender_t"] is None
    assert wrong.verdict == "mismatch" and wrong.exit_code == 1 and wrong.best_hf_indices == (2, 5, 9)
    assert wrong.fix["new"] == [1, 4, 8]
    for cfg in ((2, 5, 9), (3, 6, 10)):
        r = judge(TextScorer((2, 5, 9), 2), cfg)
        assert r.verdict == "inconclusive" and r.exit_code == 4 and r.fix is None
        assert "only 2 text(s)" in r.conclusion
    close = judge(TextScorer((2, 5, 9), 8, signal=0.005), (3, 5, 9))
    assert close.verdict == "inconclusive" and "within 0.01 nats" in close.conclusion


def test_noise_alone_never_gives_a_confident_verdict():
    """No tap better than another, per-text noise 0.05 nats, 8 texts, 40 seeds: the search always finds
    some "best", and the verdict is inconclusive every time (never ok: the config's tap is not separated
    from its neighbours; never mismatch: the selected best does not reach t >= 6)."""
    verdicts = {judge(TextScorer((2, 5, 9), 8, signal=0.0, noise=0.05, seed=s), (2, 5, 9)).verdict for s in range(40)}
    assert verdicts == {"inconclusive"}


def test_a_noisy_slot_is_named_in_the_inconclusive_verdict():
    """Slot 1's signal (0.02 nats a layer) drowns in per-text noise (sd 0.1, centred so the config's tap
    still has the lowest mean loss); slots 0 and 2 are clean: the right config is inconclusive, naming
    slot 1 and its t; slots 0 and 2 are separated."""
    class NoisySlot1(TextScorer):
        def per_text(self, taps):
            z = torch.randn(self.k, generator=torch.Generator().manual_seed(taps[1]), dtype=torch.float64)
            return super().per_text((taps[0], self.true[1], taps[2])) + 0.02 * abs(taps[1] - 5) + 0.1 * (z - z.mean())

    r = judge(NoisySlot1((2, 5, 9), 8), (2, 5, 9))
    assert r.best_hf_indices == (2, 5, 9)
    assert r.verdict == "inconclusive" and "slot 1:" in r.conclusion and "slot 0" not in r.conclusion
    assert r.slots[0].contender_t >= 3 and r.slots[1].contender_t < 3


def _config_with_ids(tmp: Path, name: str, ids: list[int]) -> Path:
    d = tmp / name
    shutil.copytree(SHIPPED, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.slow
def test_default_model_search_recovers_shipped_taps_and_catches_bad_configs(default_target, tmp_path):
    """SmolLM2-135M + the shipped drafter, 8 built-in prompts with 48 response tokens each: the search
    finds hs[2, 15, 27] (SGLang ids [1, 14, 26]) from the shipped config (exit 0), from the off-by-one
    config [2, 15, 27] (= hs[3, 16, 28]) and from the embedding-added config [-1, 1, 14] (= hs[0, 2, 15]),
    both exit 1 with the fix [1, 14, 26]. One target pass serves all three searches."""
    from eaglelab.probes.tap_search import (AgreementScorer, config_taps, default_texts, drafter_for_search, in_memory_pass,
                                            target_texts, verdict_from_search)

    model, tok = default_target.model, default_target.tokenizer
    ck, net = drafter_for_search(SHIPPED, model.embed_tokens, model.config.hidden_size)
    ids, lengths, starts = target_texts(model, default_texts(tok, 8), 48)
    scorer = AgreementScorer(net, in_memory_pass(model, ids, lengths, net.token_map(), starts))
    assert scorer.tokens_scored > 300
    reports = {}
    for name, cfg_ids in (("shipped", None), ("off-by-one", [2, 15, 27]), ("embedding-added", [-1, 1, 14])):
        d = SHIPPED if cfg_ids is None else _config_with_ids(tmp_path, name, cfg_ids)
        ck, _ = drafter_for_search(d, model.embed_tokens, model.config.hidden_size) if cfg_ids else (ck, net)
        got_ids, hf, field, current = config_taps(ck, "sglang", 30, "llama")
        reports[name] = verdict_from_search(scorer, serving="sglang", config_ids=got_ids, config_hf=hf,
                                            fix_file=str(ck.config_file), fix_field=field, fix_current=current, texts=8)
    ok = reports["shipped"]
    assert ok.verdict == "ok" and ok.best_hf_indices == (2, 15, 27) and ok.fix is None
    assert ok.expected_ids == {"sglang": [1, 14, 26], "vllm": [2, 15, 27]}
    assert all(s.margin > 0 for s in ok.slots)
    assert ok.config_hf_indices == (2, 15, 27)
    for name, hf in (("off-by-one", (3, 16, 28)), ("embedding-added", (0, 2, 15))):
        r = reports[name]
        assert r.config_hf_indices == hf
        assert r.verdict == "mismatch" and r.exit_code == 1, name
        assert r.best_hf_indices == (2, 15, 27), name
        assert r.fix["new"] == [1, 14, 26] and r.fix["field"] == "eagle_config.eagle_aux_hidden_state_layer_ids"
        assert r.config_score.loss - r.best_score.loss > 0.1, name
        assert r.config_score.agreement < r.best_score.agreement, name
