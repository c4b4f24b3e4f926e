"""Tensor parallelism: the process group handle, sharded linears, one all-reduce, failure handling.

With ``tp=None`` (a single process) every layer here is a plain linear and no collective runs.
Column-parallel linears split their output features over ranks, row-parallel ones their input
features; the model calls :meth:`TPGroup.all_reduce` visibly in its forward after each
row-parallel projection (attention output, MLP / MoE output): two all-reduces per layer, plus one
for the embedding and an all-gather of the logits. These calls are the one place the all-reduce
probe times.

What is sharded and what is not, and why:

- Attention heads (q/k/v column-parallel by head, o row-parallel), dense MLP and shared experts
  (gate/up column-parallel, down row-parallel), routed experts (each expert's intermediate width
  split, see ``engine/model/moe.py``).
- The embedding and the LM head are **sharded over the vocabulary** (as SGLang does), ceil(V / world)
  rows per rank. Replicating them was the alternative (no collective, bitwise head logits); it loses
  on time as soon as the head's weight read dominates its collective's latency. Measured with 2 gloo
  ranks on CPU, default model (V 49152, H 576), median of 50: one decode token, full head 25-28 ms,
  half head + logits all-gather 15-18 ms; 8 tokens (a verify), 85-87 ms against 55-56 ms. On an
  H200 (bf16, one token, the head matmul alone): default model 32 us full, 24 us half; Kimi-K2's
  head (V 163840, H 7168, 2.3 GB) 560 us full, 334 us half, 97 us an eighth, against an all-gather
  of a few tens of microseconds over NVLink (not measured here: one GPU was lent).
  Costs: the logits all-gather (B*T*V values per forward, site ``"head"``) and one all-reduce of the
  embedded rows (B*T*H, site ``"embed"``, exact: one row plus zeros); tied models share the shard.
- The EAGLE-3 drafter is **replicated** (built per rank from the same weights, see
  ``session.py``): it is one decoder layer whose work is tiny next to the target's; sharding it
  would add two all-reduces per draft step (num_steps per cycle) whose latency exceeds the compute
  saved, and its inputs (token ids, the target's aux hidden states, which are full-width after the
  target's all-reduces) are already identical on every rank, so every rank drafts the same tree.
  Its one collective is the lookup in the target's (vocab-sharded) embedding it shares.

Failures: a rank that raises inside :meth:`TPGroup.guard` publishes its error in the rendezvous
store and tears its process group down, which makes peers blocked in a collective fail at once
(gloo; NCCL peers fail at the group's timeout, and under torchrun the agent stops them anyway);
each peer then raises :class:`TPError` naming the failing rank and its error. Blocks that succeed
end at a safe point: an all-reduced failure flag over a gloo side group.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from eaglelab.engine.errors import EagleLabError
from eaglelab.engine.runtime.observer import AllReduceStats

# Called for each timed all-reduce: (layer, site, nbytes, ms, phase, in_graph) -> None.
AllReduceHook = Callable[[int, str, int, float, str, bool], None]

_SEP = "\x1f"


class TPError(EagleLabError):
    """Another rank of the tensor-parallel group failed; this rank stopped because of it."""


@dataclass
class _Timer:
    """One all-reduce timed with CUDA events, read later (after a sync the engine does anyway)."""

    layer: int
    site: str
    nbytes: int
    start: Any  # torch.cuda.Event
    end: Any


@dataclass
class TPGroup:
    """This process's place in a tensor-parallel group.

    ``hook`` (set through :func:`observe_allreduce`) turns timing on for the collectives run inside
    an engine phase (:meth:`in_phase`, which also names the phase); those outside any phase (a graph
    runner's warm-up at cache set-up) are not timed. ``side`` is a gloo group for CPU-side agreement
    (failure flags, gathering probe results) whatever the main backend.
    """

    rank: int
    world_size: int
    group: Any = None  # torch.distributed ProcessGroup (None: the default group)
    hook: AllReduceHook | None = field(default=None, repr=False)
    phase: str = "decode"
    local_rank: int = 0
    backend: str = "gloo"
    side: Any = field(default=None, repr=False)
    store: Any = field(default=None, repr=False)  # the rendezvous store (a PrefixStore)
    _pending: list[tuple[_Timer, str, bool]] = field(default_factory=list, repr=False)
    _graph_timers: dict[Any, list[_Timer]] = field(default_factory=dict, repr=False)
    _capturing: Any = field(default=None, repr=False)
    _broken: BaseException | None = field(default=None, repr=False)
    _phase_depth: int = field(default=0, repr=False)

    # ---- the all-reduce ----------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor, layer: int, site: str) -> torch.Tensor:
        """Sum ``x`` over ranks in place and return it; timed when a hook is set."""
        self._collective(lambda: dist.all_reduce(x, group=self.group), x.numel() * x.element_size(), layer, site)
        return x

    def all_gather(self, x: torch.Tensor, layer: int, site: str) -> torch.Tensor:
        """``x`` [..., n] of every rank side by side: [..., world * n] (rank order); timed like all_reduce."""
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        self._collective(lambda: dist.all_gather(parts, x.contiguous(), group=self.group),
                         x.numel() * x.element_size() * self.world_size, layer, site)
        return torch.cat(parts, dim=-1)

    def _collective(self, run: Callable[[], Any], nbytes: int, layer: int, site: str) -> None:
        """Run one collective; with the probe on, time it (wall clock on CPU, CUDA events on GPU)."""
        if self.hook is None:
            run()
            return
        if self.backend == "gloo":  # synchronous on the host: the wall clock is the collective's time
            t0 = time.perf_counter()
            run()
            if self._phase_depth:
                self.hook(layer, site, nbytes, (time.perf_counter() - t0) * 1e3, self.phase, False)
            return
        capturing, marked = torch.cuda.is_current_stream_capturing(), self._capturing is not None
        if capturing != marked or not (capturing or self._phase_depth):
            run()  # a capture nobody marked (its replays would go unseen), a warm-up, or outside any phase
            return
        timer = _Timer(layer, site, nbytes, *_event_pair(external=capturing))
        timer.start.record()
        run()
        timer.end.record()
        if capturing:  # events captured into the graph, recorded by every replay
            self._graph_timers.setdefault(self._capturing, []).append(timer)
        else:
            self._pending.append((timer, self.phase, False))

    def shard(self, size: int, what: str) -> int:
        """This rank's share of ``size``; ``size`` must divide evenly."""
        assert size % self.world_size == 0, f"{what}={size} does not split over {self.world_size} ranks"
        return size // self.world_size

    def split(self, size: int, what: str = "size") -> tuple[int, int]:
        """(start, length) of this rank's part of ``size`` split as evenly as possible (the first
        ``size % world`` ranks get one more)."""
        return even_split(size, self.world_size, self.rank, what)

    # ---- phases and timings ------------------------------------------------------------------
    @contextlib.contextmanager
    def in_phase(self, name: str) -> Iterator[None]:
        """Tag the all-reduces inside the block with phase ``name``."""
        previous, self.phase = self.phase, name
        self._phase_depth += 1
        try:
            yield
        finally:
            self.phase = previous
            self._phase_depth -= 1

    @contextlib.contextmanager
    def capture(self, key: Any) -> Iterator[None]:
        """Around a CUDA-graph capture (warm-up included) of graph ``key``.

        With the probe on, each all-reduce captured gets a pair of CUDA events captured with it
        (external events: recorded by every replay); warm-up runs are not timed.
        """
        self._graph_timers.pop(key, None)
        previous, self._capturing = self._capturing, key
        try:
            yield
        finally:
            self._capturing = previous

    def replayed(self, key: Any) -> None:
        """After a replay of graph ``key``: its captured all-reduce events are read at the next flush."""
        for timer in self._graph_timers.get(key, ()):
            self._pending.append((timer, self.phase, True))

    def flush_timings(self) -> None:
        """Hand the CUDA-event timings recorded since the last flush to the hook.

        Call after a point where the device is synchronised anyway (the engine's end of cycle):
        the one ``synchronize`` here then returns at once. A graph replayed twice between flushes
        reports its last replay twice.
        """
        pending, self._pending = self._pending, []
        if not pending or self.hook is None:
            return
        pending[-1][0].end.synchronize()
        for timer, phase, in_graph in pending:
            self.hook(timer.layer, timer.site, timer.nbytes, timer.start.elapsed_time(timer.end), phase, in_graph)

    # ---- failures ----------------------------------------------------------------------------
    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Run a block every rank runs; if any rank raises in it, every rank raises, none hangs.

        The rank whose code raised first re-raises its own exception; the others raise
        :class:`TPError` naming it. A block that succeeds everywhere ends at a safe point where
        all ranks agree that none failed.
        """
        if self._broken is not None:
            raise self._broken
        try:
            yield
        except Exception as exc:
            err = self._fail(what, exc)
            if err is exc:
                raise
            raise err from exc
        self.check(what)

    def check(self, what: str) -> None:
        """A safe point: all ranks all-reduce a flag over the gloo side group. A rank that failed
        never arrives (it tore its groups down), so the others' all-reduce fails, and they raise."""
        flag = torch.zeros(1)
        try:
            dist.all_reduce(flag, group=self.side)
        except RuntimeError as exc:  # a peer tore its group down: it failed
            raise self._fail(what, exc) from exc

    def _fail(self, what: str, exc: BaseException) -> BaseException:
        """Publish or learn the first failure, tear the group down; the exception this rank raises."""
        if self._broken is not None:
            return self._broken
        first = None
        if self.store is not None:
            try:
                first = self._publish_or_read(what, exc)
            except RuntimeError:  # the store's host is gone too: report this rank's own error
                first = None
        self._abort()
        if first is None or first[0] == str(self.rank):
            self._wait_for_acks()
            self._broken = exc
            return exc
        rank, when, message = first
        self._broken = TPError(
            f"rank {rank} of {self.world_size} failed during {when}: {message}",
            found=f"rank {self.rank} stopped because of it",
            hint=f"rank {rank}'s output has the error's traceback",
        )
        return self._broken

    def _publish_or_read(self, what: str, exc: BaseException) -> list[str]:
        if self.store.add("failed", 1) == 1:
            first = [str(self.rank), what, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"]
            self.store.set("first", _SEP.join(first))
            return first
        self.store.wait(["first"], timedelta(seconds=10))
        self.store.add("acks", 1)
        return self.store.get("first").decode().split(_SEP, 2)

    def _wait_for_acks(self, seconds: float = 60.0) -> None:
        """Rank 0 hosts the store unless torchrun's agent does: if it failed first, it keeps the
        store up until the others have read the failure (or ``seconds`` passed)."""
        if self.rank != 0 or self.store is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            return
        deadline = time.monotonic() + seconds
        with contextlib.suppress(RuntimeError):
            while self.store.add("acks", 0) < self.world_size - 1:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.01)

    def _abort(self) -> None:
        if dist.is_initialized():
            with contextlib.suppress(RuntimeError):
                dist.destroy_process_group()

    # ---- objects and shutdown ----------------------------------------------------------------
    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank (over the side group)."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.side)
        return out

    def close(self) -> None:
        """Leave the group (after a run; a broken group was torn down already)."""
        if self._broken is None and dist.is_initialized():
            dist.destroy_process_group()


def _event_pair(external: bool) -> tuple[Any, Any]:
    kw = {"enable_timing": True, "external": True} if external else {"enable_timing": True}
    return torch.cuda.Event(**kw), torch.cuda.Event(**kw)


def init_tp(
    backend: str = "auto",
    *,
    device: str = "auto",
    rank: int | None = None,
    world_size: int | None = None,
    local_rank: int | None = None,
    init_method: str | None = None,
    timeout_s: float = 600.0,
) -> TPGroup:
    """Join the tensor-parallel group: from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT), or from ``rank``/``world_size``/``init_method`` (tests).

    ``backend``: "nccl" | "gloo" | "auto" (NCCL when CUDA is there and ``device`` is not "cpu").
    ``timeout_s`` bounds how long a collective waits for a peer.
    """
    if rank is None:
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise EagleLabError(
                "tensor parallelism needs one process per rank", field="--tp", found=f"no {', '.join(missing)} set",
                hint="launch with torchrun: torchrun --nproc-per-node N -m eaglelab run --tp N ...",
            )
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
    assert world_size is not None, "world_size is needed with an explicit rank"
    local_rank = rank if local_rank is None else local_rank
    if backend == "auto":
        backend = "nccl" if device != "cpu" and torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group(backend, init_method=init_method or "env://", rank=rank, world_size=world_size,
                            timeout=timeout)
    side = dist.new_group(backend="gloo", timeout=timeout)
    store = dist.PrefixStore("eaglelab/tp/", dist.distributed_c10d._get_default_store())
    return TPGroup(rank, world_size, local_rank=local_rank, backend=backend, side=side, store=store)


# ---- several ranks in one test ----------------------------------------------------------------
@dataclass(frozen=True)
class RankFailure:
    """What a rank's function raised, as :func:`spawn_ranks` returns it."""

    type_name: str
    message: str
    is_tp_error: bool


def spawn_ranks(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
                timeout_s: float = 120.0, start_method: str | None = None) -> list[Any]:
    """Run ``fn(tp, *args)`` in ``world_size`` local processes joined in one TP group (tests, examples).

    Returns each rank's result in rank order (results must pickle); a rank whose ``fn`` raised
    gives a :class:`RankFailure`. ``start_method`` defaults to ``fork`` for gloo on Linux while
    CUDA is not initialised here (no re-import of torch per rank), else ``spawn`` (``fn`` must then
    be importable). Ranks still running after ``timeout_s`` are killed and an AssertionError raised.
    """
    import multiprocessing as mp
    import queue
    import socket
    import sys

    if start_method is None:  # CUDA in a forked child is undefined once the parent touched the driver
        start_method = "fork" if backend == "gloo" and sys.platform == "linux" and not torch.cuda.is_initialized() else "spawn"
    if start_method == "fork":  # pay torch's lazy meta-device set-up (seconds) once, not once per rank
        with torch.device("meta"):
            torch.empty(1).normal_()
    ctx = mp.get_context(start_method)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results: Any = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(fn, r, world_size, port, backend, timeout_s, args, results), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < world_size:
            rank, value = results.get(timeout=max(0.1, deadline - time.monotonic()))
            out[rank] = value
    except queue.Empty:
        raise AssertionError(f"ranks {sorted(set(range(world_size)) - set(out))} gave no result in {timeout_s} s") from None
    finally:
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world_size)]


