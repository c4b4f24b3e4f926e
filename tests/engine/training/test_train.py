"""EAGLE-3 training: TTT equals the engine's draft path, the loss falls, the trained drafter beats
a random one in the engine, checkpoints resume to the identical state, and the output format
round-trips through our loader (and the speculators converter when it is installed)."""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from eaglelab.engine.errors import CheckpointError
from eaglelab.engine.training.capture import CaptureSettings, capture
from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint
from eaglelab.engine.training.draft_vocab import build_draft_vocab, scan_data
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.formats.drafter_loader import load_eagle3
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.engine.formats.specforge_data import write_sample
from eaglelab.engine.training.train import (
    SampleSet,
    TargetHead,
    TrainConfig,
    Trainer,
    cosine_with_warmup,
    drafter_config,
    latest_checkpoint,
    new_drafter,
    save_drafter,
)
from eaglelab.engine.training.ttt import TrainBatch, target_probs, ttt_forward, ttt_mask
from tests.engine.training.ttt_reference import assert_ttt_is_network_chain
from tests.conftest import add_word_tokenizer, random_model, save_hf_dir, tiny_config

VOCAB, DRAFT_VOCAB = 128, 64
CFG = tiny_config(vocab_size=VOCAB)
IDS, TAPS = (0, 1, 2), (1, 2, 3)  # SGLang ids of the 4-layer tiny target and the HF indices they name


pytestmark = pytest.mark.usefixtures("one_thread")


def sharp_target(seed: int = 0):
    """A tiny random target with a peaked next-token distribution (a learnable teacher)."""
    model = random_model(CFG, seed=seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model


def prompts(n: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (int(torch.randint(4, 10, (1,), generator=g)),), generator=g).tolist() for _ in range(n)]


def make_data(model, path, n: int, max_new: int = 32):
    capture(model, prompts(n), path, CaptureSettings(IDS, max_new_tokens=max_new, batch_size=16), eos_token_ids=(2,))
    counts, lengths = scan_data(path, VOCAB)
    return SampleSet(path, lengths), build_draft_vocab(counts, DRAFT_VOCAB)


def fresh(model, vocab, seed: int = 0, init: str = "target"):
    return new_drafter(drafter_config(model.config, 3, DRAFT_VOCAB), TargetHead.from_model(model), vocab.mapping,
                       seed=seed, init_lm_head=init)


def mean_accept(model, net, ps) -> float:
    net.eval()
    spec = SpecConfig("eagle3", num_steps=4, topk=1)
    res = Engine(model, eos_token_ids=(2,), drafter=Eagle3Drafter(net, spec, TAPS), spec=spec).generate(ps, 32)
    return res.mean_accept_len


# ---- the TTT forward -------------------------------------------------------------------------------


def test_ttt_mask_worked_example():
    m = ttt_mask(3, 2, "cpu").int().tolist()
    assert m == [[1, 0, 0, 1, 0, 0], [1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 1]]


def test_ttt_steps_equal_the_engine_draft_path():
    """Step i at anchor p = the drafter's forward (the engine's call) with a KV cache holding the
    draft-extend keys of positions <= p and the chain's own keys, at position p + i."""
    model = random_model(CFG, seed=5)
    vocab = build_draft_vocab(torch.arange(VOCAB), DRAFT_VOCAB)
    net = fresh(model, vocab, seed=1, init="random")
    with torch.no_grad():
        for name, p in net.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0, 0.15)
    net.eval()
    assert_ttt_is_network_chain(net, model, TAPS)


def _restricted_head():
    """A tiny target, its lm_head rows of a draft vocabulary, and hidden states to read through them."""
    model = random_model(CFG, seed=2)
    vocab = build_draft_vocab(torch.arange(VOCAB) % 7, DRAFT_VOCAB)
    return model, vocab, model.lm_head.weight[vocab.target_ids], torch.randn(2, 5, 64)


