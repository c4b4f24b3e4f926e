"""GGUF conversion round trip on a small synthetic GGUF written with the gguf package."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.formats.gguf_convert import convert_gguf, permute_qk, unpermute_qk
from eaglelab.engine.formats.loader import load_target
from tests.conftest import random_model, tiny_config

gguf = pytest.importorskip("gguf")


@settings(max_examples=30, deadline=None)
@given(heads=st.integers(1, 6), half=st.integers(1, 8), cols=st.integers(1, 5))
def test_unpermute_inverts_llama_cpp_permutation(heads, half, cols):
    w = torch.randn(heads * 2 * half, cols)
    assert torch.equal(unpermute_qk(permute_qk(w, heads), heads), w)
    if half > 1:
        assert not torch.equal(permute_qk(w, heads), w)


def _write_gguf(path, model, cfg):
    """A GGUF as llama.cpp's converter lays it out: q/k permuted, GGML shapes reversed."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    vocab = [f"t{i}" for i in range(cfg["vocab_size"])]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab)
    w.add_token_types([3 if i < 3 else 1 for i in range(len(vocab))])
    w.add_token_merges(["t 1"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    names = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for name, p in model.named_parameters():
        t = p.detach().clone()
        if name == "embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "norm.weight":
            g = "output_norm.weight"
        elif name == "lm_head.weight":
            g = "output.weight"
        else:
            _, i, rest = name.split(".", 2)
            mod = rest.rsplit(".", 1)[0]
            g = f"blk.{i}.{names[mod]}.weight"
            if mod == "self_attn.q_proj":
                t = permute_qk(t, cfg["num_attention_heads"])
            elif mod == "self_attn.k_proj":
                t = permute_qk(t, cfg["num_key_value_heads"])
        w.add_tensor(g, t.numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_gguf_round_trip_gives_back_the_model(tmp_path):
    cfg = tiny_config()
    model = random_model(cfg, seed=11)
    _write_gguf(tmp_path / "tiny.gguf", model, cfg)
    out = convert_gguf(tmp_path / "tiny.gguf", tmp_path / "hf")
    written = json.loads((out / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size"):
        assert written[key] == cfg[key], key
    back = load_target(out, with_tokenizer=False).model
    for (n1, a), (n2, b) in zip(model.state_dict().items(), back.state_dict().items()):
        assert n1 == n2 and torch.equal(a, b), n1
    tok_cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_cfg["eos_token"] == "t2" and tok_cfg["chat_template"]
