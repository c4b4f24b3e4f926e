"""Layer-id conventions: the off-by-one between SGLang and vLLM, defaults, version notes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.formats.conventions import (
    convert_ids,
    default_hf_indices,
    default_ids,
    engine_taps,
    hf_indices_to_ids,
    id_to_hf_index,
    ids_for_engine,
    ids_to_hf_indices,
    parse_version,
)


def test_sglang_id_is_output_of_layer_k():
    """The 61-layer (Kimi/DeepSeek) case: [2, 30, 58] in SGLang = hs[3], hs[31], hs[59]."""
    assert ids_to_hf_indices([2, 30, 58], "sglang") == (3, 31, 59)
    assert ids_to_hf_indices([2, 30, 58], "vllm") == (2, 30, 58)
    assert ids_to_hf_indices([2, 30, 58], "eagle") == (2, 30, 58)
    assert id_to_hf_index(-1, "sglang") == 0  # the embedding output


def test_convert_between_conventions():
    assert convert_ids([1, 14, 26], "sglang", "vllm") == (2, 15, 27)
    assert convert_ids([2, 15, 27], "vllm", "sglang") == (1, 14, 26)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-1, 200), max_size=6), st.sampled_from(["sglang", "vllm", "eagle"]))
def test_round_trip(ids, conv):
    assert hf_indices_to_ids(ids_to_hf_indices(ids, conv), conv) == tuple(ids)


def test_defaults_for_smollm2():
    """L = 30: both engines tap hs[2], hs[15], hs[27]; SpecForge writes that [1, 14, 26]."""
    assert default_hf_indices(30) == (2, 15, 27)
    assert default_ids(30, "sglang") == (1, 14, 26)
    assert default_ids(30, "vllm") == (2, 15, 27)
    assert default_ids(61, "sglang") == (1, 29, 57)


def test_same_ids_tap_different_layers_per_engine():
    s = engine_taps("sglang", [1, 14, 26], 30, sglang_version="0.5.12")
    v = engine_taps("vllm", [1, 14, 26], 30)
    assert s.hf_indices == (2, 15, 27)
    assert v.hf_indices == (1, 14, 26)
    assert not s.used_defaults and not v.used_defaults


def test_missing_ids_use_defaults():
    for eng in ("sglang", "vllm"):
        t = engine_taps(eng, None, 30)
        assert t.used_defaults and t.hf_indices == (2, 15, 27)
        assert "defaults" in t.notes[0]


def test_embedding_capture_sglang():
    t = engine_taps("sglang", [-1, 1, 14, 26], 30, sglang_version="0.5.12")
    assert t.hf_indices == (0, 2, 15, 27)
    assert t.embedding_captured


def test_out_of_range_ids_are_dropped():
    # SGLang id L-1 would be hs[L], which no layer input is; vLLM id L does not exist.
    s = engine_taps("sglang", [1, 14, 29], 30, sglang_version="0.5.12")
    assert s.hf_indices == (2, 15) and s.dropped_ids == (29,)
    v = engine_taps("vllm", [2, 15, 30], 30)
    assert v.hf_indices == (2, 15) and v.dropped_ids == (30,)
    assert engine_taps("vllm", [-3, 2, 15], 30).dropped_ids == (-3,)


def test_engines_tap_in_layer_order():
    t = engine_taps("vllm", [15, 2, 27], 30)
    assert t.hf_indices == (2, 15, 27)
    assert any("layer order" in n for n in t.notes)


def test_sglang_graph_bug_by_version():
    old = engine_taps("sglang", [4, 14, 26], 30, sglang_version="0.5.10")
    assert old.hf_indices == (5, 15, 27) and old.graph_hf_indices == (2, 15, 27)
    new = engine_taps("sglang", [4, 14, 26], 30, sglang_version="0.5.11")
    assert new.graph_hf_indices is None
    unknown = engine_taps("sglang", [4, 14, 26], 30)
    assert unknown.graph_hf_indices is None and any("PR #22836" in n for n in unknown.notes)
    # the defaults themselves are unaffected
    assert engine_taps("sglang", [1, 14, 26], 30, sglang_version="0.5.9").graph_hf_indices is None


def test_sglang_deepseek_plus_one_rule():
    # ids[0] == 1: +1 on all versions
    assert engine_taps("sglang", [1, 29, 57], 61, family="deepseek_v3", sglang_version="0.5.13").hf_indices == (2, 30, 58)
    # ids[0] != 1: >= 0.5.13 uses them as given, older adds +1
    new = engine_taps("sglang", [2, 30, 58], 61, family="deepseek_v3", sglang_version="0.5.13")
    old = engine_taps("sglang", [2, 30, 58], 61, family="deepseek_v3", sglang_version="0.5.12")
    assert new.hf_indices == (2, 30, 58) and old.hf_indices == (3, 31, 59)
    unknown = engine_taps("sglang", [2, 30, 58], 61, family="deepseek_v3")
    assert unknown.hf_indices == (3, 31, 59) and any("0.5.13" in n for n in unknown.notes)
    # llama family: always +1
    assert engine_taps("sglang", [2, 30, 58], 61, sglang_version="0.5.13").hf_indices == (3, 31, 59)


def test_ids_for_engine_field_precedence():
    both = {"eagle_aux_hidden_state_layer_ids": [2, 15, 27], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}}
    assert ids_for_engine(both, "vllm") == ((2, 15, 27), "eagle_aux_hidden_state_layer_ids")
    assert ids_for_engine(both, "sglang") == ((1, 14, 26), "eagle_config.eagle_aux_hidden_state_layer_ids")
    only_eagle = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}}
    assert ids_for_engine(only_eagle, "vllm")[0] == (1, 14, 26)
    assert ids_for_engine({"eagle_aux_hidden_state_layer_ids": None}, "vllm") == (None, None)


@pytest.mark.parametrize("text,expected", [("0.5.10", (0, 5, 10)), ("v0.5.11.post2", (0, 5, 11)), ("0.5.13rc1", (0, 5, 13)), (None, None), ("main", None)])
def test_parse_version(text, expected):
    assert parse_version(text) == expected