def test_target_distribution_is_restricted_and_renormalised():
    model, vocab, rows, hidden = _restricted_head()
    got = target_probs(rows, hidden)
    full = torch.softmax(model.logits(hidden), -1)[..., vocab.target_ids]
    assert torch.allclose(got, full / full.sum(-1, keepdim=True), atol=1e-6)


def test_a_sharper_target_squares_the_probabilities_and_keeps_the_argmax():
    """--target-temperature 0.5: each restricted, renormalised probability squared and renormalised again."""
    _, _, rows, hidden = _restricted_head()
    p = target_probs(rows, hidden)
    sharp = target_probs(rows, hidden, 0.5)
    assert torch.allclose(sharp, p * p / (p * p).sum(-1, keepdim=True), atol=1e-6)
    assert torch.equal(sharp.argmax(-1), p.argmax(-1))
    assert (sharp.max(-1).values > p.max(-1).values).all()


def test_the_trainer_matches_the_sharpened_target(tmp_path):
    """A trainer with target_temperature 0.5 takes its first step on the loss against the sharpened distribution
    (the same drafter, batch and step weights computed here by hand), not the plain one."""
    model = sharp_target(seed=1)
    data, vocab = make_data(model, tmp_path / "d", 8, max_new=12)
    cfg = TrainConfig(epochs=1, lr=1e-2, batch_size=4, ttt_length=3, checkpoint_every=0, log_every=1,
                      target_temperature=0.5)
    trainer = Trainer(fresh(model, vocab), TargetHead.from_model(model), data, cfg)
    batch = data.load([0, 1, 2, 3], cfg.max_length, cfg.pad_multiple)
    before = copy.deepcopy(trainer.net)
    weights = torch.tensor(cfg.step_weights())
    with torch.no_grad():
        b = batch.to(trainer.device)
        expect = {t: (weights * ttt_forward(before, b, target_probs(trainer.head_rows, b.hidden, t), 3).step_loss).sum()
                  for t in (0.5, 1.0)}
    _, loss, _ = trainer.train_step(batch)
    assert loss.item() == pytest.approx(expect[0.5].item(), rel=1e-5)
    assert abs(expect[0.5].item() - expect[1.0].item()) > 1e-3 * expect[1.0].item()


def test_positions_without_loss_mask_do_not_count():
    """Loss and accuracy only where the predicted token (p + i + 2) has loss_mask 1."""
    model = random_model(CFG, seed=2)
    vocab = build_draft_vocab(torch.arange(VOCAB), DRAFT_VOCAB)
    net = fresh(model, vocab)
    ids = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(3))
    aux = model.taps(ids, TAPS)
    hidden, _ = model(ids, torch.arange(8)[None])
    mask = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1]], dtype=torch.float32)
    probs = target_probs(model.lm_head.weight[vocab.target_ids], hidden)
    res = ttt_forward(net, TrainBatch(ids, mask, aux, hidden), probs, 3)
    # step i predicts tokens 2+i .. 7: counted where the token index >= 5
    assert res.step_count.tolist() == [3.0, 3.0, 3.0]
    res0 = ttt_forward(net, TrainBatch(ids, torch.zeros_like(mask), aux, hidden), probs, 3)
    assert res0.step_count.tolist() == [0.0, 0.0, 0.0] and res0.step_loss.abs().sum() == 0


# ---- training ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A drafter trained for 120 steps on 48 greedy responses of the sharp tiny target."""
    torch.set_num_threads(1)
    model = sharp_target()
    data, vocab = make_data(model, tmp_path_factory.mktemp("data"), 48)
    net = fresh(model, vocab)
    untrained = copy.deepcopy(net)
    untrained._embed = [model.embed_tokens]
    cfg = TrainConfig(epochs=20, lr=1e-2, batch_size=8, ttt_length=3, log_every=6, checkpoint_every=0, warmup_ratio=0.05)
    trainer = Trainer(net, TargetHead.from_model(model), data, cfg)
    result = trainer.train()
    return model, trainer, untrained, result, vocab


