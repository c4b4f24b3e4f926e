"""A wider drafter MLP (``eaglelab train --intermediate-size N``): the size helper equals the real
parameter count and the shipped file's bytes, a warm start into a wider MLP computes exactly what
the old drafter did (float32, before any step), narrowing and other shapes are refused with the field
named, the exported config carries the width our loader and engine read, and --max-size-mb refuses a
drafter over budget naming both knobs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from eaglelab.engine.errors import CheckpointError, ConfigError
from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint
from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.eagle3 import Eagle3Network
from eaglelab.engine.formats.drafter_loader import config_from_checkpoint, load_eagle3
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.engine.training.draft_vocab import build_draft_vocab
from eaglelab.engine.training.train import (
    TargetHead,
    check_size_budget,
    drafter_config,
    drafter_size,
    drafter_size_bytes,
    new_drafter,
    save_drafter,
)
from eaglelab.engine.training.ttt import TrainBatch, target_probs, ttt_forward, ttt_hidden
from eaglelab.engine.training.warm_start import DOWN, GATE, UP, WIDEN_STD, warm_start, widen_mlp
from tests.conftest import capture_tiny, random_model, tiny_config

VOCAB = 128
CFG = tiny_config(vocab_size=VOCAB)  # hidden 64, intermediate 128
IDS, TAPS = [0, 1, 2], (1, 2, 3)
OLD_I, NEW_I = CFG["intermediate_size"], 200
SHIPPED = Path(__file__).resolve().parents[3] / "eaglelab" / "drafters" / "smollm2-135m-eagle3"

pytestmark = pytest.mark.usefixtures("one_thread")


def vocab(size: int, seed: int):
    counts = torch.randint(0, 1000, (VOCAB,), generator=torch.Generator().manual_seed(seed))
    return build_draft_vocab(counts, size)


def drafter(model, size: int, seed: int, intermediate: int | None = None, init: str = "target"):
    return new_drafter(drafter_config(model.config, 3, size, intermediate), TargetHead.from_model(model),
                       vocab(size, seed).mapping, seed=seed, init_lm_head=init)


def logits(net, model, ids):
    """The engine's draft-extend over ``ids``: draft logits [1, T, V_draft]."""
    with torch.no_grad():
        return net(ids, net.fuse(model.taps(ids, TAPS)), torch.arange(ids.shape[1])[None])[1]


@pytest.fixture
def old_and_wide(tmp_path):
    """A random drafter of the tiny target (intermediate 128) saved in float32, and a drafter of the
    same vocabulary warm-started from it into intermediate 200."""
    model = random_model(CFG, seed=0)
    old = drafter(model, 48, seed=1, init="random")
    save_drafter(old, tmp_path / "old", target=model.config, sglang_layer_ids=IDS, dtype=torch.float32)
    wide = drafter(model, 48, seed=1, intermediate=NEW_I)
    ws = warm_start(wide, tmp_path / "old", IDS, model.lm_head.weight, seed=5)
    return model, old.eval(), wide.eval(), ws


# ---- the size helper ---------------------------------------------------------------------------------


@pytest.mark.parametrize("intermediate,draft_vocab,num_aux", [(128, 48, 3), (200, 96, 3), (64, 128, 2), (1, 1, 1)])
def test_size_helper_equals_a_built_drafter(intermediate, draft_vocab, num_aux):
    cfg = drafter_config(random_model(CFG).config, num_aux, draft_vocab, intermediate)
    net = Eagle3Network(cfg, torch.nn.Embedding(VOCAB, CFG["hidden_size"]))
    for dtype in (torch.bfloat16, torch.float32):
        size = drafter_size(cfg, dtype)
        assert size.parameters == sum(p.numel() for p in net.parameters())
        assert size.bytes == drafter_size_bytes(net, dtype)


