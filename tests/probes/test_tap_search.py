"""The tap search without training data: the search itself on known score surfaces, and on the
default model with the shipped drafter (recovers its taps; catches the embedding-added and the
off-by-one configurations)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.probes.tap_search import TapScore, search_taps, start_taps

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