def test_loss_falls_and_accuracy_rises(trained):
    _, trainer, _, result, _ = trained
    first, last = result.logs[0], result.logs[-1]
    assert result.steps == trainer.total_steps == 120
    assert last.loss < 0.3 * first.loss, (first.loss, last.loss)
    assert all(a_end > a_start + 0.3 for a_start, a_end in zip(first.step_acc, last.step_acc))


def test_trained_drafter_beats_a_random_one_in_the_engine(trained):
    """Mean accepted length (bonus included) on the training prompts, greedy, 4-step chains."""
    model, trainer, untrained, _, _ = trained
    random_init = fresh(model, build_draft_vocab(torch.ones(VOCAB), DRAFT_VOCAB), seed=7, init="random")
    ps = prompts(48)[:16]
    got = mean_accept(model, trainer.net, ps)
    assert got > 1.7
    assert got > mean_accept(model, untrained, ps) + 0.6
    assert got > mean_accept(model, random_init, ps) + 0.6


def test_speculation_with_the_trained_drafter_stays_lossless(trained):
    model, trainer, _, _, _ = trained
    ps = prompts(48)[:8]
    spec = SpecConfig("eagle3", num_steps=4, topk=1)
    plain = Engine(model, eos_token_ids=(2,)).generate(ps, 32).tokens
    trainer.net.eval()
    fast = Engine(model, eos_token_ids=(2,), drafter=Eagle3Drafter(trainer.net, spec, TAPS), spec=spec).generate(ps, 32)
    assert fast.tokens == plain


def _trainer(model, data, vocab, ck_dir, max_steps=None):
    cfg = TrainConfig(epochs=2, lr=1e-2, batch_size=4, ttt_length=3, checkpoint_every=3, max_steps=max_steps,
                      log_every=1, warmup_ratio=0.2)
    return Trainer(fresh(model, vocab), TargetHead.from_model(model), data, cfg, checkpoint_dir=ck_dir)


def test_resume_gives_the_same_state_as_not_stopping(tmp_path):
    """16 samples, batch 4, 2 epochs = 8 steps: straight through, or stopped at step 6 (mid-epoch,
    after a checkpoint) and resumed in a fresh trainer: identical weights, optimizer and schedule."""
    model = sharp_target(seed=1)
    data, vocab = make_data(model, tmp_path / "d", 16, max_new=12)
    straight = _trainer(model, data, vocab, tmp_path / "a")
    straight.train()
    first = _trainer(model, data, vocab, tmp_path / "b", max_steps=6)
    first.train()
    ck = latest_checkpoint(tmp_path / "b")
    assert ck is not None and ck.name == "step_00000006.pt"
    resumed = _trainer(model, data, vocab, tmp_path / "b")
    resumed.load_checkpoint(ck)
    assert (resumed.step, resumed.epoch, resumed.batch_in_epoch) == (6, 1, 2)
    resumed.train()
    assert resumed.step == straight.step == 8
    for k, v in straight.net.state_dict().items():
        assert torch.equal(v, resumed.net.state_dict()[k]), k
    sa, sb = straight.opt.state_dict()["state"], resumed.opt.state_dict()["state"]
    for i in sa:
        assert torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) and torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"])
    assert straight.sched.state_dict()["last_epoch"] == resumed.sched.state_dict()["last_epoch"] == 8
    assert straight.sched.get_last_lr() == resumed.sched.get_last_lr()


@pytest.mark.parametrize("change,flag", [({"batch_size": 2}, "--batch-size"), ({"seed": 1}, "--seed"),
                                         ({"lr": 5e-3}, "--lr"), ({"warmup_ratio": 0.5}, "--warmup-ratio"),
                                         ({"target_temperature": 0.5}, "--target-temperature")])
