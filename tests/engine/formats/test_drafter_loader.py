"""load_eagle3: one config per load, and the loaded drafter is the saved one, tensor for tensor."""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.formats import drafter_loader
from eaglelab.engine.training.draft_vocab import build_draft_vocab
from eaglelab.engine.training.train import TargetHead, drafter_config, new_drafter, save_drafter
from tests.conftest import random_model, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 128


def _saved_drafter(tmp_path):
    """-> (the tiny target, a random drafter of it, that drafter saved in float32 with SGLang aux ids [0, 1, 2])."""
    model = random_model(tiny_config(vocab_size=VOCAB), seed=0)
    counts = torch.randint(0, 1000, (VOCAB,), generator=torch.Generator().manual_seed(3))
    net = new_drafter(drafter_config(model.config, 3, 48), TargetHead.from_model(model),
                      build_draft_vocab(counts, 48).mapping, seed=1, init_lm_head="random")
    save_drafter(net, tmp_path / "d", target=model.config, sglang_layer_ids=[0, 1, 2], dtype=torch.float32)
    return model, net, tmp_path / "d"


def test_load_eagle3_builds_the_config_once_and_loads_the_saved_weights(tmp_path, monkeypatch):
    """A random drafter of the tiny target saved in float32 (aux ids [0, 1, 2] in the SGLang convention):
    load_eagle3 reads config.json into an Eagle3Config once, and returns the same tensors and taps hs[1, 2, 3]."""
    model, net, d = _saved_drafter(tmp_path)
    calls = []
    real = drafter_loader.config_from_checkpoint
    monkeypatch.setattr(drafter_loader, "config_from_checkpoint", lambda *a: calls.append(a) or real(*a))
    loaded, taps, _ = drafter_loader.load_eagle3(d, model)

    assert len(calls) == 1
    assert taps == (1, 2, 3) and loaded.config == net.config
    for name, t in net.state_dict().items():
        assert torch.equal(loaded.state_dict()[name].to(t.dtype), t), name


def test_a_tensor_that_fails_validation_is_reported_in_its_shard_with_found_and_expected(tmp_path):
    """A drafter split into two shards with an index, the second holding an up_proj cut to 5 rows: load_eagle3
    names that shard (not config.json), the tensor, the shape found [5, H], the shape the config implies, a fix."""
    import json

    from safetensors.torch import load_file, save_file

    from eaglelab.engine.errors import CheckpointError

    model, _, d = _saved_drafter(tmp_path)
    state = load_file(d / "model.safetensors")
    name = next(k for k in state if k.endswith("mlp.up_proj.weight"))
    expected = list(state[name].shape)
    state[name] = state[name][:5].clone()
    names = sorted(state)
    first = [k for k in names if k != name][: len(names) // 2]
    shards = {"model-00001-of-00002.safetensors": {k: state[k] for k in first},
              "model-00002-of-00002.safetensors": {k: state[k] for k in names if k not in first}}
    for file, part in shards.items():
        save_file(part, d / file)
    (d / "model.safetensors").unlink()
    weight_map = {k: file for file, part in shards.items() for k in part}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    with pytest.raises(CheckpointError) as e:
        drafter_loader.load_eagle3(d, model)
    err = e.value
    assert err.file == str(d / "model-00002-of-00002.safetensors")
    assert err.field == "midlayer.mlp.up_proj.weight"
    assert err.found == [5, expected[1]] and err.expected == expected
    assert err.hint and "config.json" not in str(err).split("\n")[0]


def test_load_eagle3_reads_each_weight_once_and_still_refuses_a_nan(tmp_path, monkeypatch):
    """Loading reads every tensor's data once (values checked as it is read), except the small d2t/t2d maps,
    which the vocab check reads before the weights; a NaN planted in fc.weight is still refused by file and name."""
    from collections import Counter

    from safetensors.torch import load_file, save_file

    from eaglelab.engine.errors import CheckpointError
    from eaglelab.engine.formats import draft_checkpoint

    model, _, d = _saved_drafter(tmp_path)
    reads = Counter()
    real = draft_checkpoint.read_tensor
    monkeypatch.setattr(draft_checkpoint, "read_tensor", lambda info, device: reads.update([info.name]) or real(info, device))
    drafter_loader.load_eagle3(d, model)
    weights = {n: c for n, c in reads.items() if n not in ("d2t", "t2d")}
    assert len(weights) >= 12 and set(weights.values()) == {1}, reads
    assert reads["d2t"] <= 2 and reads["t2d"] <= 2

    state = load_file(d / "model.safetensors")
    state["fc.weight"][0, 3] = float("nan")
    save_file(state, d / "model.safetensors")
    with pytest.raises(CheckpointError) as e:
        drafter_loader.load_eagle3(d, model)
    assert e.value.file == str(d / "model.safetensors") and e.value.field == "fc.weight"
    assert e.value.found == f"1 of {state['fc.weight'].numel()} values"
