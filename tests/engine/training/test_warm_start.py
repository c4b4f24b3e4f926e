"""Warm start (``eaglelab train --init-from``): every tensor carries over, draft-head rows follow
their target token across two different draft vocabularies, and a drafter of other taps or shape
is refused with the field named."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.errors import CheckpointError, EagleLabError
from eaglelab.engine.training.draft_vocab import build_draft_vocab
from eaglelab.engine.training.train import TargetHead, drafter_config, new_drafter, save_drafter
from eaglelab.engine.training.warm_start import head_rows, warm_start
from tests.conftest import random_model, tiny_config

VOCAB = 128
CFG = tiny_config(vocab_size=VOCAB)
IDS = [0, 1, 2]

pytestmark = pytest.mark.usefixtures("one_thread")


def vocab(size: int, seed: int):
    """A draft vocabulary of ``size`` tokens from random counts."""
    counts = torch.randint(0, 1000, (VOCAB,), generator=torch.Generator().manual_seed(seed))
    return build_draft_vocab(counts, size)


def drafter(model, size: int, seed: int, init: str = "target"):
    return new_drafter(drafter_config(model.config, 3, size), TargetHead.from_model(model), vocab(size, seed).mapping,
                       seed=seed, init_lm_head=init)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_head_rows_pair_the_same_target_tokens(data):
    old = torch.tensor(data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40, unique=True)))
    new = torch.tensor(data.draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40, unique=True)))
    new_ids, old_ids = head_rows(old, new, VOCAB)
    assert torch.equal(new[new_ids], old[old_ids])  # each pair names one target token
    assert new_ids.numel() == len(set(old.tolist()) & set(new.tolist()))  # every shared token, once
    assert bool((new_ids[1:] > new_ids[:-1]).all())


def test_warm_start_copies_the_body_and_maps_head_rows(tmp_path):
    """Shared tokens keep the old rows; new tokens get the target's rows through the linear map that
    takes the target's rows to the old ones: exact when the old head IS a linear map of the target's."""
    model = random_model(CFG, seed=0)
    old = drafter(model, 96, seed=1, init="random")  # 96 shared-or-old rows >= hidden 64: M is determined
    target = model.lm_head.weight.detach()  # [V, H]
    a = torch.randn(target.shape[1], target.shape[1], generator=torch.Generator().manual_seed(3)) * 0.3
    with torch.no_grad():
        old.lm_head.weight.copy_(target[old.token_map()] @ a)
    save_drafter(old, tmp_path / "old", target=model.config, sglang_layer_ids=IDS, dtype=torch.float32)
    new = drafter(model, 120, seed=2)  # another vocabulary, larger
    ws = warm_start(new, tmp_path / "old", IDS, target)

    for name, p in old.named_parameters():
        if name != "lm_head.weight":
            assert torch.equal(dict(new.named_parameters())[name], p), name
    old_of = {int(t): j for j, t in enumerate(old.token_map())}
    shared = 0
    for j, t in enumerate(new.token_map().tolist()):
        if t in old_of:
            shared += 1
            assert torch.equal(new.lm_head.weight[j], old.lm_head.weight[old_of[t]])
        else:
            torch.testing.assert_close(new.lm_head.weight[j], target[t] @ a, rtol=1e-4, atol=1e-4)
    assert (ws.head_rows_copied, ws.head_rows_new) == (shared, 120 - shared)
    assert 64 <= shared < 120 and ws.map_rel_error < 1e-4


def test_warm_start_same_vocabulary_reproduces_the_drafter(tmp_path):
    model = random_model(CFG, seed=0)
    old = drafter(model, 48, seed=1, init="random")
    save_drafter(old, tmp_path / "old", target=model.config, sglang_layer_ids=IDS, dtype=torch.float32)
    new = drafter(model, 48, seed=1)
    ws = warm_start(new, tmp_path / "old", IDS, model.lm_head.weight)
    assert ws.head_rows_new == 0 and ws.map_rel_error is None
    assert all(torch.equal(a, b) for a, b in zip(new.state_dict().values(), old.state_dict().values()))


def test_warm_start_refuses_other_taps_and_shapes(tmp_path):
    model = random_model(CFG, seed=0)
    old = drafter(model, 48, seed=1)
    save_drafter(old, tmp_path / "old", target=model.config, sglang_layer_ids=IDS, dtype=torch.float32)
    with pytest.raises(CheckpointError, match="other aux layers") as e:
        warm_start(drafter(model, 48, seed=1), tmp_path / "old", [0, 1, 3], model.lm_head.weight)
    assert "eagle_aux_hidden_state_layer_ids" in str(e.value)
    narrow = random_model(tiny_config(vocab_size=VOCAB, intermediate_size=CFG["intermediate_size"] // 2), seed=0)
    with pytest.raises(CheckpointError, match="never narrows") as e:  # a wider MLP widens (test_widen.py)
        warm_start(drafter(narrow, 48, seed=1), tmp_path / "old", IDS, narrow.lm_head.weight)
    assert "intermediate_size" in str(e.value)
    heads = random_model(tiny_config(vocab_size=VOCAB, num_key_value_heads=4), seed=0)
    with pytest.raises(CheckpointError, match="wrong tensor shape") as e:
        warm_start(drafter(heads, 48, seed=1), tmp_path / "old", IDS, heads.lm_head.weight)
    assert "k_proj" in str(e.value)
    with pytest.raises(EagleLabError, match="nothing"):
        warm_start(drafter(model, 48, seed=1), tmp_path / "nothing", IDS, model.lm_head.weight)