def test_resume_with_another_batch_order_or_lr_is_refused(tmp_path, change, flag):
    """A run of batch 4 stopped at step 3 (mid-epoch 0): resuming it with batch 2 or another seed (both
    change which samples batches 3.. of the epoch hold: some would train twice, others never), another
    --lr or --warmup-ratio (the LR would jump) or another --target-temperature (the loss would change halfway) is
    refused, naming the checkpoint, the flag and both values."""
    model = sharp_target(seed=1)
    data, vocab = make_data(model, tmp_path / "d", 16, max_new=12)
    _trainer(model, data, vocab, tmp_path / "b", max_steps=3).train()
    ck = latest_checkpoint(tmp_path / "b")
    cfg = TrainConfig(**{**dict(epochs=2, lr=1e-2, batch_size=4, ttt_length=3, checkpoint_every=3, log_every=1,
                                warmup_ratio=0.2), **change})
    resumed = Trainer(fresh(model, vocab), TargetHead.from_model(model), data, cfg, checkpoint_dir=tmp_path / "b")
    with pytest.raises(CheckpointError) as err:
        resumed.load_checkpoint(ck)
    saved = {"batch_size": 4, "seed": 0, "lr": 1e-2, "warmup_ratio": 0.2, "target_temperature": 1.0}[next(iter(change))]
    assert (err.value.file, err.value.field, err.value.found, err.value.expected) == (
        str(ck), flag, next(iter(change.values())), saved)
    assert resumed.step == 0  # nothing restored


@pytest.mark.parametrize("change", [{"epochs": 3}, {"total_steps": 5}])
def test_resume_may_replan_the_runs_length(tmp_path, change):
    """A time-limited run re-plans where its cosine ends when it resumes (8 steps planned, 3 done): the batch
    order and the state stay the checkpoint's, the schedule is the new length's, and the trainer says so."""
    model = sharp_target(seed=1)
    data, vocab = make_data(model, tmp_path / "d", 16, max_new=12)
    first = _trainer(model, data, vocab, tmp_path / "b", max_steps=3)
    first.train()
    cfg = TrainConfig(**{**dict(epochs=2, lr=1e-2, batch_size=4, ttt_length=3, checkpoint_every=3, log_every=1,
                                warmup_ratio=0.2), **change})
    resumed = Trainer(fresh(model, vocab), TargetHead.from_model(model), data, cfg, checkpoint_dir=tmp_path / "b")
    resumed.load_checkpoint(latest_checkpoint(tmp_path / "b"))
    now = change.get("total_steps") or 3 * 4
    assert (resumed.step, resumed.batch_in_epoch, resumed.replanned) == (3, 3, (8, now))
    assert all(torch.equal(a, b) for a, b in zip(first.net.state_dict().values(), resumed.net.state_dict().values()))
    resumed.train()
    assert resumed.step == now
    warmup = int(0.2 * now)
    assert resumed.sched.get_last_lr()[0] == pytest.approx(1e-2 * cosine_with_warmup(now, warmup)(now))
    fresh_run = _trainer(model, data, vocab, tmp_path / "c", max_steps=3)
    assert fresh_run.replanned is None


def test_trains_on_specforge_data_written_by_others(tmp_path):
    """gzip samples, [T, W] states, no manifest, no vocab mapping: read with weights_only and trained on."""
    model = random_model(CFG, seed=2)
    g = torch.Generator().manual_seed(0)
    for i in range(6):
        ids = torch.randint(0, VOCAB, (12,), generator=g)
        hidden, _ = model(ids[None], torch.arange(12)[None])
        write_sample(tmp_path, i, {"input_ids": ids[None], "loss_mask": (torch.arange(12) > 4).long()[None],
                                   "hidden_state": hidden[0].bfloat16(), "aux_hidden_state": model.taps(ids[None], TAPS)[0].bfloat16()},
                     compress=True)
    counts, lengths = scan_data(tmp_path, VOCAB)
    data = SampleSet(tmp_path, lengths)
    vocab = build_draft_vocab(counts, DRAFT_VOCAB)
    tr = Trainer(fresh(model, vocab), TargetHead.from_model(model), data,
                 TrainConfig(epochs=1, batch_size=3, ttt_length=2, log_every=1, checkpoint_every=0))
    result = tr.train()
    assert result.steps == 2 and all(torch.isfinite(torch.tensor(log.loss)) for log in result.logs)


