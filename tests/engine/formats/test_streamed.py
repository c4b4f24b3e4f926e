"""The layer-streamed forward against the in-memory one and HF transformers, on a sharded tiny
DeepSeek-V3 saved by transformers (MLA + MoE) and a tied-embedding Llama."""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.formats.loader import load_target
from eaglelab.engine.formats.streamed import StreamedTarget, dequantize_fp8
from tests.conftest import random_model, save_hf_dir, tiny_config
from tests.engine.model.test_mla import save_hf

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "one-at-a-time"])
def test_streamed_equals_in_memory_and_hf(prefetch, tmp_path):
    """14 shards of 20 KB: every hidden state equals the in-memory forward bit for bit and HF's to 1e-5;
    the next tokens are HF's argmax; one progress call per layer."""
    hf, path = save_hf(tmp_path, shard="20KB")
    assert len(list(path.glob("model-*.safetensors"))) > 3
    ids = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(0))
    calls = []
    got = StreamedTarget(path, prefetch=prefetch).run(ids, progress=lambda i, n, s: calls.append((i, n)))
    assert calls == [(1, 3), (2, 3), (3, 3)]
    mem = load_target(path, with_tokenizer=False).model.all_hidden_states(ids)
    with torch.no_grad():
        out = hf(ids, output_hidden_states=True)
    assert len(got.hidden_states) == 4
    for i, (a, b, c) in enumerate(zip(got.hidden_states, mem, out.hidden_states)):
        assert torch.equal(a, b), f"hs[{i}] differs from the in-memory forward"
        assert (a - c).abs().max().item() < 1e-5, f"hs[{i}]"
    assert torch.equal(got.next_tokens, out.logits.argmax(-1))
    layer_bytes = sum(p.numel() * 4 for n, p in hf.named_parameters() if n.startswith("model.layers.1."))
    assert 0 < got.peak_bytes < 3 * layer_bytes + 2 * 97 * 32 * 4  # two layers, the embedding and the head


def test_streamed_tied_llama(tmp_path):
    """A dense Llama with tied embeddings (the head is the embedding table)."""
    cfg = tiny_config(tie_word_embeddings=True)
    path = save_hf_dir(random_model(cfg, seed=3, std=0.1), cfg, tmp_path / "llama")
    ids = torch.randint(0, cfg["vocab_size"], (1, 11), generator=torch.Generator().manual_seed(1))
    got = StreamedTarget(path).run(ids)
    model = load_target(path, with_tokenizer=False).model
    for a, b in zip(got.hidden_states, model.all_hidden_states(ids)):
        assert torch.equal(a, b)
    with torch.no_grad():
        assert torch.equal(got.next_tokens, model.logits(model.all_hidden_states(ids)[-1]).argmax(-1))


def test_fp8_block_dequantisation():
    """[200, 300] FP8 with 128-blocks: each block times its own scale (edge blocks partial)."""
    w = (torch.randn(200, 300) * 2).to(torch.float8_e4m3fn)
    scales = torch.rand(2, 3) + 0.5
    got = dequantize_fp8(w, scales)
    for bi in range(2):
        for bj in range(3):
            block = w[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128].float() * scales[bi, bj]
            assert torch.equal(got[bi * 128:(bi + 1) * 128, bj * 128:(bj + 1) * 128], block)


def test_fp8_checkpoint_streams_like_its_dequantised_weights(tmp_path):
    """A checkpoint whose 2-D weights are stored as block FP8 + weight_scale_inv streams to the states
    of the same checkpoint holding the dequantised float32 weights."""
    from safetensors.torch import load_file, save_file

    _, path = save_hf(tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    quant, plain = {}, {}
    for name, t in tensors.items():
        if t.dim() == 2 and name.endswith("proj.weight"):
            scale = t.abs().amax().clamp_min(1e-6).reshape(1, 1) / 200  # one block per small matrix
            q = (t / scale).to(torch.float8_e4m3fn)
            quant[name], quant[name + "_scale_inv"] = q, scale.float()
            plain[name] = dequantize_fp8(q, scale)
        else:
            quant[name] = plain[name] = t
    for d, ts in (("fp8", quant), ("deq", plain)):
        (tmp_path / d).mkdir()
        (tmp_path / d / "config.json").write_text((path / "config.json").read_text())
        save_file(ts, str(tmp_path / d / "model.safetensors"))
    ids = torch.randint(0, 97, (1, 9), generator=torch.Generator().manual_seed(2))
    a, b = StreamedTarget(tmp_path / "fp8").run(ids), StreamedTarget(tmp_path / "deq").run(ids)
    for x, y in zip(a.hidden_states, b.hidden_states):
        assert torch.equal(x, y)