def _rank_main(fn, rank, world_size, port, backend, timeout_s, args, results) -> None:
    torch.set_num_threads(1)  # a forked child must not reuse the parent's OpenMP pool; 1 core each anyway
    tp = init_tp(backend, rank=rank, world_size=world_size, init_method=f"tcp://127.0.0.1:{port}",
                 timeout_s=timeout_s)
    try:
        value = fn(tp, *args)
    except Exception as exc:  # reported to the parent as data, not swallowed
        value = RankFailure(type(exc).__name__, str(exc), isinstance(exc, TPError))
    results.put((rank, value))
    with contextlib.suppress(RuntimeError):
        tp.close()


# ---- wiring the probe ------------------------------------------------------------------------
def observe_allreduce(tp: TPGroup, observer: Any) -> None:
    """Time every all-reduce and send it to ``observer.on_allreduce``; ``None`` turns timing off."""
    if observer is None:
        tp.hook = None
        return

    def hook(layer: int, site: str, nbytes: int, ms: float, phase: str, in_graph: bool) -> None:
        observer.on_allreduce(AllReduceStats(layer, site, nbytes, ms, tp.rank, tp.world_size, phase, in_graph))

    tp.hook = hook


class TPPhaseClock:
    """Wraps an engine's phase clock: tags all-reduces with the phase running and reads the TP
    group's CUDA-event timings at each ``collect`` (the engine's end-of-cycle sync point)."""

    def __init__(self, clock: Any, tp: TPGroup) -> None:
        self.clock, self.tp = clock, tp

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with self.tp.in_phase(name), self.clock.phase(name):
            yield

    def collect(self) -> dict[str, float]:
        out = self.clock.collect()
        self.tp.flush_timings()
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.clock, name)