def test_size_helper_equals_the_shipped_drafter_files():
    """The shipped drafter (intermediate 1536, 12,288 draft tokens): the bytes its safetensors hold
    (its files less their headers) and the parameters its training card names."""
    ck = read_draft_checkpoint(SHIPPED)
    width = {"BF16": 2, "F32": 4, "I64": 8, "BOOL": 1}
    held = sum(width[t.dtype] * int(torch.Size(t.shape).numel()) for t in ck.tensors.values())
    files = sum(f.stat().st_size for f in ck.weight_files)
    size = drafter_size(config_from_checkpoint(ck, ck.hidden_size), torch.bfloat16)
    card = json.loads((SHIPPED / "eaglelab_training.json").read_text())
    assert size.bytes == held == card["size_bytes"] == 24_482_304
    assert 0 < files - size.bytes < 4096  # the safetensors headers
    assert size.parameters == card["parameters"] == 12_167_424


# ---- widening keeps the function ---------------------------------------------------------------------


def test_widen_mlp_worked_example():
    gate, up, down = torch.arange(4.0).view(2, 2), 10 + torch.arange(4.0).view(2, 2), 20 + torch.arange(4.0).view(2, 2)
    g, u, d = widen_mlp(gate, up, down, 3, seed=0, std=1.0)
    assert (g.shape, u.shape, d.shape) == ((3, 2), (3, 2), (2, 3))
    assert torch.equal(g[:2], gate) and torch.equal(u[:2], up) and torch.equal(d[:, :2], down)
    assert torch.equal(d[:, 2], torch.zeros(2)) and bool((g[2] != 0).all()) and bool((u[2] != 0).all())
    again = widen_mlp(gate, up, down, 3, seed=0, std=1.0)
    other = widen_mlp(gate, up, down, 3, seed=1, std=1.0)
    assert torch.equal(again[0], g) and not torch.equal(other[0], g)


def test_widened_drafter_has_the_old_units_first_and_zero_new_columns(old_and_wide):
    _, old, wide, ws = old_and_wide
    p_old, p_new = dict(old.named_parameters()), dict(wide.named_parameters())
    assert p_new[GATE].shape == (NEW_I, 64) and p_new[DOWN].shape == (64, NEW_I)
    assert torch.equal(p_new[GATE][:OLD_I], p_old[GATE]) and torch.equal(p_new[UP][:OLD_I], p_old[UP])
    assert torch.equal(p_new[DOWN][:, :OLD_I], p_old[DOWN])
    assert int(p_new[DOWN][:, OLD_I:].count_nonzero()) == 0
    std = float(p_new[GATE][OLD_I:].detach().std())
    assert 0.8 * WIDEN_STD < std < 1.2 * WIDEN_STD, std
    gen = torch.Generator().manual_seed(5)
    assert torch.equal(p_new[GATE][OLD_I:], torch.randn(NEW_I - OLD_I, 64, generator=gen) * WIDEN_STD)  # --seed 5
    assert (ws.intermediate_from, ws.intermediate_size, ws.widen_seed, ws.widen_std) == (OLD_I, NEW_I, 5, WIDEN_STD)
    assert ws.widened and ws.head_rows_new == 0


