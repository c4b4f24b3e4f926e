"""Self-distillation: the target's own greedy answers to the training prompts, as token ids only.

The prompts (chat template applied) are sorted by length and cut into batches of ``batch_size``
rows; each batch is generated with the engine (plain decoding, greedy, stop at EOS or
``max_new_tokens``; on CUDA its decode step replays a captured graph of ``batch_size`` rows, or of
as many as the length class below holds when that is fewer, e.g. ``--limit 10``) and written as one shard. Decode attends over the whole static cache, so the cache is sized per prompt
length class (:attr:`DistillSettings.prompt_buckets`: 64, 128, 192, 256, ``max_prompt_tokens``, each
with its own runner and graph, one held at a time): most prompts are short (SmolLM2's chat template,
our corpus: median ~56 tokens, 66% <= 64, 87% <= 128), and with 160-token answers their batches
attend over 232 slots instead of 680::

    OUT/shards/shard_00000.safetensors
        tokens      uint16 [N]    prompt + answer of every row, concatenated (int32 for vocabularies
                                  over 65536 ids): 50k answers of ~256 tokens fit in ~35 MB
        offsets     int64 [n+1]   row r is tokens[offsets[r]:offsets[r+1]]
        prompt_lens int32 [n]     the loss mask of row r is 1 from prompt_lens[r] on (the assistant's
                                  tokens, EOS included where the answer ended on it)
        indices     int64 [n]     the prompt's index in the prompts file
        hit_eos     uint8 [n]     1 where the answer ended on EOS, 0 where max_new_tokens cut it
    OUT/distill.json              target identity, settings, counts, time, throughput

A shard is written atomically once its batch is done, so a stopped run (``time_limit``, a crash)
resumes by skipping every prompt found in a shard. Nothing but token ids is stored: training
recomputes the target's hidden states online (``eaglelab train --online``).
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from eaglelab.engine.errors import CheckpointError, ConfigError

DISTILL_VERSION = 1
MANIFEST = "distill.json"
ProgressFn = Callable[["BatchReport"], None]


@dataclass(frozen=True)
class DistillSettings:
    """How to distill (the CLI's flags)."""

    max_new_tokens: int = 256
    batch_size: int = 512
    max_prompt_tokens: int = 512  # longer prompts are skipped (cutting a chat-templated prompt breaks it)
    time_limit: float | None = None  # seconds; no new batch starts when the next would overrun it
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "batch_size", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError("must be >= 1", field="--" + name.replace("_", "-"), found=getattr(self, name))
        if self.time_limit is not None and self.time_limit <= 0:
            raise ConfigError("must be > 0 seconds", field="--time-limit", found=self.time_limit)

    @property
    def prompt_buckets(self) -> tuple[int, ...]:
        """Prompt-length classes, each with its own static cache: 64, 128, 192, 256, then ``max_prompt_tokens``.
        Decode attends over the whole cache, so a class's slots set its step time; a new class costs one
        graph capture."""
        return tuple(sorted({min(b, self.max_prompt_tokens) for b in (64, 128, 192, 256)} | {self.max_prompt_tokens}))

    def cache_len(self, bucket: int) -> int:
        """Static cache slots for prompts up to ``bucket`` tokens: prompt, answer, the engine's margin."""
        return bucket + self.max_new_tokens + 8


@dataclass(frozen=True)
class BatchReport:
    """One finished batch, for progress."""

    shard: Path
    rows: int
    prompt_tokens: int
    new_tokens: int
    seconds: float
    done: int  # prompts done so far (this run and before)
    total: int


@dataclass(frozen=True)
class DistillSummary:
    """What a run did."""

    done_before: int
    done_now: int
    skipped_long: int
    remaining: int
    new_tokens: int
    seconds: float
    stopped_by_time: bool

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


# ---- shards ----------------------------------------------------------------------------------------


def shard_dir(out: str | Path) -> Path:
    return Path(out) / "shards"


def write_shard(path: Path, rows: list[tuple[int, list[int], list[int], bool]]) -> None:
    """Write (prompt index, prompt ids, answer ids, hit EOS) rows as one shard, atomically."""
    from safetensors.torch import save_file

    seqs = [p + a for _, p, a, _ in rows]
    offsets = torch.zeros(len(seqs) + 1, dtype=torch.long)
    offsets[1:] = torch.tensor([len(s) for s in seqs]).cumsum(0)
    flat = torch.tensor([t for s in seqs for t in s], dtype=torch.int32)
    small = flat.numel() == 0 or (int(flat.min()) >= 0 and int(flat.max()) < 65536)
    tensors = {
        "tokens": flat.to(torch.uint16) if small else flat,
        "offsets": offsets,
        "prompt_lens": torch.tensor([len(p) for _, p, _, _ in rows], dtype=torch.int32),
        "indices": torch.tensor([i for i, _, _, _ in rows], dtype=torch.long),
        "hit_eos": torch.tensor([int(e) for *_, e in rows], dtype=torch.uint8),
    }
    from eaglelab.engine.formats.safe_write import write_atomic

    meta = {"format": "eaglelab-distill", "version": str(DISTILL_VERSION)}
    write_atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta), what="distill shard")


