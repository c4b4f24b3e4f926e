"""Train an EAGLE-3 drafter on SpecForge-format data: the job around the TTT step of :mod:`.ttt`.

Settings (:class:`TrainConfig`), the target's frozen head (:class:`TargetHead`), batches from a data
directory (:class:`SampleSet`, read in a background thread), the :class:`Trainer` (AdamW, cosine schedule
with warm-up, gradient clipping, the loss ``sum_i decay^i * CE_i``), checkpoints and resuming, the
drafter's size budget and saving it as a SGLang/speculators directory. Checkpoints hold model,
optimizer, scheduler, data position and RNG states; resuming continues to the same state as a run
that never stopped.
"""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.eagle3 import Eagle3Config, Eagle3Network
from eaglelab.engine.errors import CheckpointError, ConfigError
from eaglelab.engine.formats.validate import load_tensor_dict
from eaglelab.engine.formats.specforge_data import VocabMapping, list_samples, read_sample
from eaglelab.engine.training.ttt import TrainBatch, TTTResult, target_probs, ttt_forward


@dataclass(frozen=True)
class TrainConfig:
    """Training settings (the CLI's flags)."""

    epochs: int = 2
    lr: float = 1e-4
    batch_size: int = 4  # sequences per optimizer step
    ttt_length: int = 7
    step_decay: float = 0.8  # loss weight of TTT step i: step_decay ** i
    target_temperature: float = 1.0  # the target's distribution the loss matches: softmax(logits / this); < 1 sharper
    warmup_ratio: float = 0.015
    max_grad_norm: float = 0.5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    max_length: int = 2048  # tokens kept per sample
    pad_multiple: int = 64  # batches pad to a multiple of this: few distinct shapes, no per-shape warm-up
    seed: int = 0
    checkpoint_every: int = 500  # optimizer steps; 0 = only at the end
    keep_checkpoints: int = 2
    log_every: int = 10
    max_steps: int | None = None  # stop after this many steps (the schedule still spans all epochs)
    autocast: str | None = None  # "bfloat16" | "float16" | None (float32)
    init_lm_head: str = "target"  # "target": rows of the target's lm_head and final norm; "random"
    time_limit: float | None = None  # seconds of this run; stops at the step boundary before overrunning
    eval_every: int = 0  # steps between simulated-acceptance evaluations on the held-out split; 0 = off
    total_steps: int | None = None  # the run's length: the schedule ends (LR 0) here; None = epochs x batches

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "ttt_length", "max_length", "log_every"):
            if getattr(self, name) < 1:
                raise ConfigError("must be >= 1", field="--" + name.replace("_", "-"), found=getattr(self, name))
        if self.lr <= 0:
            raise ConfigError("must be > 0", field="--lr", found=self.lr)
        if not self.target_temperature > 0:
            raise ConfigError("must be > 0", field="--target-temperature", found=self.target_temperature)
        if self.time_limit is not None and self.time_limit <= 0:
            raise ConfigError("must be > 0 seconds", field="--time-limit", found=self.time_limit)
        if self.eval_every < 0:
            raise ConfigError("must be >= 0", field="--eval-every", found=self.eval_every)
        if self.total_steps is not None and self.total_steps < 1:
            raise ConfigError("must be >= 1", field="--total-steps", found=self.total_steps)
        if self.init_lm_head not in ("target", "random"):
            raise ConfigError("unknown init", field="--init-lm-head", found=self.init_lm_head, expected="target | random")

    def step_weights(self) -> list[float]:
        return [self.step_decay ** i for i in range(self.ttt_length)]


# ---- the target's pieces the drafter needs ---------------------------------------------------------