def test_logged_seconds_come_from_the_trainers_clock(tmp_path):
    """6 samples, batch 3, log every step, a fake clock that moves 1000 s per reading: each log's seconds is a
    whole number of readings (1000, 2000, ...), the same in two runs; a wall clock would give milliseconds."""
    model = random_model(CFG, seed=2)
    data, vocab = make_data(model, tmp_path, 6, max_new=4)

    def run() -> list[float]:
        ticks = iter(range(0, 10**9, 1000))
        tr = Trainer(fresh(model, vocab), TargetHead.from_model(model), data,
                     TrainConfig(epochs=1, batch_size=3, ttt_length=2, log_every=1, checkpoint_every=0),
                     clock=lambda: float(next(ticks)))
        return [log.seconds for log in tr.train().logs]

    seconds = run()
    assert len(seconds) == 2 and all(s >= 1000 and s % 1000 == 0 for s in seconds), seconds
    assert run() == seconds


# ---- the output format -------------------------------------------------------------------------------


EXPECTED_NAMES = {
    "fc.weight", "midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight",
    "midlayer.self_attn.q_proj.weight", "midlayer.self_attn.k_proj.weight", "midlayer.self_attn.v_proj.weight",
    "midlayer.self_attn.o_proj.weight", "midlayer.post_attention_layernorm.weight", "midlayer.mlp.gate_proj.weight",
    "midlayer.mlp.up_proj.weight", "midlayer.mlp.down_proj.weight", "norm.weight", "lm_head.weight", "d2t", "t2d",
}


def _drafter_logits(net, model, ids):
    aux = model.taps(ids, TAPS)
    pos = torch.arange(ids.shape[1])[None]
    with torch.no_grad():
        return net(ids, net.fuse(aux), pos)[1]


