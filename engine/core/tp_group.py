"""The tensor-parallel group: this process's place in it, the timed collectives, failure handling.

The model calls :meth:`TPGroup.all_reduce` visibly in its forward after each row-parallel
projection (the sharded layers are in ``engine/model/tp_layers.py``); these calls are the one place
the all-reduce probe times (:func:`eaglelab.engine.runtime.timing.observe_allreduce` sets the hook,
the engine's :class:`~eaglelab.engine.runtime.timing.PhaseClock` names the phase and reads the
CUDA-event timings at the end of each cycle).

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
import zlib
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from eaglelab.engine.errors import EagleLabError

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
    # Measurement switches (the bench's, off by default): ``noop`` skips every collective (the tensor
    # keeps this rank's partial values: same shapes and kernels, wrong numbers) to time a step without
    # its all-reduces; ``arrivals``, when a list, gets (wall-clock ms on entering, on leaving, layer,
    # site) for each collective (one host, one clock: comparable across ranks).
    noop: bool = field(default=False, repr=False)
    arrivals: list[tuple[float, float, int, str]] | None = field(default=None, repr=False)
    # Debug (``--tp-check``): the engine asserts that replicated work (the drafter's tree) is the same
    # on every rank, with one host sync and a gather of a checksum per cycle.
    check_replicas: bool = False

    # ---- the all-reduce ----------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor, layer: int, site: str) -> torch.Tensor:
        """Sum ``x`` over ranks in place and return it; timed when a hook is set."""
        self._collective(lambda: dist.all_reduce(x, group=self.group), x.numel() * x.element_size(), layer, site)
        return x

    def all_gather(self, x: torch.Tensor, layer: int, site: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``x`` [..., n] of every rank side by side: [..., world * n] (rank order), in ``dtype`` (default
        ``x``'s); timed like all_reduce.

        One collective into one [world, ..., n] buffer, then one copy that interleaves the ranks' parts
        and converts the dtype (the logits' float32): two kernels after the matmul. A list all-gather
        copied each part out of the collective's buffer, then concatenated them, then converted."""
        x = x.contiguous()
        flat = x.new_empty((self.world_size * x.shape[0], *x.shape[1:]))  # the ranks' x, one after the other
        self._collective(lambda: dist.all_gather_into_tensor(flat, x, group=self.group),
                         x.numel() * x.element_size() * self.world_size, layer, site)
        out = torch.empty((*x.shape[:-1], self.world_size, x.shape[-1]), dtype=dtype or x.dtype, device=x.device)
        out.copy_(flat.view(self.world_size, *x.shape).movedim(0, -2))  # [..., world, n]
        return out.flatten(-2)  # [..., world * n]

    def _collective(self, run: Callable[[], Any], nbytes: int, layer: int, site: str) -> None:
        """Run one collective; with the probe on, time it (wall clock on CPU, CUDA events on GPU).
        Inside a phase being compiled (``--compile``) it is not timed: clocks, events and capture queries
        cannot be traced, so a compiled phase's collectives run untimed (the session says so)."""
        if torch.compiler.is_compiling():
            if not self.noop:
                run()
            return
        if self.arrivals is not None:
            enter = time.time() * 1e3
            self._timed(run, nbytes, layer, site)
            self.arrivals.append((enter, time.time() * 1e3, layer, site))
        else:
            self._timed(run, nbytes, layer, site)

    def _timed(self, run: Callable[[], Any], nbytes: int, layer: int, site: str) -> None:
        if self.noop:
            return
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

    @contextlib.contextmanager
    def collectives_off(self) -> Iterator[None]:
        """Inside the block every collective is a no-op (graphs captured inside keep none): for
        timing a step without its all-reduces on the same ranks. Outputs are wrong meanwhile."""
        previous, self.noop = self.noop, True
        try:
            yield
        finally:
            self.noop = previous

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
        """After a replay of graph ``key``: its captured all-reduce events are read at the next flush
        (and, when arrivals are kept, the replay's launch is one: where the ranks' host loops meet)."""
        if self.arrivals is not None:
            now = time.time() * 1e3
            self.arrivals.append((now, now, -2, f"graph {key[0] if isinstance(key, tuple) else key}"))
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

    def assert_same(self, t: torch.Tensor, what: str) -> None:
        """Debug check that ``t`` is bitwise the same on every rank (a CRC32 of its bytes, gathered
        over the side group: one host sync). Raises AssertionError on every rank when not."""
        data = t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()
        digests = self.gather_objects(zlib.crc32(data))
        assert len(set(digests)) == 1, (
            f"{what} differ across ranks (CRC32 per rank {digests}): replicated work diverged")

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
    # The communicator sets itself up on its first collective (NCCL: hundreds of ms, unevenly per rank):
    # do it here, so the first forward's first all-reduce does not absorb it as arrival skew.
    warm = torch.zeros(1, device=torch.device("cuda", local_rank) if backend == "nccl" else "cpu")
    dist.all_reduce(warm)
    if backend == "nccl":
        torch.cuda.synchronize(local_rank)
    return TPGroup(rank, world_size, local_rank=local_rank, backend=backend, side=side, store=store)


def even_split(size: int, world: int, rank: int, what: str = "size") -> tuple[int, int]:
    """(start, length) of part ``rank`` of ``size`` split in ``world`` near-equal parts."""
    base, extra = divmod(size, world)
    assert base > 0, f"{what}={size} is smaller than the {world} ranks it should split over"
    return rank * base + min(rank, extra), base + (rank < extra)