@dataclass
class TargetHead:
    """The target's embedding (shared, frozen), lm_head and final norm: all training needs of it."""

    config: ModelConfig
    embed: nn.Embedding
    lm_head_weight: torch.Tensor  # [V, H]
    norm_weight: torch.Tensor | None  # [H]

    @classmethod
    def from_model(cls, model) -> "TargetHead":
        """From a loaded :class:`Transformer`."""
        model.embed_tokens.weight.requires_grad_(False)
        return cls(model.config, model.embed_tokens, model.lm_head.weight.detach(), model.norm.weight.detach())

    @classmethod
    def load(cls, model_dir: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> "TargetHead":
        """Read only embed_tokens, lm_head and norm from an HF directory (no full model load), under the
        names the model loader reads (HF's ``model.*``, or a multimodal wrapper's ``language_model.*``)."""
        from eaglelab.engine.formats.loader import (
            PREFIX_ALIASES, find_stored, read_tensors, resolve_model_dir, safetensors_files, stored_tensor)

        model_dir = resolve_model_dir(model_dir)
        cfg = ModelConfig.from_json(model_dir / "config.json")
        handles = read_tensors(safetensors_files(model_dir))

        def get(name: str) -> torch.Tensor | None:
            src = find_stored(name, handles)
            return None if src is None else stored_tensor(handles, src).to(device=device, dtype=dtype)

        def names(name: str) -> str:  # every name ``get`` looks for
            return " | ".join(p + name for p in PREFIX_ALIASES)

        emb_w = get("embed_tokens.weight")
        if emb_w is None:
            raise CheckpointError("missing tensor", file=model_dir, field="model.embed_tokens.weight", found="absent",
                                  expected=names("embed_tokens.weight"), hint="point --target at the model the data came from")
        head_w = get("lm_head.weight")
        if head_w is None:
            if not cfg.tie_word_embeddings:
                raise CheckpointError("missing tensor", file=model_dir, field="lm_head.weight", found="absent",
                                      expected=names("lm_head.weight"),
                                      hint="config.json says the embeddings are not tied: the weights lack the head")
            head_w = emb_w
        embed = nn.Embedding.from_pretrained(emb_w, freeze=True)
        return cls(cfg, embed, head_w, get("norm.weight"))


def drafter_config(target: ModelConfig, num_aux: int, draft_vocab_size: int,
                   intermediate_size: int | None = None, layout: str | None = None) -> Eagle3Config:
    """A drafter shaped like one target layer: the target's hidden size and heads; its MLP width
    ``intermediate_size`` (None: the target's). ``layout`` "llama" (q/k/v attention) or "mla" (the target's
    MLA sizes, ``Eagle3DeepseekV2ForCausalLM``; its cache row is the target's, one [R + Dr] "KV head");
    None: the target's attention kind (MLA for an MLA target, else Llama)."""
    layout = layout or ("mla" if target.mla is not None else "llama")
    if layout not in ("llama", "mla"):
        raise ValueError(f"unknown drafter layout {layout!r}: llama or mla")
    if layout == "mla" and target.mla is None:
        raise ValueError(f"an MLA drafter needs an MLA target (kv_lora_rank ...); {target.architecture} has none")
    mla = target.mla if layout == "mla" else None
    return Eagle3Config(
        hidden_size=target.hidden_size, target_hidden_size=target.hidden_size, num_aux=num_aux,
        num_heads=target.num_heads, num_kv_heads=1 if mla else target.num_kv_heads,
        head_dim=mla.cache_dim if mla else target.head_dim,
        intermediate_size=intermediate_size or target.intermediate_size, vocab_size=target.vocab_size,
        draft_vocab_size=draft_vocab_size, rms_norm_eps=target.rms_norm_eps, rope_theta=target.rope_theta,
        rope_scaling=target.rope_scaling, mla=mla,
    )


def new_drafter(cfg: Eagle3Config, head: TargetHead, vocab: VocabMapping, *, seed: int = 0,
                init_lm_head: str = "target") -> Eagle3Network:
    """A freshly initialised float32 drafter on the CPU: linear weights N(0, 0.02), norms 1,
    optionally the lm_head (and final norm) taken from the target's rows of the draft vocabulary."""
    from eaglelab.engine.model.eagle3_mla import eagle3_network

    net = eagle3_network(cfg, head.embed)  # the MLA layout when cfg.mla is set
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        net.d2t.copy_(vocab.d2t)
        net.t2d.copy_(vocab.t2d)
        if init_lm_head == "target":
            rows = net.token_map().to(head.lm_head_weight.device)
            net.lm_head.weight.copy_(head.lm_head_weight[rows].float().cpu())
            if head.norm_weight is not None:
                net.norm.weight.copy_(head.norm_weight.float().cpu())
    net.reset_buffers()
    return net


# ---- data --------------------------------------------------------------------------------------------


def collate(samples: list, max_length: int, pad_multiple: int = 1) -> TrainBatch:
    """Samples (:class:`Sample`) -> a padded :class:`TrainBatch`, each cut to ``max_length``, the
    batch padded to a multiple of ``pad_multiple`` tokens (padding has loss_mask 0 and, being after
    every real token, is never attended to by one)."""
    samples = [s.truncated(max_length) for s in samples]
    for s in samples:
        if s.hidden_state is None:
            raise CheckpointError("training needs hidden_state (the target's final hidden state)", file=s.path,
                                  field="hidden_state", hint="capture the data with its final hidden states")
    B, T = len(samples), max(s.num_tokens for s in samples)
    T = -(-T // pad_multiple) * pad_multiple
    aux0, hs0 = samples[0].aux_hidden_state, samples[0].hidden_state
    ids = torch.zeros(B, T, dtype=torch.long)
    mask = torch.zeros(B, T, dtype=torch.float32)
    aux = torch.zeros(B, T, aux0.shape[-1], dtype=aux0.dtype)
    hidden = torch.zeros(B, T, hs0.shape[-1], dtype=hs0.dtype)
    for b, s in enumerate(samples):
        t = s.num_tokens
        ids[b, :t] = s.input_ids
        mask[b, :t] = (s.loss_mask != 0).float()
        aux[b, :t] = s.aux_hidden_state[0]
        hidden[b, :t] = s.hidden_state[0]
    if torch.cuda.is_available():
        aux, hidden = aux.pin_memory(), hidden.pin_memory()
    return TrainBatch(ids, mask, aux, hidden)


def epoch_batches(lengths: list[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """The batches of one epoch, deterministic in (seed, epoch): a random permutation, grouped by
    length within windows of 32 batches (less padding), in random batch order."""
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    perm = torch.randperm(len(lengths), generator=gen).tolist()
    window = batch_size * 32
    batches: list[list[int]] = []
    for w in range(0, len(perm), window):
        group = sorted(perm[w: w + window], key=lambda i: -lengths[i])
        batches += [group[j: j + batch_size] for j in range(0, len(group), batch_size)]
    order = torch.randperm(len(batches), generator=gen).tolist()
    return [batches[k] for k in order]


class SampleSet:
    """The sample files of a data directory and their lengths; batches load in a background thread."""

    def __init__(self, data_dir: str | Path, lengths: list[int] | None = None) -> None:
        self.paths = list_samples(data_dir)
        if lengths is None:
            from eaglelab.engine.training.draft_vocab import read_ids_and_mask

            lengths = [int(read_ids_and_mask(p)[0].numel()) for p in self.paths]
        assert len(lengths) == len(self.paths), f"{len(lengths)} lengths for {len(self.paths)} samples"
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.paths)

    def load(self, indices: list[int], max_length: int, pad_multiple: int = 1) -> TrainBatch:
        return collate([read_sample(self.paths[i]) for i in indices], max_length, pad_multiple)


# ---- schedule, checkpoints ---------------------------------------------------------------------------


def cosine_with_warmup(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear warm-up to 1, then cosine down to 0 at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


@dataclass(frozen=True)
class TrainLog:
    """What the trainer reports every ``log_every`` steps (means over those steps)."""

    step: int
    total_steps: int
    epoch: int
    loss: float
    step_loss: tuple[float, ...]
    step_acc: tuple[float, ...]
    lr: float
    grad_norm: float
    tokens: int  # loss-counted tokens (step 0) since the last log
    seconds: float


@dataclass
class TrainResult:
    """The end of a run."""

    steps: int
    logs: list[TrainLog] = field(default_factory=list)
    checkpoints: list[Path] = field(default_factory=list)
    evals: list = field(default_factory=list)  # AcceptanceEval per evaluation
    stopped_by_time: bool = False


CHECKPOINT_KEYS = ("model", "optimizer", "scheduler", "position", "rng", "num_samples")
# Settings that fix the batch order, the LR's scale and the loss: a resume with others would train some samples twice
# and skip others within the epoch, jump the LR, or change what the drafter is trained to match halfway. The run's
# length (--total-steps, --epochs) may change on resume: a time-limited run re-plans where its cosine ends from the
# rate it measured (see Trainer.replanned).
RESUME_FIXED = ("seed", "batch_size", "warmup_ratio", "lr", "target_temperature")


class Trainer:
    """Owns the drafter, optimizer, scheduler and the data position; :meth:`train` runs the loop.

    ``data`` serves batches with states (SpecForge data) or without (online: ``states`` computes
    them with the target); ``heldout`` is the split the simulated acceptance is measured on;
    ``clock`` (seconds) decides the time limit.
    """

    def __init__(self, net: Eagle3Network, head: TargetHead, data, cfg: TrainConfig, *,
                 device: torch.device | str = "cpu", checkpoint_dir: str | Path | None = None,
                 states=None, heldout=None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.cfg, self.data, self.states, self.heldout, self.clock = cfg, data, states, heldout, clock
        self.device = torch.device(device)
        self.net = net.to(self.device).float()
        self.net.reset_buffers()
        head.embed.weight.requires_grad_(False)
        head.embed.to(self.device)
        self._head_weight = head.lm_head_weight
        self.head_rows = self._rows()  # [V_draft, H]
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else None
        self.params = [p for p in self.net.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay,
                                     fused=self.device.type == "cuda")
        self.batches_per_epoch = math.ceil(len(data) / cfg.batch_size)
        self.total_steps = cfg.total_steps or cfg.epochs * self.batches_per_epoch
        warmup = int(cfg.warmup_ratio * self.total_steps)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, cosine_with_warmup(self.total_steps, warmup))
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self.replanned: tuple[int, int] | None = None  # (steps, steps) when a resume changed the run's length
        self.seconds = 0.0  # training time over every piece of a resumed run
        self.eval_history: list[dict[str, Any]] = []  # every held-out evaluation of the run, resumed pieces included
        self.weights = torch.tensor(cfg.step_weights(), device=self.device)

    def _rows(self) -> torch.Tensor:
        """The target's lm_head rows of the drafter's draft vocabulary, on the device."""
        return self._head_weight[self.net.token_map().to(self._head_weight.device)].to(self.device)

    # -- one optimizer step --
    def train_step(self, batch: TrainBatch) -> tuple[TTTResult, torch.Tensor, torch.Tensor]:
        """Forward, backward, clip, update. Returns (per-step stats, loss, grad norm) on the device."""
        self.net.train()
        batch = self._with_states(batch.to(self.device))
        ac = self.cfg.autocast
        probs = target_probs(self.head_rows, batch.hidden, self.cfg.target_temperature)  # float32, outside autocast
        with torch.autocast(self.device.type, dtype=getattr(torch, ac or "bfloat16"), enabled=ac is not None):
            res = ttt_forward(self.net, batch, probs, self.cfg.ttt_length)
            loss = (self.weights * res.step_loss).sum()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        self.opt.step()
        self.sched.step()
        return res, loss.detach(), gn.detach()

    def _with_states(self, batch: TrainBatch) -> TrainBatch:
        """Online batches get the target's states here, on the device."""
        if batch.aux is not None:
            return batch
        assert self.states is not None, "batches without states need a TargetStates (online training)"
        return self.states.fill(batch)

    # -- the loop --
    def train(self, on_log: Callable[[TrainLog], None] | None = None, on_eval: Callable | None = None) -> TrainResult:
        """Train from the current position to the end (or ``max_steps``, or the time limit), logging,
        evaluating and checkpointing. With evaluation on, a run from step 0 evaluates once before its first
        step: the starting point (step 0 of the history) that training's gain is measured from."""
        cfg, result = self.cfg, TrainResult(self.step)
        stop = min(self.total_steps, cfg.max_steps) if cfg.max_steps else self.total_steps
        acc = _Accumulator(cfg.ttt_length, self.device, self.clock)
        self._t0, self._last_step = self.clock(), None
        if self.step == 0:  # a fresh run: the starting point (a resumed run's is in its history already)
            self._record_eval(result, on_eval)
        with ThreadPoolExecutor(max_workers=2) as pool:
            while self.step < stop and not result.stopped_by_time:
                batches = epoch_batches(self.data.lengths, cfg.batch_size, cfg.seed, self.epoch)
                self._run(pool, batches[self.batch_in_epoch: self.batch_in_epoch + (stop - self.step)],
                          stop, acc, result, (on_log, on_eval))
                if self.batch_in_epoch >= len(batches):
                    self.epoch, self.batch_in_epoch = self.epoch + 1, 0
        if result.stopped_by_time and acc.n:
            result.logs.append(acc.flush(self))
            if on_log:
                on_log(result.logs[-1])
        result.steps = self.step
        return result

    def _run(self, pool, todo: list[list[int]], stop: int, acc, result: TrainResult, callbacks) -> None:
        """Train on ``todo`` (batches of sample indices), loading two batches ahead."""
        cfg, (on_log, on_eval) = self.cfg, callbacks
        load = lambda b: self.data.load(b, cfg.max_length, cfg.pad_multiple)  # noqa: E731
        futures = [pool.submit(load, b) for b in todo[:2]]
        for j in range(len(todo)):
            if self._out_of_time():
                result.stopped_by_time = True
                return
            if j + 2 < len(todo):
                futures.append(pool.submit(load, todo[j + 2]))
            t = self.clock()
            res, loss, gn = self.train_step(futures[j].result())
            futures[j] = None  # free the host batch
            self.step, self.batch_in_epoch = self.step + 1, self.batch_in_epoch + 1
            self._last_step = self.clock() - t
            self.seconds += self._last_step
            acc.add(res, loss, gn)
            if self.step % cfg.log_every == 0 or self.step == stop:
                result.logs.append(acc.flush(self))
                if on_log:
                    on_log(result.logs[-1])
            if self.step % max(1, cfg.eval_every) == 0 or self.step == stop:
                self._record_eval(result, on_eval)
            if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0 and self.checkpoint_dir:
                result.checkpoints.append(self.save_checkpoint())

    def _record_eval(self, result: TrainResult, on_eval: Callable | None) -> None:
        """When evaluation is on (--eval-every with a held-out split): evaluate at this step, keep it in the
        result and the run's history, and report it."""
        if self.heldout is None or not self.cfg.eval_every:
            return
        result.evals.append(self.evaluate())
        self.eval_history.append(asdict(result.evals[-1]))
        if on_eval:
            on_eval(result.evals[-1])

    def _out_of_time(self) -> bool:
        """Would the next step overrun the time limit (judged by the last step's time)? A run makes
        at least one step."""
        limit, last = self.cfg.time_limit, self._last_step
        return limit is not None and last is not None and self.clock() - self._t0 + last > limit

    def evaluate(self):
        """Simulated acceptance (chains up to ``ttt_length`` steps) on the held-out split."""
        from eaglelab.engine.training.offline_eval import simulate

        cfg, data = self.cfg, self.heldout
        assert data is not None, "no held-out split to evaluate on"
        groups = [list(range(k, min(k + cfg.batch_size, len(data)))) for k in range(0, len(data), cfg.batch_size)]
        batches = (self._with_states(data.load(g, cfg.max_length, cfg.pad_multiple).to(self.device)) for g in groups)
        ac = cfg.autocast
        with torch.autocast(self.device.type, dtype=getattr(torch, ac or "bfloat16"), enabled=ac is not None):
            return simulate(self.net, batches, self._head_weight.to(self.device), cfg.ttt_length, self.step)

    # -- checkpoints --
    def state(self) -> dict[str, Any]:
        return {
            "model": {k: v.detach().cpu() for k, v in self.net.state_dict().items()},
            "optimizer": self.opt.state_dict(),
            "scheduler": self.sched.state_dict(),
            "position": {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch},
            "seconds": self.seconds,
            "evals": self.eval_history,
            "rng": {"cpu": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
            "config": json.loads(json.dumps(asdict(self.cfg))),
            "num_samples": len(self.data),
        }

    def save_checkpoint(self, path: str | Path | None = None) -> Path:
        """Write the full training state (atomically); keeps the last ``keep_checkpoints``."""
        assert path is not None or self.checkpoint_dir is not None, "no checkpoint_dir to put checkpoints in"
        ck_dir = self.checkpoint_dir if path is None else Path(path).parent
        path = Path(path) if path is not None else ck_dir / f"step_{self.step:08d}.pt"
        from eaglelab.engine.formats.safe_write import write_atomic

        state = self.state()
        write_atomic(path, lambda tmp: torch.save(state, tmp), what="training checkpoint", flag="--checkpoint-dir")
        if self.cfg.keep_checkpoints > 0:
            for old in sorted(ck_dir.glob("step_*.pt"))[: -self.cfg.keep_checkpoints]:
                old.unlink()
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        try:
            self._restore(path)
        except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as exc:  # a dict of the wrong things
            raise CheckpointError(f"does not fit this drafter and optimizer ({str(exc).splitlines()[0][:200]})",
                                  file=path, hint="resume only from checkpoints of the same `eaglelab train` run") from None

    def _restore(self, path: str | Path) -> None:
        """Restore a state written by :meth:`save_checkpoint` (``weights_only`` load)."""
        path = Path(path)
        state = load_tensor_dict(path, what="a training checkpoint", required=CHECKPOINT_KEYS,
                                 hint="resume from a step_*.pt file that `eaglelab train` wrote")
        if state.get("num_samples") != len(self.data):
            raise CheckpointError("the checkpoint was trained on other data", file=path, field="num_samples",
                                  found=state.get("num_samples"), expected=len(self.data),
                                  hint="resume with the same --data directory")
        saved = state.get("config") or {}
        self._check_same_run(path, saved)
        self.net.load_state_dict({k: v.to(self.device) for k, v in state["model"].items()})
        self.head_rows = self._rows()
        self.opt.load_state_dict(state["optimizer"])
        self.sched.load_state_dict(state["scheduler"])
        pos = state["position"]
        self.step, self.epoch, self.batch_in_epoch = pos["step"], pos["epoch"], pos["batch_in_epoch"]
        before = saved.get("total_steps") or (saved.get("epochs") or 0) * self.batches_per_epoch
        self.replanned = (before, self.total_steps) if before and before != self.total_steps else None
        self.seconds = float(state.get("seconds", 0.0))
        self.eval_history = list(state.get("evals", []))  # checkpoints from before the history kept none
        torch.set_rng_state(state["rng"]["cpu"])
        if torch.cuda.is_available() and state["rng"]["cuda"]:
            torch.cuda.set_rng_state_all(state["rng"]["cuda"])


    def _check_same_run(self, path: Path, saved: dict[str, Any]) -> None:
        """The settings of :data:`RESUME_FIXED` must be those of the run that wrote the checkpoint."""
        for name in RESUME_FIXED:
            ours = getattr(self.cfg, name)
            if name in saved and saved[name] != ours:
                flag = "--" + name.replace("_", "-")
                raise CheckpointError(
                    f"the checkpoint's run had another {flag}", file=path, field=flag, found=ours, expected=saved[name],
                    hint=f"resume with {flag} {saved[name]} (as the run that wrote it: it fixes the batch order, "
                         "the LR schedule or the loss), "
                         "or start afresh with another --checkpoint-dir")


def latest_checkpoint(checkpoint_dir: str | Path) -> Path | None:
    """The newest ``step_*.pt`` in ``checkpoint_dir``, or None."""
    found = sorted(Path(checkpoint_dir).glob("step_*.pt"))
    return found[-1] if found else None


class _Accumulator:
    """Sums per-step stats on the device; one host sync per log. ``clock``: the trainer's (seconds)."""

    def __init__(self, steps: int, device: torch.device, clock: Callable[[], float]) -> None:
        self.steps, self.device, self.clock = steps, device, clock
        self._reset()

    def _reset(self) -> None:
        z = lambda: torch.zeros(self.steps, device=self.device)  # noqa: E731
        self.loss_sum, self.correct, self.count = z(), z(), z()
        self.total = torch.zeros((), device=self.device)
        self.gn = torch.zeros((), device=self.device)
        self.n, self.t0 = 0, self.clock()

    def add(self, res: TTTResult, loss: torch.Tensor, gn: torch.Tensor) -> None:
        self.loss_sum += res.step_loss.detach()
        self.correct += res.step_correct
        self.count += res.step_count
        self.total += loss
        self.gn += gn.float()
        self.n += 1

    def flush(self, tr: Trainer) -> TrainLog:
        n = max(1, self.n)
        host = torch.cat([self.loss_sum / n, self.correct / self.count.clamp(min=1), self.count,
                          torch.stack([self.total / n, self.gn / n])]).tolist()
        L = self.steps
        log = TrainLog(step=tr.step, total_steps=tr.total_steps, epoch=tr.epoch, loss=host[-2],
                       step_loss=tuple(host[:L]), step_acc=tuple(host[L: 2 * L]), lr=tr.sched.get_last_lr()[0],
                       grad_norm=host[-1], tokens=int(host[2 * L]), seconds=self.clock() - self.t0)
        self._reset()
        return log


# ---- the shipped format ------------------------------------------------------------------------------


def drafter_tensors(net: Eagle3Network, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    """The SGLang tensor names and values: floats in ``dtype``, d2t int64, t2d bool."""
    out = {}
    for name, t in net.state_dict().items():
        t = t.detach().cpu()
        out[name] = t.to(dtype) if t.is_floating_point() else t
    out["d2t"], out["t2d"] = out["d2t"].long(), out["t2d"].bool()
    return out


def drafter_size_bytes(net: Eagle3Network, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of the saved tensors in ``dtype`` (what model.safetensors holds, headers aside)."""
    return sum(t.numel() * t.element_size() for t in drafter_tensors(net, dtype).values())


@dataclass(frozen=True)
class DrafterSize:
    """What a drafter of a config weighs when saved (headers aside: ~1.5 KB of safetensors JSON)."""

    parameters: int  # trainable: fc, midlayer, norm, lm_head
    bytes: int  # the floats in the save dtype, d2t int64, t2d bool

    @property
    def mib(self) -> float:
        return self.bytes / 2**20

    @property
    def mb(self) -> float:
        return self.bytes / 1e6


def drafter_size(cfg: Eagle3Config, dtype: torch.dtype = torch.bfloat16) -> DrafterSize:
    """The parameters and saved bytes of a drafter of ``cfg``, from its tensor shapes alone.

    Worked example (SmolLM2-135M's drafter: hidden 576, 3 aux states, 9/3 heads of 64), bfloat16::

        intermediate 1536, 12,288 draft tokens: 12,167,424 parameters, 24,482,304 bytes
        intermediate 2816,  8,192 draft tokens: 12,019,968 parameters, 24,154,624 bytes

    i.e. 3,456 bytes per MLP unit (gate and up rows, a down column) and 1,160 per draft token (a
    head row and its d2t entry).
    """
    from eaglelab.engine.formats.draft_checkpoint import expected_tensor_shapes

    shapes = expected_tensor_shapes(
        hidden_size=cfg.hidden_size, aux_hidden_size=cfg.target_hidden_size, num_aux=cfg.num_aux,
        num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size, vocab_size=cfg.vocab_size, draft_vocab_size=cfg.draft_vocab_size,
    )
    params = sum(math.prod(s) for name, s in shapes.items() if name not in ("d2t", "t2d"))
    item = torch.empty((), dtype=dtype).element_size()
    return DrafterSize(params, params * item + math.prod(shapes["d2t"]) * 8 + math.prod(shapes["t2d"]))


def check_size_budget(cfg: Eagle3Config, max_mb: float, dtype: torch.dtype = torch.bfloat16) -> DrafterSize:
    """The drafter's size when it fits ``max_mb`` (10^6 bytes of saved tensors); else a ConfigError that
    names --intermediate-size and --draft-vocab-size with the combinations that fit."""
    size = drafter_size(cfg, dtype)
    if size.bytes <= max_mb * 1e6:
        return size
    dt = str(dtype).replace("torch.", "")
    fits = [f"--intermediate-size {i} --draft-vocab-size {v} ({drafter_size(c, dtype).mb:.2f} MB)"
            for i, v, c in _fitting(cfg, max_mb * 1e6, dtype)]
    raise ConfigError(
        "the drafter would exceed --max-size-mb", field="--intermediate-size, --draft-vocab-size",
        found=f"intermediate {cfg.intermediate_size}, draft vocabulary {cfg.draft_vocab_size}: {size.mb:.2f} MB "
              f"({size.mib:.2f} MiB) of {dt} tensors",
        expected=f"<= {max_mb:g} MB",
        hint=("these fit: " + "; ".join(fits) + "; or raise --max-size-mb") if fits else
             "no width or vocabulary fits: raise --max-size-mb",
    )


def _fitting(cfg: Eagle3Config, budget: float, dtype: torch.dtype) -> list[tuple[int, int, Eagle3Config]]:
    """(intermediate, draft vocabulary, config) that fit ``budget`` bytes, changing one knob: the widest
    MLP (a multiple of 128) at this vocabulary, the largest vocabulary (a multiple of 256) at this width."""
    from dataclasses import replace

    out = []
    for knob, step in (("intermediate_size", 128), ("draft_vocab_size", 256)):
        at = lambda n: drafter_size(replace(cfg, **{knob: n}), dtype).bytes  # noqa: E731
        per = at(1) - at(0)  # bytes per unit of the knob (the size is linear in each)
        best = int((budget - at(0)) // per) // step * step
        best = min(best, cfg.vocab_size) if knob == "draft_vocab_size" else best
        if best >= step:
            c = replace(cfg, **{knob: best})
            out.append((c.intermediate_size, c.draft_vocab_size, c))
    return out


def save_drafter(net: Eagle3Network, out_dir: str | Path, *, target: ModelConfig, sglang_layer_ids: list[int],
                 dtype: torch.dtype = torch.bfloat16, provenance: dict[str, Any] | None = None) -> Path:
    """Write the drafter in the SGLang/SpecForge format: config.json (eagle_config ids in the SGLang
    convention, max_position_embeddings = the target's) and model.safetensors."""
    from eaglelab.engine.formats.draft_export import save_draft_checkpoint, sglang_config

    c = net.config
    cfg = sglang_config(
        hidden_size=c.hidden_size, vocab_size=c.vocab_size, draft_vocab_size=c.draft_vocab_size,
        aux_layer_ids=list(sglang_layer_ids), num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        intermediate_size=c.intermediate_size, target_hidden_size=c.target_hidden_size,
        max_position_embeddings=target.max_position_embeddings, rope_theta=c.rope_theta, rms_norm_eps=c.rms_norm_eps,
        fc_norm=c.fc_norm, norm_output=c.norm_output,  # EAGLE-3.1, top level as export writes them
        mla=c.mla,  # Eagle3DeepseekV2ForCausalLM, tensors layers.0.*
    )
    cfg["head_dim"] = c.head_dim
    cfg["rope_scaling"] = dict(c.rope_scaling) if c.rope_scaling else None
    cfg["torch_dtype"] = str(dtype).replace("torch.", "")
    out = save_draft_checkpoint(out_dir, cfg, drafter_tensors(net, dtype))
    if provenance is not None:
        from eaglelab.engine.formats.safe_write import write_atomic

        text = json.dumps(provenance, indent=2, default=str) + "\n"
        write_atomic(Path(out) / "eaglelab_training.json", lambda tmp: tmp.write_text(text), what="training record")
    return out