def test_widened_drafter_computes_the_old_logits_before_any_step(old_and_wide):
    """Float32, the engine's draft-extend and every TTT step (the drafter fed its own outputs): the
    widened drafter's outputs equal the old drafter's to rounding (the new units add exact zeros)."""
    model, old, wide, _ = old_and_wide
    ids = torch.randint(3, VOCAB, (2, 11), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(logits(wide, model, ids), logits(old, model, ids), rtol=1e-6, atol=1e-6)
    aux = model.taps(ids, TAPS)
    with torch.no_grad():
        for a, b in zip(ttt_hidden(wide, ids, aux, 4), ttt_hidden(old, ids, aux, 4)):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_new_units_learn_through_their_down_columns_first(old_and_wide):
    """At step 0 the TTT loss is the old drafter's; its gradient reaches the new down_proj columns
    (the new units are live), not yet the new gate/up rows (their down columns are zero)."""
    model, old, wide, _ = old_and_wide
    ids = torch.randint(3, VOCAB, (2, 11), generator=torch.Generator().manual_seed(3))
    aux = model.taps(ids, TAPS)
    hidden = torch.randn(2, 11, 64, generator=torch.Generator().manual_seed(4))
    batch = TrainBatch(ids, torch.ones(2, 11), aux.detach(), hidden)
    losses = []
    for net in (old, wide):
        probs = target_probs(model.lm_head.weight.detach()[net.token_map()], hidden)
        res = ttt_forward(net, batch, probs, 3)
        (0.8 ** torch.arange(3.0) * res.step_loss).sum().backward()
        losses.append(res.step_loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    p = dict(wide.named_parameters())
    assert float(p[DOWN].grad[:, OLD_I:].abs().sum()) > 0
    assert float(p[GATE].grad[OLD_I:].abs().sum()) == 0 and float(p[UP].grad[OLD_I:].abs().sum()) == 0


# ---- what is refused ---------------------------------------------------------------------------------


def test_a_narrower_mlp_than_the_init_is_refused(tmp_path):
    model = random_model(CFG, seed=0)
    save_drafter(drafter(model, 48, seed=1), tmp_path / "old", target=model.config, sglang_layer_ids=IDS)
    with pytest.raises(CheckpointError, match="never narrows") as e:
        warm_start(drafter(model, 48, seed=1, intermediate=96), tmp_path / "old", IDS, model.lm_head.weight)
    err = e.value
    assert err.field == "intermediate_size" and err.found == OLD_I and "--intermediate-size" in str(err.expected)
    assert str(err.file).endswith("config.json") and f"--intermediate-size {OLD_I}" in err.hint


def test_other_shapes_than_the_mlp_width_are_still_refused(tmp_path):
    model = random_model(CFG, seed=0)
    save_drafter(drafter(model, 48, seed=1), tmp_path / "old", target=model.config, sglang_layer_ids=IDS)
    heads = random_model(tiny_config(vocab_size=VOCAB, num_key_value_heads=4), seed=0)
    with pytest.raises(CheckpointError, match="wrong tensor shape") as e:
        warm_start(drafter(heads, 48, seed=1, intermediate=NEW_I), tmp_path / "old", IDS, heads.lm_head.weight)
    assert e.value.field == "midlayer.self_attn.k_proj.weight" and (e.value.found, e.value.expected) == ([32, 128], [64, 128])


# ---- the exported drafter in our loader and engine ---------------------------------------------------


def test_a_wider_drafter_loads_from_its_config_and_speculates_losslessly(tmp_path, old_and_wide):
    model, _, wide, _ = old_and_wide
    out = save_drafter(wide, tmp_path / "wide", target=model.config, sglang_layer_ids=IDS, dtype=torch.float32)
    assert json.loads((out / "config.json").read_text())["intermediate_size"] == NEW_I
    ck = read_draft_checkpoint(out)
    assert ck.intermediate_size == NEW_I and [f for f in ck.validate(model.config) if f.severity != "info"] == []
    net, taps, _ = load_eagle3(out, model)
    assert taps == TAPS and net.config.intermediate_size == NEW_I
    ids = torch.randint(3, VOCAB, (1, 9), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(logits(net, model, ids), logits(wide, model, ids), rtol=0, atol=0)
    prompts = [ids[0, :5].tolist(), ids[0, 2:9].tolist()]
    spec = SpecConfig("eagle3", num_steps=3, topk=1)
    plain = Engine(model, eos_token_ids=(2,)).generate(prompts, 16).tokens
    fast = Engine(model, eos_token_ids=(2,), drafter=Eagle3Drafter(net, spec, taps), spec=spec).generate(prompts, 16)
    assert fast.tokens == plain


# ---- the size budget ---------------------------------------------------------------------------------


def test_size_budget_refusal_names_both_knobs_and_pairs_that_fit():
    """A budget one byte short of (intermediate 200, draft vocabulary 2048) of a 4096-token target:
    refused; the pairs offered are the widest MLP (128) at 2048 tokens and the largest vocabulary
    (1792) at width 200, each the largest of its step (128, 256) that fits."""
    target = ModelConfig.from_dict(tiny_config(vocab_size=4096))
    cfg = drafter_config(target, 3, 2048, NEW_I)
    size = drafter_size(cfg)
    assert check_size_budget(cfg, size.bytes / 1e6) == size  # exactly at the budget: fits
    budget = (size.bytes - 1) / 1e6
    with pytest.raises(ConfigError, match="--max-size-mb") as e:
        check_size_budget(cfg, budget)
    text = str(e.value)
    assert "--intermediate-size" in text and "--draft-vocab-size" in text and f"{size.mb:.2f} MB" in text
    pairs = [(int(i), int(v)) for i, v in re.findall(r"--intermediate-size (\d+) --draft-vocab-size (\d+)", e.value.hint)]
    assert pairs == [(128, 2048), (NEW_I, 1792)]
    for (i, v), (di, dv) in zip(pairs, ((128, 0), (0, 256))):
        assert drafter_size(drafter_config(target, 3, v, i)).bytes <= budget * 1e6
        assert drafter_size(drafter_config(target, 3, v + dv, i + di)).bytes > budget * 1e6


def test_shipped_shape_against_the_25_mb_budget():
    """SmolLM2-135M's drafter shape: intermediate 2816 with 8,192 draft tokens fits 25 MB; 2816 with
    12,288 does not, and the refusal offers 1664 x 12288 and 2816 x 8704."""
    ck = read_draft_checkpoint(SHIPPED)
    shipped = config_from_checkpoint(ck, ck.hidden_size)
    from dataclasses import replace

    assert check_size_budget(replace(shipped, intermediate_size=2816, draft_vocab_size=8192), 25).bytes == 24_154_624
    with pytest.raises(ConfigError) as e:
        check_size_budget(replace(shipped, intermediate_size=2816), 25)
    assert "--intermediate-size 1664 --draft-vocab-size 12288" in e.value.hint
    assert "--intermediate-size 2816 --draft-vocab-size 8704" in e.value.hint


# ---- end to end through the CLI -----------------------------------------------------------------------


def test_train_widens_a_trained_drafter_through_the_cli(tmp_path, capsys):
    """`eaglelab train` twice on captured data: a drafter at the target's width (128), then one
    warm-started from it at --intermediate-size 192 (the config, card and loader say 192); a budget
    too small and a narrower width are refused with exit 2 and the knobs named."""
    from eaglelab.cli import main

    model = random_model(CFG, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    data = capture_tiny(model, CFG, tmp_path, VOCAB)
    common = ["train", "--data", str(data), "--epochs", "1", "--batch-size", "4", "--ttt-length", "2",
              "--draft-vocab-size", "32", "--device", "cpu", "--save-dtype", "float32", "--checkpoint-every", "0"]
    assert main(common + ["--out", str(tmp_path / "base")]) == 0
    capsys.readouterr()
    assert main(common + ["--out", str(tmp_path / "wide"), "--init-from", str(tmp_path / "base"),
                          "--intermediate-size", "192", "--max-size-mb", "1", "--seed", "7"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "MLP widened 128 -> 192" in err and "intermediate 192, draft vocabulary 32" in err
    assert json.loads((tmp_path / "wide" / "config.json").read_text())["intermediate_size"] == 192
    card = json.loads((tmp_path / "wide" / "eaglelab_training.json").read_text())
    init = card["init_from"]
    assert (init["intermediate_from"], init["intermediate_size"], init["widen_seed"]) == (128, 192, 7)
    net, _, _ = load_eagle3(tmp_path / "wide", model)
    assert net.config.intermediate_size == 192 and card["parameters"] == drafter_size(net.config).parameters

    rc = main(common + ["--out", str(tmp_path / "big"), "--intermediate-size", "4096", "--max-size-mb", "0.5"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "--max-size-mb" in err and "--intermediate-size" in err and "--draft-vocab-size" in err
    assert "these fit" in err and not (tmp_path / "big").exists()
    rc = main(common + ["--out", str(tmp_path / "narrow"), "--init-from", str(tmp_path / "wide"),
                        "--intermediate-size", "128"])
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 2 and "never narrows" in err and "--intermediate-size 192" in err