def read_shard(path: Path) -> dict[str, torch.Tensor]:
    """A shard's tensors, checked: a clear error names the file and what is wrong."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        t = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise CheckpointError(f"cannot read the shard ({str(exc)[:160]})", file=path,
                              hint="delete it; `eaglelab distill` writes it again") from None
    need = ("tokens", "offsets", "prompt_lens", "indices")
    missing = [k for k in need if k not in t]
    if missing:
        raise CheckpointError("not a distill shard", file=path, field=missing[0], expected=", ".join(need))
    n = t["indices"].numel()
    if t["offsets"].numel() != n + 1 or int(t["offsets"][-1]) != t["tokens"].numel() or t["prompt_lens"].numel() != n:
        raise CheckpointError("shard tensors disagree", file=path, field="offsets",
                              found=f"{t['offsets'].numel()} offsets, {t['tokens'].numel()} tokens, {n} rows",
                              expected="n+1 offsets ending at the token count", hint="delete it and distill again")
    return t


def shard_paths(out: str | Path) -> list[Path]:
    return sorted(shard_dir(out).glob("shard_*.safetensors"))


def done_indices(out: str | Path) -> set[int]:
    """Prompt indices already in a shard (a resumed run skips them)."""
    done: set[int] = set()
    for path in shard_paths(out):
        done.update(read_shard(path)["indices"].tolist())
    return done


def _next_shard(out: Path) -> int:
    found = shard_paths(out)
    return int(found[-1].stem.split("_")[1]) + 1 if found else 0


# ---- the run -----------------------------------------------------------------------------------------


def plan_batches(lengths: dict[int, int], batch_size: int) -> list[list[int]]:
    """Prompt indices sorted by (length, index), cut into batches: rows of a batch have similar
    lengths, so little padding, and the plan is the same on every resume."""
    order = sorted(lengths, key=lambda i: (lengths[i], i))
    return [order[k: k + batch_size] for k in range(0, len(order), batch_size)]


def length_class(longest: int, buckets: tuple[int, ...]) -> int:
    """The prompt-length class of a batch whose longest prompt has ``longest`` tokens."""
    return min(b for b in buckets if b >= longest)


def class_rows(batches: list[list[int]], lengths: dict[int, int], buckets: tuple[int, ...]) -> dict[int, int]:
    """Rows of each length class's static cache and graph: its largest batch, so the batch size, or fewer
    where the class holds fewer prompts (every batch of a class fits its one graph bucket)."""
    rows: dict[int, int] = {}
    for batch in batches:
        c = length_class(max(lengths[i] for i in batch), buckets)
        rows[c] = max(rows.get(c, 0), len(batch))
    return rows


def batch_engine(model, eos_token_ids: tuple[int, ...], rows: int, max_len: int, cuda_graphs: bool):
    """A plain-decoding engine for batches of ``rows`` over a static cache of ``max_len`` slots, its decode
    graph of that many rows captured on first use (eager off CUDA or without ``cuda_graphs``)."""
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.engine.runtime.spec_config import SpecConfig

    runner = CudaGraphRunner(model, spec=SpecConfig(cuda_graphs=cuda_graphs), max_len=max_len, buckets=(rows,),
                             enabled=cuda_graphs)
    return Engine(model, eos_token_ids=eos_token_ids, runner=runner)


def free_device_memory() -> None:
    """After dropping engines: collect them now (an engine and its runner refer to each other) and give their
    graphs' pools and static caches back to the device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Distiller:
    """Generates the target's greedy answers batch by batch and writes shards."""

    def __init__(self, model, eos_token_ids: tuple[int, ...], settings: DistillSettings, *,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.model, self.eos, self.settings, self.clock = model, eos_token_ids, settings, clock
        self._engines: dict[tuple[int, int], Any] = {}  # (prompt bucket, rows) -> Engine with its own runner
        self._rows: dict[int, int] = {}  # prompt bucket -> rows of its cache in this run (class_rows)

    def engine(self, bucket: int):
        """The engine for prompts up to ``bucket`` tokens (its graph is captured on first use), its static
        cache and graph of the class's rows in this run (:func:`class_rows`; ``batch_size`` before a run).

        Batches run in increasing prompt length, so a new bucket's engine replaces the others: one
        static cache is held at a time (at 2048 rows the 512-token bucket's cache alone is ~34 GB
        for SmolLM2-135M in bfloat16)."""
        s = self.settings
        key = (bucket, self._rows.get(bucket, s.batch_size))
        if key not in self._engines:
            self._release()
            self._engines[key] = batch_engine(self.model, self.eos, key[1], s.cache_len(bucket), s.cuda_graphs)
        return self._engines[key]

    def _release(self) -> None:
        """Drop every engine (their graphs and static caches) and give the memory back to the device."""
        if self._engines:
            self._engines.clear()
            free_device_memory()

    @property
    def graph_status(self) -> str:
        """Why decode replays a graph or runs eagerly (shown to the user)."""
        reason = self.engine(self.settings.prompt_buckets[0]).runner.disabled_reason
        return reason or (f"replay: decode graphs of up to {self.settings.batch_size} rows (fewer where a length class "
                          f"holds fewer prompts), static caches for prompts up to "
                          f"{'/'.join(map(str, self.settings.prompt_buckets))} tokens")

    def run(self, prompt_ids: list[list[int] | None], out: str | Path, progress: ProgressFn | None = None,
            select: range | None = None) -> DistillSummary:
        """Distill every prompt not yet in a shard of ``out``; stop early at the time limit. ``select``: only these
        indices (a part of a mix, :mod:`~eaglelab.engine.training.distill_mix`; its shards share ``out``); a
        None prompt is not available yet (a second turn whose first answer is not distilled) and is left."""
        out, s = Path(out), self.settings
        t0 = self.clock()
        before = done_indices(out)
        mine = [(i, prompt_ids[i]) for i in (select if select is not None else range(len(prompt_ids)))]
        before = before & {i for i, _ in mine} if select is not None else before
        lengths = {i: len(p) for i, p in mine if p is not None and i not in before and len(p) <= s.max_prompt_tokens}
        skipped_long = sum(1 for i, p in mine if p is not None and i not in before and len(p) > s.max_prompt_tokens)
        batches = plan_batches(lengths, s.batch_size)
        self._rows = class_rows(batches, lengths, s.prompt_buckets)
        shard, done, new_tokens, last = _next_shard(out), len(before), 0, 0.0
        total, stopped = len(before) + len(lengths), False
        for batch in batches:
            elapsed = self.clock() - t0
            if s.time_limit is not None and elapsed + last > s.time_limit:
                stopped = True
                break
            b0 = self.clock()
            rows = self._generate(prompt_ids, batch)
            path = shard_dir(out) / f"shard_{shard:05d}.safetensors"
            write_shard(path, rows)
            last = self.clock() - b0
            shard, done = shard + 1, done + len(rows)
            n_new = sum(len(a) for _, _, a, _ in rows)
            new_tokens += n_new
            if progress:
                progress(BatchReport(path, len(rows), sum(len(p) for _, p, _, _ in rows), n_new, last, done, total))
        remaining = total - done
        return DistillSummary(len(before), done - len(before), skipped_long, remaining, new_tokens,
                              self.clock() - t0, stopped)

    def _generate(self, prompt_ids: list[list[int]], batch: list[int]) -> list[tuple[int, list[int], list[int], bool]]:
        prompts = [prompt_ids[i] for i in batch]
        longest = max(len(p) for p in prompts)
        bucket = length_class(longest, self.settings.prompt_buckets)
        res = self.engine(bucket).generate(prompts, self.settings.max_new_tokens)
        return [(i, p, a, r == "eos") for i, p, a, r in zip(batch, prompts, res.tokens, res.stop_reasons)]


# ---- manifest ----------------------------------------------------------------------------------------


def write_manifest(out: str | Path, manifest: dict[str, Any]) -> Path:
    from eaglelab.engine.training.capture import write_json_atomic

    return write_json_atomic(Path(out) / MANIFEST, manifest)


def read_manifest(out: str | Path) -> dict[str, Any] | None:
    from eaglelab.engine.errors import read_json_object

    path = Path(out) / MANIFEST
    return read_json_object(path) if path.exists() else None


def update_manifest(out: str | Path, base: dict[str, Any], summary: DistillSummary, settings: DistillSettings) -> dict:
    """Merge this run into ``distill.json``: settings, counts over all shards, runs (time, throughput)."""
    old = read_manifest(out) or {}
    counts = {"samples": 0, "tokens": 0, "answer_tokens": 0, "hit_eos": 0, "shards": 0}
    for path in shard_paths(out):
        t = read_shard(path)
        counts["samples"] += t["indices"].numel()
        counts["tokens"] += t["tokens"].numel()
        counts["answer_tokens"] += t["tokens"].numel() - int(t["prompt_lens"].sum())
        counts["hit_eos"] += int(t["hit_eos"].sum()) if "hit_eos" in t else 0
        counts["shards"] += 1
    runs = list(old.get("runs", [])) + [{
        "done": summary.done_now, "new_tokens": summary.new_tokens, "seconds": round(summary.seconds, 2),
        "tokens_per_second": round(summary.tokens_per_second, 1), "stopped_by_time": summary.stopped_by_time,
        **base.get("run", {}),
    }]
    manifest = {**old, **{k: v for k, v in base.items() if k != "run"}, "distill_version": DISTILL_VERSION,
                "format": "eaglelab-distill", "settings": asdict(settings), "counts": counts,
                "skipped_long_prompts": summary.skipped_long, "remaining": summary.remaining,
                "status": "complete" if summary.remaining == 0 else "incomplete", "runs": runs}
    write_manifest(out, manifest)
    return manifest
