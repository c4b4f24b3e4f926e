"""Self-distillation and online training: distilled answers equal plain greedy decoding of each
prompt alone, a stopped distill resumes to the same shards, online states equal the offline capture
(so online training equals offline training), a time-limited run resumes bit-identically, and the
simulated acceptance equals what the engine accepts."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from eaglelab.engine.errors import CheckpointError
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.engine.training.offline_eval import (
    AcceptanceEval,
    anchor_hits,
    batch_cycles,
    chain_hits,
    simulate,
    summarise,
    walk,
)
from eaglelab.engine.training.capture import CaptureSettings, capture
from eaglelab.engine.training.distill import DistillSettings, Distiller, read_shard, shard_paths
from eaglelab.engine.training.draft_vocab import build_draft_vocab, scan_data
from eaglelab.engine.training.online import Subset, TargetStates, TokenData, split_heldout
from eaglelab.engine.training.train import SampleSet, TargetHead, TrainConfig, Trainer
from tests.engine.training.test_train import CFG, IDS, TAPS, VOCAB, fresh, prompts, sharp_target

pytestmark = pytest.mark.usefixtures("one_thread")
EOS = (2,)


class FakeClock:
    """Seconds that advance by ``tick`` at every reading: time limits become deterministic."""

    def __init__(self, tick: float = 1.0) -> None:
        self.t, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.t += self.tick
        return self.t


def distill(model, ps, out, batch_size=4, max_new=10, **kw):
    settings = DistillSettings(max_new_tokens=max_new, batch_size=batch_size, max_prompt_tokens=64, **kw.pop("s", {}))
    return Distiller(model, EOS, settings, **kw).run(ps, out)


def rows(out) -> dict[int, list[int]]:
    """Prompt index -> prompt + answer ids, over every shard."""
    found = {}
    for path in shard_paths(out):
        t = read_shard(path)
        off = t["offsets"].tolist()
        for r, i in enumerate(t["indices"].tolist()):
            found[i] = t["tokens"][off[r]: off[r + 1]].tolist()
    return found


# ---- distill -------------------------------------------------------------------------------------------


def test_distilled_answers_equal_plain_greedy_of_each_prompt_alone(tmp_path):
    """Batched (sorted by length, right-padded, ragged) generation writes exactly the greedy answer
    each prompt gets on its own, EOS included where the answer ended on it."""
    model = sharp_target(seed=1)
    ps = prompts(10, seed=4)
    summary = distill(model, ps, tmp_path / "d", batch_size=4)
    assert summary.done_now == 10 and summary.remaining == 0 and len(shard_paths(tmp_path / "d")) == 3
    got = rows(tmp_path / "d")
    for i, p in enumerate(ps):
        alone = Engine(model, eos_token_ids=EOS).generate([p], 10).tokens[0]
        assert got[i] == p + alone, i
    t = read_shard(shard_paths(tmp_path / "d")[0])
    assert t["tokens"].dtype == torch.uint16  # a vocabulary under 65536 ids: half the bytes
    assert t["prompt_lens"].tolist() == [len(ps[i]) for i in t["indices"].tolist()]


def test_a_stopped_distill_resumes_to_the_same_answers(tmp_path):
    """A time limit stops it between batches; the next run skips what is done and finishes: every
    prompt once, the same ids as one uninterrupted run."""
    model = sharp_target(seed=1)
    ps = prompts(10, seed=4)
    distill(model, ps, tmp_path / "straight")
    first = distill(model, ps, tmp_path / "split", s={"time_limit": 6.0}, clock=FakeClock())
    assert first.stopped_by_time and 0 < first.done_now < 10 and first.remaining == 10 - first.done_now
    second = distill(model, ps, tmp_path / "split")
    assert second.done_before == first.done_now and second.done_now == 10 - first.done_now
    assert rows(tmp_path / "split") == rows(tmp_path / "straight")


def test_one_prompt_length_class_is_held_at_a_time_and_answers_stay_greedy(tmp_path):
    """Batches run in increasing prompt length; a new length class (its own static cache) replaces the
    engine of the last, so large batches never hold two caches; the answers are still each prompt's
    plain greedy answer. Worked example: max_prompt_tokens 200 -> classes 64, 128, 192, 200; prompts of
    4-9 tokens run in the 64 class, those of 130-160 in the 192 class, in that order."""
    model = sharp_target(seed=1)
    g = torch.Generator().manual_seed(9)
    long = [torch.randint(3, VOCAB, (int(n),), generator=g).tolist() for n in (130, 160, 145)]
    ps = prompts(5, seed=8) + long
    settings = DistillSettings(max_new_tokens=6, batch_size=3, max_prompt_tokens=200)
    d = Distiller(model, EOS, settings)
    held, asked = [], []
    real = d.engine

    def spy(bucket):
        engine = real(bucket)
        held.append(len(d._engines))
        asked.append(bucket)
        return engine

    d.engine = spy
    d.run(ps, tmp_path / "d")
    assert settings.prompt_buckets == (64, 128, 192, 200)
    assert set(held) == {1} and asked == sorted(asked) and asked[0] == 64 and asked[-1] == 192
    got = rows(tmp_path / "d")
    for i, p in enumerate(ps):
        assert got[i] == p + Engine(model, eos_token_ids=EOS).generate([p], 6).tokens[0], i


def test_a_length_class_with_fewer_prompts_than_the_batch_size_gets_a_cache_of_as_many_rows(tmp_path):
    """--limit 10 with the default --batch-size 512 once sized the static cache (and its graph) to 512 rows:
    51x the memory the 10 rows use. Each class's runner now has its largest batch's rows; answers stay greedy."""
    model = sharp_target(seed=1)
    ps = prompts(10, seed=4)
    d = Distiller(model, EOS, DistillSettings(max_new_tokens=6, batch_size=512, max_prompt_tokens=200))
    sized, real = [], d.engine

    def spy(bucket):
        engine = real(bucket)
        sized.append((bucket, engine.runner.max_batch))
        return engine

    d.engine = spy
    d.run(ps, tmp_path / "d")
    assert sized == [(64, 10)]
    got = rows(tmp_path / "d")
    for i, p in enumerate(ps):
        assert got[i] == p + Engine(model, eos_token_ids=EOS).generate([p], 6).tokens[0], i


def test_class_rows_worked_example():
    """Lengths 5, 6, 7, 150, 160 at batch size 2: batches [0 1] [2 3] [4]; [2 3] is a 192-class batch (its
    longest prompt), so class 64 has 2 rows, class 192 its largest batch, 2; at batch size 4: [0 1 2 3] [4],
    both 192-class, 4 rows; 3 prompts of one class at batch size 8: 3 rows."""
    from eaglelab.engine.training.distill import class_rows, plan_batches

    lengths, buckets = {0: 5, 1: 6, 2: 7, 3: 150, 4: 160}, (64, 128, 192, 200)
    assert class_rows(plan_batches(lengths, 2), lengths, buckets) == {64: 2, 192: 2}
    assert class_rows(plan_batches(lengths, 4), lengths, buckets) == {192: 4}
    three = {0: 5, 1: 6, 2: 7}
    assert class_rows(plan_batches(three, 8), three, buckets) == {64: 3}


def test_a_damaged_shard_is_a_clear_error(tmp_path):
    model = sharp_target(seed=1)
    distill(model, prompts(4), tmp_path / "d")
    path = shard_paths(tmp_path / "d")[0]
    path.write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match="cannot read the shard") as err:
        TokenData(tmp_path / "d")
    assert str(path) in str(err.value)


# ---- online states and training ---------------------------------------------------------------------


def test_online_states_equal_a_forward_over_each_sequence_alone(tmp_path):
    """A padded batch's captured states equal each sequence's own forward in float32, within 2e-6 of the states'
    largest magnitude (~30 here: the bound ~6e-5; batched and single matmuls sum in another order, 2e-5 at most
    on an AMD EPYC's MKL; a wrong tap or position is off by whole units)."""
    model = sharp_target(seed=1)
    distill(model, prompts(6, seed=5), tmp_path / "d")
    data = TokenData(tmp_path / "d")
    batch = data.load(list(range(6)), max_length=64, pad_multiple=8)
    assert batch.input_ids.shape[1] % 8 == 0 and batch.aux is None
    filled = TargetStates(model, TAPS).fill(batch)
    for b in range(6):
        ids, mask = data.ids_and_mask(b)
        t = ids.numel()
        hs = model.all_hidden_states(ids[None])
        want_aux = torch.cat([hs[i] for i in TAPS], dim=-1)[0]  # [T, 3H]
        for got, want in ((filled.aux[b, :t], want_aux), (filled.hidden[b, :t], hs[-1][0])):
            assert (got - want).abs().max() <= 2e-6 * want.abs().max(), (b, (got - want).abs().max())
        assert batch.loss_mask[b, :t].tolist() == mask.float().tolist()
        assert mask.tolist() == [0] * data.prompt_lens[b] + [1] * (t - data.prompt_lens[b])


def _cfg(**kw):
    base = dict(epochs=2, lr=1e-2, batch_size=4, ttt_length=3, log_every=1, checkpoint_every=0, warmup_ratio=0.2,
                pad_multiple=8)
    return TrainConfig(**{**base, **kw})


def test_online_training_equals_offline_training_on_the_same_sequences(tmp_path):
    """The same prompts distilled (ids only, states online) and captured (SpecForge, states on disk):
    the same sequences, so the same drafter after training."""
    model = sharp_target(seed=1)
    ps = prompts(12, seed=6)
    distill(model, ps, tmp_path / "ids", max_new=12)
    capture(model, ps, tmp_path / "cap", CaptureSettings(IDS, max_new_tokens=12, batch_size=4), eos_token_ids=EOS)
    online = TokenData(tmp_path / "ids")
    counts, lengths = scan_data(tmp_path / "cap", VOCAB)
    offline = SampleSet(tmp_path / "cap", lengths)
    assert online.lengths == offline.lengths
    assert torch.equal(online.token_counts(VOCAB), counts)
    vocab = build_draft_vocab(counts, 64)
    a = Trainer(fresh(model, vocab), TargetHead.from_model(model), online, _cfg(), states=TargetStates(model, TAPS))
    b = Trainer(fresh(model, vocab), TargetHead.from_model(model), offline, _cfg())
    ra, rb = a.train(), b.train()
    assert ra.steps == rb.steps == 6
    for k, v in a.net.state_dict().items():
        assert torch.allclose(v, b.net.state_dict()[k], atol=1e-4), k
    assert ra.logs[-1].loss < ra.logs[0].loss


def test_a_time_limited_online_run_resumes_bit_identically(tmp_path):
    """8 steps straight, or stopped by the time limit (a fake clock: deterministic) with a checkpoint
    and continued in a fresh trainer: identical weights, optimizer state, schedule and position."""
    model = sharp_target(seed=1)
    distill(model, prompts(16, seed=7), tmp_path / "d", max_new=12)
    data = TokenData(tmp_path / "d")
    vocab = build_draft_vocab(data.token_counts(VOCAB), 64)

    def trainer(cfg, clock=None):
        kw = {"clock": clock} if clock else {}
        return Trainer(fresh(model, vocab), TargetHead.from_model(model), data, cfg, states=TargetStates(model, TAPS),
                       checkpoint_dir=tmp_path / "ck", **kw)

    straight = trainer(_cfg())
    straight.train()
    first = trainer(_cfg(time_limit=12.0), FakeClock())
    res = first.train()
    assert res.stopped_by_time and 0 < first.step < 8 and res.logs[-1].step == first.step
    ck = first.save_checkpoint()
    resumed = trainer(_cfg())
    resumed.load_checkpoint(ck)
    assert resumed.seconds == first.seconds > 0
    resumed.train()
    assert resumed.step == straight.step == 8 and resumed.epoch == straight.epoch
    for k, v in straight.net.state_dict().items():
        assert torch.equal(v, resumed.net.state_dict()[k]), k
    sa, sb = straight.opt.state_dict()["state"], resumed.opt.state_dict()["state"]
    for i in sa:
        assert torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) and torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"])
    assert straight.sched.get_last_lr() == resumed.sched.get_last_lr()


