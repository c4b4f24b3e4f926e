"""``capture`` with the target streamed one decoder layer at a time writes the samples of the
in-memory capture: on a sharded tiny DeepSeek-V3 saved by transformers (MLA + MoE) and a sharded
Llama-shaped target."""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.formats.loader import load_target
from eaglelab.engine.formats.specforge_data import list_samples, read_sample
from eaglelab.engine.formats.streamed import StreamedTarget
from eaglelab.engine.training.capture import CaptureSettings, capture, capture_streamed, read_manifest
from tests.conftest import random_model, save_hf_dir, shard_checkpoint, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def _prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


def _captures_agree(path, settings: CaptureSettings, tmp_path, vocab: int) -> None:
    """In-memory capture (the target writes its responses), then the streamed one given those
    responses: every sample equal (ids, mask) and its states within 1e-6 (float32)."""
    model = load_target(path, with_tokenizer=False).model
    prompts = _prompts(5, vocab)
    mem = capture(model, prompts, tmp_path / "mem", settings, eos_token_ids=(2,))
    samples = [read_sample(p) for p in list_samples(tmp_path / "mem")]
    responses = [s.input_ids[len(p):].tolist() for s, p in zip(samples, prompts)]
    layers = []
    got = capture_streamed(StreamedTarget(path), prompts, responses, tmp_path / "st", settings, identity={"name": "t"},
                           layer_progress=lambda i, n, s: layers.append(i))
    assert got.samples == mem.samples == 5 and (got.tokens, got.assistant_tokens) == (mem.tokens, mem.assistant_tokens)
    L = model.config.num_layers
    assert layers == list(range(1, L + 1)) * -(-5 // settings.batch_size)  # one pass over the layers per batch
    for a, b in zip(samples, (read_sample(p) for p in list_samples(tmp_path / "st"))):
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
        assert a.aux_hidden_state.shape == b.aux_hidden_state.shape == (1, a.num_tokens, len(settings.layer_ids) * model.config.hidden_size)
        assert a.aux_hidden_state.abs().max() > 0.1
        assert (a.aux_hidden_state - b.aux_hidden_state).abs().max().item() < 1e-6
        assert (a.hidden_state - b.hidden_state).abs().max().item() < 1e-6
    m_mem, m_st = read_manifest(tmp_path / "mem"), read_manifest(tmp_path / "st")
    for key in ("hf_indices", "sglang_layer_ids", "dtype", "status", "counts"):
        assert m_mem[key] == m_st[key], key


def test_streamed_capture_of_a_sharded_deepseek_v3_equals_the_in_memory_one(tmp_path):
    transformers = pytest.importorskip("transformers")  # noqa: F841 - the fixture saves with it
    from tests.engine.model.test_mla import save_hf

    _, path = save_hf(tmp_path, shard="20KB")
    assert len(list(path.glob("model-*.safetensors"))) > 3
    _captures_agree(path, CaptureSettings(layer_ids=(0, 1), max_new_tokens=6, batch_size=2), tmp_path, 97)


def test_streamed_capture_of_a_sharded_llama_equals_the_in_memory_one(tmp_path):
    cfg = tiny_config()
    path = shard_checkpoint(save_hf_dir(random_model(cfg, seed=3), cfg, tmp_path / "llama"), 3)
    settings = CaptureSettings(layer_ids=(1, 2, 3), convention="vllm", max_new_tokens=8, batch_size=3)
    _captures_agree(path, settings, tmp_path, cfg["vocab_size"])


def test_streamed_run_holds_only_the_states_asked(tmp_path):
    """keep=(1,): hs[1] and hs[L] come back equal to the full pass; the others are empty."""
    cfg = tiny_config()
    path = save_hf_dir(random_model(cfg, seed=4), cfg, tmp_path / "llama")
    ids = torch.randint(0, cfg["vocab_size"], (2, 7), generator=torch.Generator().manual_seed(0))
    full = StreamedTarget(path).run(ids).hidden_states
    some = StreamedTarget(path).run(ids, keep=(1,)).hidden_states
    L = cfg["num_hidden_layers"]
    assert torch.equal(some[1], full[1]) and torch.equal(some[L], full[L])
    assert [some[i].numel() for i in range(L + 1) if i not in (1, L)] == [0] * (L - 1)