def test_format_round_trips_through_our_loader(tmp_path, trained):
    model, trainer, _, _, vocab = trained
    out = save_drafter(trainer.net, tmp_path / "d", target=model.config, sglang_layer_ids=list(IDS), dtype=torch.float32)
    raw = json.loads((out / "config.json").read_text())
    assert raw["architectures"] == ["LlamaForCausalLMEagle3"] and raw["draft_vocab_size"] == DRAFT_VOCAB
    assert raw["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert raw["max_position_embeddings"] == model.config.max_position_embeddings
    ck = read_draft_checkpoint(out)
    assert set(ck.tensors) == EXPECTED_NAMES and ck.format == "sglang"
    assert [f for f in ck.validate(model.config) if f.severity != "info"] == []
    net, taps, _ = load_eagle3(out, model)
    assert taps == TAPS
    assert torch.equal(net.d2t, vocab.mapping.d2t) and torch.equal(net.t2d, vocab.mapping.t2d)
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(_drafter_logits(net, model, ids), _drafter_logits(trainer.net.eval(), model, ids), atol=1e-5)
    bf16 = save_drafter(trainer.net, tmp_path / "b", target=model.config, sglang_layer_ids=list(IDS))
    assert read_draft_checkpoint(bf16).tensors["fc.weight"].dtype == "BF16"


@pytest.mark.skipif(importlib.util.find_spec("speculators") is None, reason="speculators (PyPI) is not installed")
def test_speculators_converter_accepts_our_drafter(tmp_path, trained):
    """`speculators convert --algorithm eagle3 --verifier <local target>` converts the drafter; ids are
    passed in vLLM convention (the converter drops eagle_config's); our loader reads the result."""
    model, trainer, _, _, _ = trained
    verifier = save_hf_dir(model, CFG, tmp_path / "target")
    src = save_drafter(trainer.net, tmp_path / "sglang", target=model.config, sglang_layer_ids=list(IDS),
                       dtype=torch.float32)
    out = tmp_path / "converted"
    cmd = [sys.executable, "-m", "speculators", "convert", str(src), "--algorithm", "eagle3", "--verifier",
           str(verifier), "--output-path", str(out), "--algorithm-kwargs",
           json.dumps({"eagle_aux_hidden_state_layer_ids": list(TAPS)})]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ck = read_draft_checkpoint(out)
    assert ck.format == "speculators" and ck.aux_layer_ids == TAPS and ck.aux_convention == "vllm"
    net, taps, _ = load_eagle3(out, model)
    assert taps == TAPS
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(_drafter_logits(net, model, ids), _drafter_logits(trainer.net.eval(), model, ids), atol=1e-5)


# ---- end to end through the CLI -----------------------------------------------------------------------


def _tiny_model_dir(path):
    """The tiny target as an HF directory with a word-level tokenizer and a ChatML template."""
    model = sharp_target(seed=3)
    save_hf_dir(model, CFG, path)
    add_word_tokenizer(path, VOCAB)
    return model


def test_capture_then_train_through_the_cli(tmp_path, capfd):
    """`eaglelab capture` then `eaglelab train` (TensorBoard on, stopped and resumed): a drafter the
    engine loads, TensorBoard scalars per TTT step, and the resumed run equals a straight one."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from eaglelab.cli import main
    from eaglelab.engine.training.capture import read_manifest

    model = _tiny_model_dir(tmp_path / "target")
    data = tmp_path / "data"
    rc = main(["capture", "--model", str(tmp_path / "target"), "--out", str(data), "--prompts", "12",
               "--max-new-tokens", "12", "--layer-ids", "0,1,2", "--batch-size", "4", "--device", "cpu",
               "--dtype", "float32", "--draft-vocab-size", "32"])
    assert rc == 0
    m = read_manifest(data)
    assert m["counts"]["samples"] == 12 and m["draft_vocab"]["size"] == 32 and m["hf_indices"] == [1, 2, 3]
    assert len((data / "prompts.jsonl").read_text().splitlines()) == 12
    common = ["train", "--data", str(data), "--epochs", "2", "--batch-size", "4", "--ttt-length", "2",
              "--draft-vocab-size", "32", "--device", "cpu", "--save-dtype", "float32", "--log-every", "1",
              "--checkpoint-every", "2", "--lr", "1e-2"]
    assert main(common + ["--out", str(tmp_path / "straight"), "--tensorboard", str(tmp_path / "tb")]) == 0
    assert main(common + ["--out", str(tmp_path / "resumed"), "--max-steps", "4"]) == 0
    assert main(common + ["--out", str(tmp_path / "resumed"), "--resume"]) == 0
    a = (tmp_path / "straight" / "model.safetensors").read_bytes()
    assert a == (tmp_path / "resumed" / "model.safetensors").read_bytes()
    net, taps, _ = load_eagle3(tmp_path / "straight", model)
    assert taps == TAPS and net.config.draft_vocab_size == 32
    ev = EventAccumulator(str(tmp_path / "tb"))
    ev.Reload()
    tags = set(ev.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/acc_step0", "train/acc_step1", "train/loss_step1"} <= tags
    assert len(ev.Scalars("train/loss")) == 6  # 12 samples / 4 = 3 steps per epoch, 2 epochs
    prov = json.loads((tmp_path / "straight" / "eaglelab_training.json").read_text())
    assert prov["steps"] == 6 and prov["aux_layer_ids_sglang"] == [0, 1, 2]
    assert prov["train_config"]["target_temperature"] == 1.0
    # a sharpened target is recorded in the card; a temperature of 0 is a user's mistake, said without a traceback
    assert main(common + ["--out", str(tmp_path / "sharp"), "--max-steps", "1", "--target-temperature", "0.5"]) == 0
    sharp = json.loads((tmp_path / "sharp" / "eaglelab_training.json").read_text())
    assert sharp["train_config"]["target_temperature"] == 0.5
    capfd.readouterr()
    assert main(common + ["--out", str(tmp_path / "zero"), "--target-temperature", "0"]) == 2
    said = "".join(capfd.readouterr())
    assert "--target-temperature" in said and "Traceback" not in said and not (tmp_path / "zero").exists()
    # a time-limited run re-plans its length on resume (the device batches do): another --total-steps is taken
    assert main(common + ["--out", str(tmp_path / "replanned"), "--max-steps", "4"]) == 0
    capfd.readouterr()
    assert main(common + ["--out", str(tmp_path / "replanned"), "--resume", "--total-steps", "5"]) == 0
    said = " ".join("".join(capfd.readouterr()).split())
    assert "re-planned: 6 -> 5 steps" in said
    assert json.loads((tmp_path / "replanned" / "eaglelab_training.json").read_text())["steps"] == 5


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_bf16_training_matches_the_cpu_loss_curve(tmp_path):
    """The CUDA path (bf16 autocast, fused AdamW, pinned batches) trains like float32 on the CPU."""
    model = sharp_target(seed=1)
    data, vocab = make_data(model, tmp_path / "d", 16, max_new=16)
    cfg = TrainConfig(epochs=4, lr=1e-2, batch_size=4, ttt_length=3, log_every=4, checkpoint_every=0)
    cpu = Trainer(fresh(model, vocab), TargetHead.from_model(model), data, cfg).train()
    gpu_model = copy.deepcopy(model).cuda()
    gcfg = TrainConfig(**{**cfg.__dict__, "autocast": "bfloat16"})
    gpu = Trainer(fresh(gpu_model, vocab), TargetHead.from_model(gpu_model), data, gcfg, device="cuda").train()
    assert gpu.steps == cpu.steps == 16
    assert gpu.logs[-1].loss < 0.5 * gpu.logs[0].loss
    assert abs(gpu.logs[-1].loss - cpu.logs[-1].loss) < 0.15 * cpu.logs[-1].loss


def test_target_head_reads_a_wrapped_checkpoint_as_the_model_loader_does(tmp_path):
    """Kimi-K2.5 keeps its text model under ``language_model.`` (``language_model.model.embed_tokens.weight``,
    ``language_model.lm_head.weight``): TargetHead.load finds the same embedding, head and norm there as in the
    plain HF names (it refused the wrapped directory with "missing tensor"); a directory with neither names both."""
    from safetensors.torch import save_file

    model = random_model(CFG, seed=2)
    for prefix, head_prefix in (("model.", ""), ("language_model.model.", "language_model.")):
        d = tmp_path / prefix.rstrip(".")
        d.mkdir()
        save_file({prefix + "embed_tokens.weight": model.embed_tokens.weight.detach().clone(),
                   prefix + "norm.weight": model.norm.weight.detach().clone(),
                   head_prefix + "lm_head.weight": model.lm_head.weight.detach().clone()}, str(d / "model.safetensors"))
        (d / "config.json").write_text(json.dumps(CFG | {"tie_word_embeddings": False}))
        head = TargetHead.load(d)
        assert torch.equal(head.embed.weight, model.embed_tokens.weight)
        assert torch.equal(head.lm_head_weight, model.lm_head.weight) and torch.equal(head.norm_weight, model.norm.weight)
    bare = tmp_path / "bare"
    bare.mkdir()
    save_file({"vision_tower.w": torch.zeros(2)}, str(bare / "model.safetensors"))
    (bare / "config.json").write_text(json.dumps(CFG))
    with pytest.raises(CheckpointError) as err:
        TargetHead.load(bare)
    assert err.value.field == "model.embed_tokens.weight" and err.value.found == "absent"
    assert "language_model.model.embed_tokens.weight" in err.value.expected