def test_heldout_split_is_fixed_and_disjoint():
    train, held = split_heldout(50, 8, seed=3)
    assert len(held) == 8 and set(train).isdisjoint(held) and sorted(train + held) == list(range(50))
    assert split_heldout(50, 8, seed=3) == (train, held) and split_heldout(50, 8, seed=4)[1] != held


# ---- simulated acceptance ---------------------------------------------------------------------------


def test_summary_worked_example():
    """hits (1,1,0) -> accepted 3 of a chain of 3; (0,1,1) -> 1; rates conditional on reaching the step."""
    hits = torch.tensor([[1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    assert chain_hits(hits).tolist() == [[1, 1, 0], [0, 0, 0]]
    ev = summarise(5, hits)
    assert ev == AcceptanceEval(5, 2, (1.5, 2.0, 2.0), (0.5, 1.0, 0.0))
    assert ev.chain(3) == 2.0


def test_walk_worked_example():
    """Anchors 0..5, chain of 2: at 0 both hit (accept 3) -> anchor 3: first misses (1) -> anchor 4:
    one hit (2) -> anchor 6: past the valid anchors, the walk ends. A chain of 1 reads only step 0."""
    hits = torch.tensor([[1, 1], [0, 0], [1, 1], [0, 1], [1, 0], [1, 1]], dtype=torch.bool)
    valid = torch.ones(6, dtype=torch.bool)
    assert walk(hits, valid, 0, 2) == [3, 1, 2]
    assert walk(hits, valid, 0, 1) == [2, 2, 2]
    valid[3] = False
    assert walk(hits, valid, 0, 2) == [3]
    ev = summarise(0, hits, [walk(hits, torch.ones(6, dtype=torch.bool), 0, k) for k in (1, 2)])
    assert ev.cycle_len == (2.0, 2.0) and ev.chain(2) == pytest.approx(1 + (2 + 0 + 2 + 0 + 1 + 2) / 6)  # cycles < anchors


def test_simulated_acceptance_equals_the_engine_chain(tmp_path):
    """On the engine's own greedy output, the simulated accepted length at each cycle's anchor equals
    what the engine accepted in that cycle (chain of 3, a briefly trained drafter)."""
    model = sharp_target(seed=1)
    distill(model, prompts(16, seed=8), tmp_path / "d", max_new=16)
    data = TokenData(tmp_path / "d")
    vocab = build_draft_vocab(data.token_counts(VOCAB), 64)
    tr = Trainer(fresh(model, vocab), TargetHead.from_model(model), data, _cfg(epochs=3), states=TargetStates(model, TAPS))
    tr.train()
    net = tr.net.eval()
    spec = SpecConfig("eagle3", num_steps=3, topk=1, num_draft_tokens=4)
    checked = 0
    for p in prompts(4, seed=9):
        res = Engine(model, eos_token_ids=(), drafter=Eagle3Drafter(net, spec, TAPS), spec=spec).generate([p], 24)
        seq = torch.tensor(p + res.tokens[0])[None]  # [1, T]
        mask = torch.zeros_like(seq, dtype=torch.float32)
        mask[:, len(p):] = 1.0
        from eaglelab.engine.training.ttt import TrainBatch

        batch = TargetStates(model, TAPS).fill(TrainBatch(seq, mask, None, None))
        hit, valid = anchor_hits(net, batch, model.lm_head.weight, 3)
        alive = chain_hits(hit[0])  # [n, 3]
        anchor = len(p) - 1
        engine = [a[0] for a in res.accept_lens]
        for acc in engine:
            if anchor >= valid.shape[1] or not valid[0, anchor]:
                break
            assert 1 + int(alive[anchor].sum()) == acc, (anchor, acc)
            anchor += acc
            checked += 1
        walked = walk(hit[0], valid[0], len(p) - 1, 3)  # the training eval's cycles: the engine's, while valid
        assert walked == engine[: len(walked)] and len(walked) >= 1
        assert batch_cycles(hit, valid, mask)[2] == walked
    assert checked >= 8


def test_evaluate_reports_on_the_heldout_split(tmp_path):
    model = sharp_target(seed=1)
    distill(model, prompts(12, seed=10), tmp_path / "d", max_new=12)
    data = TokenData(tmp_path / "d")
    vocab = build_draft_vocab(data.token_counts(VOCAB), 64)
    train, held = split_heldout(len(data), 4, seed=0)
    tr = Trainer(fresh(model, vocab), TargetHead.from_model(model), Subset(data, train), _cfg(eval_every=2),
                 states=TargetStates(model, TAPS), heldout=Subset(data, held))
    res = tr.train()
    assert [e.step for e in res.evals] == [0, 2, 4]  # 0: the starting point, before the first step
    ev = res.evals[-1]
    assert ev.anchors > 0 and len(ev.accept_len) == 3 and len(ev.per_position) == 3
    assert 1.0 <= ev.accept_len[0] <= ev.accept_len[1] <= ev.accept_len[2] <= 4.0
    direct = simulate(tr.net, [TargetStates(model, TAPS).fill(Subset(data, held).load([0, 1, 2, 3], 2048, 8))],
                      model.lm_head.weight, 3, tr.step)
    assert direct == ev
