"""Capture: the target's own responses and its states, written in SpecForge's offline format with a
manifest; resumable; training prompts built offline and never from MT-bench."""

from __future__ import annotations

import json

import pytest
import torch

from eaglelab.engine.training.capture import (
    CaptureSettings,
    capture,
    read_manifest,
    target_identity,
)
from eaglelab.engine.errors import ConfigError
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.formats.specforge_data import list_samples, read_sample
from eaglelab.engine.training.train_prompts import SOURCES, build_prompts
from tests.conftest import random_model, tiny_config


pytestmark = pytest.mark.usefixtures("one_thread")


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, 96, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


SETTINGS = CaptureSettings(layer_ids=(0, 1, 2), convention="sglang", max_new_tokens=10, batch_size=4)


def test_samples_hold_prompt_response_and_the_states(tmp_path):
    """input_ids = prompt + the target's greedy response; loss_mask 1 exactly on the response;
    hidden_state = the final-normed hidden; aux = hs[1], hs[2], hs[3] (ids 0,1,2 SGLang), concatenated."""
    model = random_model(tiny_config(), seed=3)
    prompts = _prompts(6)
    summary = capture(model, prompts, tmp_path, SETTINGS, eos_token_ids=(2,))
    assert summary.samples == 6 and summary.skipped_existing == 0
    want = Engine(model, eos_token_ids=(2,)).generate(prompts, 10).tokens
    for i, path in enumerate(list_samples(tmp_path)):
        s = read_sample(path)  # weights_only load
        assert path.name == f"data_{i}.ckpt"
        assert s.input_ids.tolist() == prompts[i] + want[i]
        assert s.loss_mask.tolist() == [0] * len(prompts[i]) + [1] * len(want[i])
        hs = model.all_hidden_states(s.input_ids[None])
        assert torch.allclose(s.aux_hidden_state, torch.cat([hs[1], hs[2], hs[3]], -1), atol=1e-5)
        assert torch.allclose(s.hidden_state, hs[4], atol=1e-5)  # hs[L]: after the final norm
        assert s.aux_hidden_state.shape == (1, s.num_tokens, 3 * 64)
    assert summary.tokens == sum(len(p) + len(w) for p, w in zip(prompts, want))
    assert summary.assistant_tokens == sum(len(w) for w in want)


def test_manifest_records_identity_layers_dtype_and_counts(tmp_path):
    model = random_model(tiny_config(), seed=3)
    capture(model, _prompts(5), tmp_path, SETTINGS, eos_token_ids=(2,), chat_template="{{ x }}")
    m = read_manifest(tmp_path)
    assert m["status"] == "complete" and m["format"] == "specforge-offline"
    assert m["layer_ids"] == [0, 1, 2] and m["layer_id_convention"] == "sglang"
    assert m["hf_indices"] == [1, 2, 3] and m["sglang_layer_ids"] == [0, 1, 2]
    assert m["dtype"] == "float32" and m["chat_template"] == "{{ x }}"
    assert m["counts"]["samples"] == 5
    ident = m["target"]
    assert ident == json.loads(json.dumps(target_identity(model)))
    other = target_identity(random_model(tiny_config(), seed=4))
    assert other["weights_sha256"] != ident["weights_sha256"] and other["config_sha256"] == ident["config_sha256"]


def test_vllm_ids_name_the_same_layers(tmp_path):
    """ids [1, 2, 3] in the vLLM convention are hs[1..3]: the same data as SGLang [0, 1, 2]."""
    model = random_model(tiny_config(), seed=3)
    prompts = _prompts(2)
    capture(model, prompts, tmp_path / "a", SETTINGS, eos_token_ids=(2,))
    vllm = CaptureSettings(layer_ids=(1, 2, 3), convention="vllm", max_new_tokens=10, batch_size=4)
    capture(model, prompts, tmp_path / "b", vllm, eos_token_ids=(2,))
    a, b = (read_sample(list_samples(tmp_path / d)[1]) for d in "ab")
    assert torch.equal(a.aux_hidden_state, b.aux_hidden_state)
    assert read_manifest(tmp_path / "b")["sglang_layer_ids"] == [0, 1, 2]


def test_bf16_target_writes_bf16(tmp_path):
    model = random_model(tiny_config(), seed=3).to(torch.bfloat16)
    capture(model, _prompts(2), tmp_path, SETTINGS, eos_token_ids=(2,))
    s = read_sample(list_samples(tmp_path)[0])
    assert s.hidden_state.dtype == torch.bfloat16 and s.aux_hidden_state.dtype == torch.bfloat16
    assert read_manifest(tmp_path)["dtype"] == "bfloat16"


def test_resume_keeps_existing_samples(tmp_path):
    model = random_model(tiny_config(), seed=3)
    prompts = _prompts(8)
    capture(model, prompts[:5], tmp_path, SETTINGS, eos_token_ids=(2,))
    first = list_samples(tmp_path)[2].read_bytes()
    summary = capture(model, prompts, tmp_path, SETTINGS, eos_token_ids=(2,))
    assert summary.skipped_existing == 5 and summary.samples == 8
    assert list_samples(tmp_path)[2].read_bytes() == first


def test_too_long_prompts_are_dropped_not_cut(tmp_path):
    model = random_model(tiny_config(), seed=3)
    s = CaptureSettings(layer_ids=(0, 1, 2), max_new_tokens=10, batch_size=4, max_length=8)
    summary = capture(model, [[5] * 3, [6] * 9], tmp_path, s, eos_token_ids=(2,))
    assert summary.samples == 1 and summary.dropped == 1
    assert read_sample(list_samples(tmp_path)[0]).num_tokens <= 8


@pytest.mark.parametrize("ids,conv", [((-1, 1, 2), "sglang"), ((0, 1, 4), "vllm"), ((1, 1, 2), "sglang")])
def test_bad_layer_ids_are_refused(tmp_path, ids, conv):
    """The embedding output (hs[0]), hs[L] (after the final norm) and duplicates are never taps."""
    model = random_model(tiny_config(), seed=3)
    with pytest.raises(ConfigError, match="layer ids"):
        capture(model, _prompts(1), tmp_path, CaptureSettings(layer_ids=ids, convention=conv), eos_token_ids=(2,))


def test_training_prompts_are_deterministic_and_mixed():
    a, b = build_prompts(300, seed=1), build_prompts(300, seed=1)
    assert [p.text for p in a] == [p.text for p in b]
    assert len({p.text for p in a}) == 300
    assert {p.source for p in a} == set(SOURCES)
    assert [p.text for p in build_prompts(300, seed=2)] != [p.text for p in a]


def test_training_prompts_never_come_from_mtbench(mtbench_prompts):
    """Every MT-bench first turn is absent from the training prompts (the questions are fetched if needed)."""
    questions = {q.strip() for q in mtbench_prompts}
    assert len(questions) == 80
    prompts = {p.text.strip() for p in build_prompts(100_000)}
    assert not (questions & prompts)