def attach_probe(tp: TPGroup, engine: Any, observer: Any) -> None:
    """Wire ``engine``'s TP group to ``observer`` (None: timing off) and phase-tag its all-reduces."""
    observe_allreduce(tp, observer)
    if observer is not None and not isinstance(engine.clock, TPPhaseClock):
        engine.clock = TPPhaseClock(engine.clock, tp)


# ---- sharded layers --------------------------------------------------------------------------
def even_split(size: int, world: int, rank: int, what: str = "size") -> tuple[int, int]:
    """(start, length) of part ``rank`` of ``size`` split in ``world`` near-equal parts."""
    base, extra = divmod(size, world)
    assert base > 0, f"{what}={size} is smaller than the {world} ranks it should split over"
    return rank * base + min(rank, extra), base + (rank < extra)


@dataclass(frozen=True)
class HeadSplit:
    """The attention heads one rank owns: query heads [q_start, q_start + q_len), KV likewise."""

    q_start: int
    q_len: int
    kv_start: int
    kv_len: int


def head_split(num_heads: int, num_kv_heads: int, tp: TPGroup | None) -> HeadSplit:
    """Split attention heads over ranks by whole GQA groups (a KV head with its query heads).

    With at least as many KV heads as ranks, each rank owns a near-even run of groups (9 heads /
    3 KV heads over 2 ranks: 6 + 3 query heads, 2 + 1 KV heads; uneven, but every head computes
    exactly once). With fewer KV heads than ranks, the query heads split evenly and each rank keeps
    a copy of the one KV head its query heads read (the world size must be a multiple of the KV
    head count).
    """
    if tp is None:
        return HeadSplit(0, num_heads, 0, num_kv_heads)
    group = num_heads // num_kv_heads
    if num_kv_heads >= tp.world_size:
        kv_start, kv_len = tp.split(num_kv_heads, "num_key_value_heads")
        return HeadSplit(kv_start * group, kv_len * group, kv_start, kv_len)
    assert tp.world_size % num_kv_heads == 0 and num_heads % tp.world_size == 0, (
        f"{num_heads} heads / {num_kv_heads} KV heads do not split over {tp.world_size} ranks"
    )
    q_len = num_heads // tp.world_size
    q_start = tp.rank * q_len
    return HeadSplit(q_start, q_len, q_start // group, 1)


EMBED_LAYER = -1  # the layer id the embedding's all-reduce reports; the head reports num_layers


def _vocab_shard(vocab: int, tp: TPGroup | None) -> int:
    """Rows per rank: ceil(V / world); the last rank's tail rows are zero padding."""
    return -(-vocab // tp.world_size) if tp else vocab


class VocabParallelEmbedding(nn.Module):
    """Token embedding, vocabulary split over ranks: [ceil(V / world), H] per rank.

    Each rank looks up the ids in its range (zero rows for the others) and the all-reduce
    (site ``"embed"``, layer -1) assembles every row: exact, a sum of one row and zeros.
    """

    def __init__(self, vocab_size: int, hidden_size: int, tp: TPGroup | None) -> None:
        super().__init__()
        self.tp, self.vocab_size = tp, vocab_size
        self.local_vocab = _vocab_shard(vocab_size, tp)
        self.start = tp.rank * self.local_vocab if tp else 0
        self.weight = nn.Parameter(torch.empty(self.local_vocab, hidden_size))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp is None:
            return nn.functional.embedding(ids, self.weight)  # [B, T, H]
        local = ids - self.start
        outside = (local < 0) | (local >= self.local_vocab)  # [B, T]
        x = nn.functional.embedding(local.clamp(0, self.local_vocab - 1), self.weight)  # [B, T, H]
        x = x.masked_fill(outside[..., None], 0.0)
        return self.tp.all_reduce(x, EMBED_LAYER, "embed")

    def shard_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's rows of the full [V, H] table (zero-padded to world * local rows)."""
        return _vocab_rows(full, self.tp, self.local_vocab)


class ParallelLMHead(nn.Module):
    """LM head, vocabulary split over ranks; the logits are all-gathered (site ``"head"``).

    Each rank computes the logits of its vocabulary rows ([..., V / world]); sampling and
    acceptance need all of them on every rank, hence the all-gather, B*T*V values per forward.
    Shares its weight with :class:`VocabParallelEmbedding` when the model ties them.
    """

    def __init__(self, hidden_size: int, vocab_size: int, tp: TPGroup | None, layer: int) -> None:
        super().__init__()
        self.tp, self.vocab_size, self.layer = tp, vocab_size, layer
        self.local_vocab = _vocab_shard(vocab_size, tp)
        self.weight = nn.Parameter(torch.empty(self.local_vocab, hidden_size))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        y = nn.functional.linear(hidden, self.weight)  # [..., V_local]
        if self.tp:
            y = self.tp.all_gather(y, self.layer, "head")[..., : self.vocab_size]  # [..., V]
        return y

    def shard_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        return _vocab_rows(full, self.tp, self.local_vocab)


def _vocab_rows(full: torch.Tensor, tp: TPGroup | None, local_vocab: int) -> torch.Tensor:
    if tp is None:
        return full
    padded = torch.zeros(local_vocab * tp.world_size, *full.shape[1:], dtype=full.dtype)
    padded[: full.shape[0]] = full
    return padded.chunk(tp.world_size, dim=0)[tp.rank]


class ColumnParallelLinear(nn.Module):
    """y = x W^T with W's rows (output features) split over ranks: [local_out, in].

    ``rows`` = (start, length) picks this rank's rows (attention: whole heads); by default the
    output features split near-evenly.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool, tp: TPGroup | None, what: str = "",
                 rows: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.full_out = out_features
        self.rows = rows or (tp.split(out_features, what or "out_features") if tp else (0, out_features))
        self.weight = nn.Parameter(torch.empty(self.rows[1], in_features))
        self.bias = nn.Parameter(torch.empty(self.rows[1])) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight, self.bias)

    def shard_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a full checkpoint tensor (weight [out, in] or bias [out])."""
        return full if self.tp is None else full.narrow(0, *self.rows)


class RowParallelLinear(nn.Module):
    """y_partial = x_local W_local^T with W's columns (input features) split: [out, local_in].

    The caller all-reduces the result (visibly, in the model's forward). A bias is added once,
    after the reduction, by the caller; row-parallel projections in our models have none.
    ``cols`` = (start, length) picks this rank's columns (by default a near-even split).
    """

    def __init__(self, in_features: int, out_features: int, tp: TPGroup | None, what: str = "",
                 cols: tuple[int, int] | None = None) -> None:
        super().__init__()
        self.tp = tp
        self.cols = cols or (tp.split(in_features, what or "in_features") if tp else (0, in_features))
        self.weight = nn.Parameter(torch.empty(out_features, self.cols[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.weight)

    def shard_of(self, name: str, full: torch.Tensor) -> torch.Tensor:
        return full if self.tp is None else full.narrow(1, *self.cols)
