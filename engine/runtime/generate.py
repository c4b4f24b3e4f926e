"""The generation loop: prefill, then plain decode steps or speculative cycles.

State lives in fixed device buffers (:class:`~.loop_state.Batch`); positions advance in one place
(:func:`~.loop_state.emit_and_advance`, run inside the decode phase and the advance phase). Per row: ``lengths[b]``
tokens are in the target's KV cache and ``root[b]``, the last token emitted, is not yet (the next step computes it).

A speculative cycle, listed once in :func:`~.cycle.speculative_cycle` and run phase by phase
(:class:`~.cycle.EagerPhases`: each phase one ``runner.phase``, one CUDA graph per batch bucket under the graph
runner, so a cycle is five graph launches and the stop check)::

    draft         the drafter proposes a tree of N tokens per row (node 0 = root)
    verify        the target runs all N at slots lengths..lengths+N-1, positions lengths+depth; logits
    accept        greedy / rejection acceptance; accepted KV compacted onto consecutive slots
    draft_extend  the drafter catches up on the accepted tokens with the target's aux features
    advance       the accepted tokens emitted (up to EOS and max_new), lengths and root moved

With an EAGLE-3 drafter and decode-mode verify (``SpecConfig.one_graph_cycle``, the default; not under TP) the
five run as ONE phase, ``cycle`` (:meth:`Engine._one_graph_cycle`): the same listing over the same functions
(:class:`~.cycle.GraphParts`), one graph launch per cycle, the observer's phase times taken inside it
(:class:`PartMarks`).

The per-row state the phases update (lengths, root, out, n_out, done, hit_eos, limit) is bound to
the graphs (``runner.make_state``), never copied in or out. The stop check reads the state of the step before the
last one launched (:class:`StepReader`, on CUDA): the host queues the next step while the device runs this one. A row
stopped by EOS can leave one step launched after every row finished, which changes nothing; rows stopped by
max_new_tokens leave none (after max_new_tokens - 1 steps every row is done: the loop launches no more).

Graph capture and compilation that happen during a run (lazily, on first use) are timed apart (``setup_seconds``) and
never counted in the run's seconds or tok/s; so is a warm-up (``generate(warm_up=N)``: N tokens of the same prompts
first, unobserved, so a first request's one-time costs happen before the clock).
"""

from __future__ import annotations

import gc
import platform
import sys
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Callable

import torch

from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.model.layers import prefix_mask
from eaglelab.engine.model.model import Transformer
from eaglelab.engine.runtime import cycle_ops
from eaglelab.engine.runtime.contracts import Drafter, FusableDrafter, PhaseParts, Runner
from eaglelab.engine.runtime.cycle import EagerPhases, GraphParts, speculative_cycle
from eaglelab.engine.runtime.limits import check_memory, kv_cache_bytes
from eaglelab.engine.runtime import serving, shrink
from eaglelab.engine.runtime.loop_state import Batch, emit_and_advance, emit_tokens, loop_state, read_rows
from eaglelab.engine.runtime.observer import CycleStats, Observer, RunInfo, RunSummary, json_values
from eaglelab.engine.runtime.readback import Staged, Stager, StepReader, StepView, upload
from eaglelab.engine.runtime.reasons import EAGER_NO_CUDA, EAGER_NO_RUNNER, EAGER_OFF, SOURCE_RUNNER, eager_warning
from eaglelab.engine.runtime.runner import FORWARD_PHASES, EagerRunner
from eaglelab.engine.runtime.sampling import SamplingParams, exponential_noise, probs_from_logits, sample_with
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.engine.runtime.timing import PartMarks, PhaseClock, observe_allreduce
from eaglelab.engine.runtime.tree import DraftTree, greedy_token, tree_attention_mask
from eaglelab.engine.runtime.verification import Acceptance, greedy_accept, path_ranks, rejection_accept

StreamFn = Callable[[int, list[int]], None]  # (row, new token ids)


@dataclass
class GenerationResult:
    """What :meth:`Engine.generate` returns."""

    tokens: list[list[int]]  # per row, the generated ids (EOS included when it ended the row)
    stop_reasons: list[str]  # per row: "eos" | "length"
    prompt_tokens: int
    seconds: float  # generation time: wall time of the run less setup_seconds
    cycles: int
    accept_lens: list[list[int]] = field(default_factory=list)  # per cycle, per active row (spec only)
    prefill_rows: list[int] = field(default_factory=list)  # prompts per prefill, in order (served: one per refill)
    row_cycles: int = 0  # rows x steps run: each step's rows, its batch bucket's under a graph runner (pad rows too)
    setup_seconds: float = 0.0  # graph capture and compilation that happened during the run (not in tok/s)

    @property
    def generated_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def mean_accept_len(self) -> float | None:
        flat = [a for cyc in self.accept_lens for a in cyc]
        return sum(flat) / len(flat) if flat else None

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0


class Engine:
    """Runs a target (and optionally a drafter) over batches of prompts."""

    def __init__(
        self,
        target: Transformer,
        *,
        eos_token_ids: tuple[int, ...] = (),
        drafter: Drafter | None = None,
        spec: SpecConfig = SpecConfig(),
        observer: Observer | None = None,
        runner: Runner | None = None,
        run_info: dict | None = None,
        stop_lag: int | None = None,
        shed_rows: bool = True,
    ) -> None:
        """``run_info``: what :class:`RunInfo` cannot know from the model ("model", "digest",
        "eaglelab_version", and "baseline": True for a plain run recorded beside a speculative one).
        ``stop_lag``: 1 = the stop check reads the step before the last one launched (no host stall;
        the default on CUDA), 0 = it reads each step at once (the default on CPU and under TP, whose
        observer takes each cycle's all-reduce timings at once). ``shed_rows``: a batch's live rows move onto a
        smaller batch bucket as rows end (:mod:`.shrink`; False: every batch runs whole until its last row ends)."""
        assert spec.enabled == (drafter is not None), "a drafter is needed exactly when spec.algorithm != 'none'"
        self.target, self.drafter, self.spec = target, drafter, spec
        self.observer = observer
        param = next(target.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.eos = torch.tensor(sorted(eos_token_ids) or [-1], device=self.device)
        self._eos_key = tuple(sorted(eos_token_ids))  # the graphs of phases that emit bake self.eos in
        if stop_lag is None:
            stop_lag = 1 if self.device.type == "cuda" and target.tp is None else 0
        assert stop_lag == 0 or target.tp is None, "under TP the observer takes each cycle at once: stop_lag 0"
        self.stop_lag = stop_lag
        self.shed_rows = shed_rows
        if self.device.type == "cuda":
            cycle_ops.load()  # the bookkeeping kernels of compiled phases (Triton imported once, outside any trace)
        self.runner: Runner = runner or EagerRunner(target, drafter.net if drafter is not None else None,
                                                   reason=_eager_reason(spec, self.device))
        self.run_info = run_info or {}
        if target.tp is not None:  # this engine's observer times the group's all-reduces (None: untimed)
            observe_allreduce(target.tp, observer)
        self.clock = PhaseClock(self.device, enabled=observer is not None, tp=target.tp)
        # the whole cycle as one phase (see the module's docstring), timed from inside by two PartMarks that
        # alternate cycle by cycle (a graph's marks are read one cycle late, before it replays again), a pair per
        # graph: per batch bucket and setting (a capture's events are its graph's; another graph's capture must not
        # replace them). The runner's, as its graphs are: engines sharing a runner replay the graphs the first captured
        self.one_graph = runs_one_graph_cycle(spec, drafter, target)
        self._marks: dict[tuple, tuple[PartMarks, PartMarks]] = {}
        if self.one_graph:
            self._marks = _CYCLE_MARKS.setdefault(self.runner, {})
        self._carry: dict[str, torch.Tensor] = {}
        self._cycle_parts: dict[tuple, dict] = {}  # (sampling, observed) -> the parts, shared by both parities
        self._cycle_fns: dict[tuple, PhaseParts] = {}  # (sampling, observed, parity, graph) -> the cycle's function
        self._cycle = 0
        self._rows_run: list[int] = []  # per step launched, the rows its phases ran (GenerationResult.row_cycles)
        self._warned: set[str] = set()
        self._stager = Stager(self.device)  # the observer's one device-to-host copy per cycle
        self._pending: _Pending | None = None
        self._setup_seen = 0.0  # the runner's set-up seconds when the last cycle was queued
        self._muted = False  # a warm-up: cycles not observed

    # ---- public ------------------------------------------------------------------------------
    def graph_status(self, kind: str, batch: int) -> dict[str, str]:
        """Per forward of the last ``kind`` step ("prefill", "decode", "spec") at ``batch`` rows: "replay" or
        "eager: <reason>"; a one-graph cycle's status stands for each forward it ran."""
        if kind == "spec" and self.one_graph:
            replayed = self.runner.graph_status("cycle", self.spec.attention_mode, batch)["cycle"]
            return {phase: replayed for phase in FORWARD_PHASES["spec"]}
        return self.runner.graph_status(kind, self.spec.attention_mode, batch)

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        sampling: SamplingParams = SamplingParams(),
        generator: torch.Generator | None = None,
        stream: StreamFn | None = None,
        warm_up: int = 0,
        max_batch: int | None = None,
        refill_rows: int | None = None,
    ) -> GenerationResult:
        """``warm_up``: first generate that many tokens (at most ``max_new_tokens``) of the same prompts, unobserved
        and unstreamed, so the run's one-time costs (lazy captures and compiles, a graph's first replays, the
        garbage a compile leaves) happen before it is timed; that time is set-up. ``generator``'s state is the
        same after it, so a sampled run draws what it would without.

        ``max_batch``: continuous batching when there are more prompts: at most that many rows run at once, and a
        row whose request ends takes the next prompt before the next step (:mod:`.serving`); results stay in the
        order of ``prompts``. None: every prompt in one batch, which runs until its last row ends. ``refill_rows``: the
        free rows that wait for each other to be prefilled together (None: :func:`.serving.refill_rows`'s B // 4)."""
        assert prompts and all(prompts), "every prompt needs at least one token"
        queued = max_batch is not None and len(prompts) > max_batch
        serving.check_refill(max_batch, refill_rows)
        if queued:
            serving.check(self, max_batch, stream)
            run = lambda n, out: serving.serve(self, prompts, n, sampling, generator, max_batch, refill_rows)  # noqa
        else:
            run = lambda n, out: self._batch(prompts, n, sampling, generator, out)  # noqa: E731
        self._warned.clear()
        self._announce(max_batch if queued else len(prompts))
        warm = self._warm_up(run, min(warm_up, max_new_tokens), generator) if warm_up else 0.0
        self._reset_run()
        setup0 = self._setup_seen = self.runner.setup_seconds  # each cycle's stats carry the set-up made since
        t0 = time.perf_counter()
        tokens, reasons, accepted, prefills = run(max_new_tokens, stream)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._flush_observed()
        setup = self.runner.setup_seconds - setup0  # lazy captures and compiles: timed apart, never in tok/s
        return self._finish(prompts, tokens, reasons, time.perf_counter() - t0 - setup, accepted, warm + setup,
                            prefills)

    def _batch(self, prompts, max_new: int, sampling, generator, stream):
        """Every prompt in one batch, until every row ends. -> (tokens, stop reasons, per-cycle acceptance, prompts
        per prefill: one prefill of them all)."""
        st = self._prefill(prompts, max_new, sampling, generator)
        shrinker = shrink.Shrinker(self, st) if shrink.applies(self, stream) else None
        accepted = self._loop(st, max_new, sampling, generator, stream, shrinker)
        tokens, reasons = shrinker.rows() if shrinker is not None else read_rows(st.out, st.n_out, st.hit_eos)
        return tokens, reasons, accepted, [len(prompts)]

    def _reset_run(self) -> None:
        self._cycle, self._pending = 0, None
        self._rows_run = []
        self._cycle_parts.clear()  # they close over the run's caches
        self._cycle_fns.clear()
        self.clock.take()  # marks of an unobserved warm-up

    def _warm_up(self, run: Callable, max_new: int, generator) -> float:
        """Generate ``max_new`` tokens (``run(max_new, stream)``: the run's own way, one batch or served) without telling
        the observer or a stream (the same phases and graphs as the run). -> its wall seconds."""
        t0 = time.perf_counter()
        self._reset_run()
        saved = generator.get_state() if generator is not None else None
        self._muted = True
        try:
            run(max_new, None)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        finally:
            self._muted = False
            if saved is not None:
                generator.set_state(saved)
        gc.collect()  # what the warm-up's compiles and captures left: collected while the clock is off
        return time.perf_counter() - t0

    def _loop(self, st: Batch, max_new_tokens: int, sampling: SamplingParams, generator,
              stream: StreamFn | None, shrinker: shrink.Shrinker | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Decode steps or speculative cycles until every row is done; with a ``shrinker``, the live rows move into
        a smaller batch whenever a smaller bucket would run them (:mod:`.shrink`). -> per cycle (accept_len, active),
        on device."""
        accepted: list[tuple[torch.Tensor, torch.Tensor]] = []
        emitted = [0] * st.root.shape[0]
        reads_ahead = bool(self.stop_lag and self.spec.enabled)  # near the budget's end: see _may_finish_next
        counts = stream is not None or reads_ahead  # plain decoding without a stream copies "done" alone a step
        watched = {"done": st.done} | ({"n_out": st.n_out} if counts else {})
        watched |= {"out": st.out} if stream is not None else {}
        reader = StepReader(self.stop_lag, watched)
        launched: deque[StepView] = deque([reader.view(watched)])  # oldest first
        steps_left = max(max_new_tokens - 1, 0)  # a step emits >= 1 token per row not done: then all are
        near_end, finished = False, False
        unstreamed: list[StepView] = []  # read, their tokens not yet handed to the stream
        while steps_left:
            # the host reads the step before the last one launched; near the budget's end, the step in flight
            # too (it may finish every row: waiting for it costs a launch, queuing one more a whole cycle)
            fresh = None  # the last view read this time, if its slots are today's
            while launched and (len(launched) > self.stop_lag or near_end):
                seen = launched.popleft()
                unstreamed.append(seen)
                fresh = seen if shrinker is None or shrinker.read_one() else None
                finished = seen.all_done()
                if finished:
                    break
                near_end = reads_ahead and self._may_finish_next(seen, max_new_tokens)
            if finished:
                break
            if shrinker is not None and fresh is not None:
                smaller = shrinker.shrink(st, fresh.read()["done"])
                if smaller is not None:
                    st = smaller
                    self._carry = {name: t[: st.root.shape[0]] for name, t in self._carry.items()}
                    shrinker.moved(len(launched))
            if not self.stop_lag:  # read at once (CPU, TP): the step has finished, its text goes out now
                emitted, unstreamed = self._stream(unstreamed, stream, emitted), []
            steps_left -= 1
            self._cycle += 1
            if self.spec.enabled:
                accepted.append(self._spec_cycle(st, sampling, generator))
            else:
                self._decode_step(st, sampling, generator)
            self._rows_run.append(self.runner.padded_batch(st.root.shape[0]))
            launched.append(reader.view(watched))
            # lagged: the text goes out once the next step is queued, so printing it overlaps the device's work
            emitted, unstreamed = self._stream(unstreamed, stream, emitted), []
        else:  # the budget is spent (the last step finished every row): read the steps still unread, up
            while launched:  # to the first that finished every row; a step launched after it is extra
                seen = launched.popleft()
                unstreamed.append(seen)
                if seen.all_done():
                    break
        emitted = self._stream(unstreamed, stream, emitted)
        self._forget_extra(len(launched), accepted)
        return accepted

    # ---- prefill -----------------------------------------------------------------------------
    def _prefill(self, prompts, max_new, sampling, generator, longest: int | None = None) -> Batch:
        """The prompts' forward (one phase: a graph per batch bucket and padded width, compiled only with
        ``spec.compile_prefill``: it runs once per request), the first token. ``longest``: the longest prompt
        the rows will hold (continuous batching: the queue's), which sizes the cache."""
        N = self.spec.tree_nodes if self.spec.enabled else 1
        T = int(max(len(p) for p in prompts))
        cache = self._make_cache(len(prompts), max(T, longest or 0) + max_new + 2 * N + 2)
        ids, lens, first, aux, _ = self._prompt_forward(prompts, cache, sampling, generator)
        st = Batch(cache=cache, **self._new_state(lens, first, cache, max_new), prompts=prompts, prompt_lens=lens)
        emit_tokens(st.state(), first[:, None], torch.ones_like(lens), self.eos)
        if self.drafter is not None:
            with self.clock.phase("draft_extend"):
                self.drafter.begin(st.view(), ids, aux, self.runner)
                if self.one_graph:
                    self._carry = self.drafter.carry(self.runner, cache)
        self._emit("prefill", st)
        return st

    def _prompt_forward(self, prompts, cache: KVCache, sampling, generator, eager: str | None = None):
        """The prefill phase over ``prompts`` in the first rows of ``cache`` (a graph per batch bucket and padded width,
        compiled only with ``spec.compile_prefill``; eagerly where the runner or ``eager`` says why). -> (ids [B, W],
        lengths [B], first tokens [B], aux [B, W, taps * H] or None, why it ran eagerly or None)."""
        B, T = len(prompts), int(max(len(p) for p in prompts))
        width, why = self.runner.prefill_width(B, T, cache)  # T, or T padded to a captured width
        eager = eager or why
        width = T if eager is not None else width
        # [B, W]: each row's prompt, then pad tokens (their slots are overwritten before anything reads them)
        ids = upload([p + [0] * (width - len(p)) for p in prompts], self.device)
        lens = upload([len(p) for p in prompts], self.device)
        ins = {"ids": ids, "lengths": lens, **self._noise(B, 0, sampling, generator)}
        with self.clock.phase("prefill"):
            whole = self.spec.compile_prefill and eager is None  # compiled whole: its layers run the eager pieces
            first, *aux = self.runner.phase("prefill", self._prefill_fn(cache, sampling, whole), ins, (cache,),
                                            (sampling, self._taps()), eager=eager, compile=self.spec.compile_prefill)
        return ids, lens, first, aux[0] if aux else None, eager

    def _prefill_fn(self, cache: KVCache, sampling: SamplingParams, whole: bool):
        """The prefill phase: the prompts [B, W] at slots = positions 0..W-1, attending over those W slots only; the
        first token from each row's last prompt position. On the runner's ``prompt_kernels`` unless compiled ``whole``."""
        kernels = self.runner.kernels if whole else self.runner.prompt_kernels
        def prefill(ids, lengths, race=None):
            B, W = ids.shape
            positions = torch.arange(W, device=ids.device).expand(B, W)
            hidden, aux = self.target(ids, positions, cache, positions, prefix_mask(positions, W), self._taps(),
                                      kv_len=W, kernels=kernels)  # [B, W, H]
            last = hidden[torch.arange(B, device=ids.device), lengths - 1]  # [B, H]
            first = _pick(self.target.logits(last, kernels), sampling, race)  # [B]
            return (first,) if aux is None else (first, aux)
        return prefill

    def _new_state(self, lens: torch.Tensor, first: torch.Tensor, cache: KVCache, max_new: int) -> dict[str, torch.Tensor]:
        """The per-row state after the prompt, in the runner's buffers (``out`` as wide as the cache)."""
        return self.runner.make_state(loop_state(lens.clone(), first, cache.max_len, max_new), cache)

    def _make_cache(self, batch: int, max_len: int) -> KVCache:
        """The runner's static cache when it offers one (CUDA graphs bind fixed buffers; it may be
        longer than asked), else a fresh cache of exactly ``max_len`` slots."""
        cache = self.runner.make_cache(batch, max_len, self.observer)
        if cache is not None:
            return cache
        cfg = self.target.config
        if cfg.mla is None:  # an MLA cache is one compressed row per token: small
            local_kv = self.target.layers[0].self_attn.local_kv_heads
            check_memory(kv_cache_bytes(cfg, batch, max_len, self.dtype, local_kv), self.device, "the KV cache")
        return self.target.make_cache(batch, max_len, dtype=self.dtype, device=self.device)

    def _taps(self) -> tuple[int, ...]:
        return self.drafter.target_taps if self.drafter is not None else ()

    # ---- plain decoding ----------------------------------------------------------------------
    def _decode_step(self, st: Batch, sampling, generator) -> None:
        with self.clock.phase("decode"):
            noise = self._noise(st.root.shape[0], 0, sampling, generator)
            self.runner.phase("decode", self._decode_fn(st.cache, sampling), noise, (st.cache,),
                              (sampling, self._eos_key), state=st.state())
        self._emit("decode", st)

    def _decode_fn(self, cache: KVCache, sampling: SamplingParams):
        """The decode phase: the root's forward at slot = position = length, the next token, emitted."""
        def decode(race=None, **state):
            slots = state["lengths"][:, None]  # [B, 1]
            hidden, _ = self.target(state["root"][:, None], slots, cache, slots, prefix_mask(slots, cache.max_len),
                                    kernels=self.runner.kernels)  # [B, 1, H]
            nxt = _pick(self.target.logits(hidden[:, 0], self.runner.kernels), sampling, race)  # [B]
            emit_and_advance(state, nxt[:, None], None, nxt, self.eos)
            return ()
        return decode

    def _noise(self, B: int, nodes: int, sampling: SamplingParams, generator) -> dict[str, torch.Tensor]:
        """The random draws a sampling phase of ``B`` rows consumes (none when greedy), drawn outside any graph:
        a uniform per tree node for rejection sampling (``nodes`` > 0: acceptance), the race for one token."""
        if sampling.greedy:
            return {}
        uniform = {"uniform": torch.rand(B, nodes, generator=generator, device=self.device)} if nodes else {}
        return {**uniform, "race": exponential_noise((B, self.target.config.vocab_size), self.device, generator)}

    # ---- speculative cycle -------------------------------------------------------------------
    def _spec_cycle(self, st: Batch, sampling: SamplingParams, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """One speculative cycle (:func:`speculative_cycle`), phase by phase or as one graph."""
        if self.one_graph:
            return self._one_graph_cycle(st, sampling, generator)
        phases = EagerPhases(self, st, sampling, generator)
        tree, (acc, ranks), (committed, active) = speculative_cycle(phases, self.clock.phase)
        self._emit("spec", st, {"active": active, "committed": committed, "path": acc.path, **ranks}, tree.num_nodes)
        return committed, active  # read on the host once, at the end of the run

    def _one_graph_cycle(self, st: Batch, sampling: SamplingParams, generator) -> tuple[torch.Tensor, torch.Tensor]:
        """The cycle as one phase (one graph per batch bucket): the drafter's draft and draft-extend and the
        engine's verify, accept and advance, called directly (:class:`GraphParts`) on the same tensors; what a
        cycle hands the next (the drafter's root hidden state and logits) is runner state, written in place."""
        B, N = st.root.shape[0], self.spec.tree_nodes
        observed = self.observer is not None
        parity = self._cycle % 2 if observed and self.device.type == "cuda" else 0
        graph = (self.runner.padded_batch(B), id(self.drafter), sampling, self._eos_key)  # the marks' graph
        fn = self._cycle_fn(st.cache, sampling, observed, parity, graph)
        ins = self._noise(B, N, sampling, generator)
        caches = (st.cache, self.drafter.cache)  # type: ignore[union-attr]
        with self.clock.range("cycle"):  # trace: a replayed cycle is one range
            committed, active, path, *seen = self.runner.phase(
                "cycle", fn, ins, caches, (id(self.drafter), sampling, self._eos_key, observed, parity),
                state=st.state() | self._carry)
        if observed:
            self.clock.add(self._marks_of(graph)[parity].take())
        ranks = {"ranks": seen[0], "open": seen[1]} if observed else {}
        self._emit("spec", st, {"active": active, "committed": committed, "path": path, **ranks}, N)
        return committed, active

    def _marks_of(self, graph: tuple) -> tuple[PartMarks, PartMarks]:
        """The two PartMarks of the cycle graphs ``graph`` names (batch bucket, drafter, sampling, EOS ids)."""
        if graph not in self._marks:
            self._marks[graph] = (PartMarks(self.device, True), PartMarks(self.device, True))
        return self._marks[graph]

    def _cycle_fn(self, cache: KVCache, sampling: SamplingParams, observed: bool, parity: int,
                  graph: tuple) -> PhaseParts:
        """The one-graph cycle's function (made once per run, setting and batch bucket: ``graph`` names the marks
        it times with; the parts shared by both parities and every bucket)."""
        key = (sampling, observed, parity, graph)
        if key in self._cycle_fns:
            return self._cycle_fns[key]
        depth = self.spec.max_depth
        if (sampling, observed) not in self._cycle_parts:  # the runner compiles a part once for both parities
            self._cycle_parts[(sampling, observed)] = {
                **self.drafter.cycle_parts(), "verify": self._verify_fn(cache, depth),  # type: ignore[union-attr]
                "accept": self._accept_fn(cache, sampling, depth, observed), "advance": self._advance_fn}
        parts = self._cycle_parts[(sampling, observed)]
        marks = self._marks_of(graph)[parity] if observed else _UNTIMED

        def cycle(parts, draft_hidden, draft_logits, uniform=None, race=None, **state):
            marks.start()
            steps = GraphParts(parts, state, draft_hidden, draft_logits, uniform, race, observed)
            _, acc, (committed, active) = speculative_cycle(steps, marks.part)
            return committed, active, acc[1], *acc[4:]  # the path; observed: its ranks, whether it stayed open

        self._cycle_fns[key] = PhaseParts(cycle, parts)
        return self._cycle_fns[key]

    def _advance_fn(self, tokens, accept_len, bonus, **state):
        """The advance phase: the accepted tokens [B, D+1] emitted, ``accept_len`` cached, ``bonus`` the root."""
        return emit_and_advance(state, tokens, accept_len, bonus, self.eos)

    def _verify(self, st: Batch, tree: DraftTree):
        """The target over the tree at slots lengths..lengths+N-1. -> (logits [B, N, V], head's dtype; aux or None)."""
        if self.spec.attention_mode == "decode":  # fixed shapes over the whole static cache: one graph
            ins = {"lengths": st.lengths, **_tree_inputs(tree)}
            logits, aux = self.runner.phase("verify", self._verify_fn(st.cache, tree.max_depth), ins, (st.cache,),
                                            (self._taps(), tree.max_depth))
            return logits, aux
        N = tree.num_nodes
        slots = st.lengths[:, None] + torch.arange(N, device=self.device)  # [B, N]
        kv_len = int(st.lengths.max()) + N  # host sync: the extend path sizes itself per call
        mask = tree_attention_mask(st.lengths, tree, kv_len)
        hidden, aux = self.runner.verify_extend(st.cache, tree.tokens, tree.positions(st.lengths), slots, mask,
                                                self._taps(), kv_len)
        return self.target.logits(hidden, float32=False), aux

    def _verify_fn(self, cache: KVCache, max_depth: int):
        def verify(lengths, tokens, parents, depth, mask):
            tree = DraftTree(tokens, parents, depth, mask, max_depth)
            slots = lengths[:, None] + torch.arange(tree.num_nodes, device=lengths.device)  # [B, N]
            attn = tree_attention_mask(lengths, tree, cache.max_len)  # [B, N, S]
            hidden, aux = self.target(tokens, tree.positions(lengths), cache, slots, attn, self._taps(),
                                      kernels=self.runner.kernels)  # [B, N, H]
            return self.target.logits(hidden, self.runner.kernels, float32=False), aux  # accept converts
        return verify

    def _accept(self, st: Batch, tree: DraftTree, logits, sampling: SamplingParams,
                generator) -> tuple[Acceptance, dict[str, torch.Tensor]]:
        """Acceptance and KV compaction, one phase (one graph). With an observer the same phase also
        computes the accepted path's sibling ranks [B, D] and whether it stayed open [B] (no eager
        kernels for the probes); else the dict is empty."""
        ins = {"lengths": st.lengths, "logits": logits, **_tree_inputs(tree),
               **self._noise(st.root.shape[0], tree.num_nodes, sampling, generator)}
        observed = self.observer is not None
        if observed and tree.rank is not None:  # None: path_ranks takes rank 0 inside the phase
            ins["rank"] = tree.rank
        fn = self._accept_fn(st.cache, sampling, tree.max_depth, observed)
        out = self.runner.phase("accept", fn, ins, (st.cache,), (sampling, tree.max_depth, observed))
        accept_len, path, tokens, bonus = out[:4]
        ranks = {"ranks": out[4], "open": out[5]} if observed else {}
        return Acceptance(accept_len=accept_len, path=path, tokens=tokens, bonus=bonus), ranks

    def _accept_fn(self, cache: KVCache, sampling: SamplingParams, max_depth: int, observed: bool):
        def accept(lengths, logits, tokens, parents, depth, mask, uniform=None, race=None, rank=None):
            tree = DraftTree(tokens, parents, depth, mask, max_depth, rank)
            if sampling.greedy and cycle_ops.applies(logits):  # compiled on CUDA: the walk and compaction, one kernel
                acc = Acceptance(*cycle_ops.greedy_commit(tree, greedy_token(logits), lengths, cache.k, cache.v,
                                                           compact=not self.spec.chain))
            else:
                acc = (greedy_accept(tree, logits) if sampling.greedy else
                       rejection_accept(tree, probs_from_logits(logits, sampling), uniform=uniform, race=race))
                self._compact(cache, lengths, acc)
            seen = path_ranks(tree, acc) if observed else ()
            return acc.accept_len, acc.path, acc.tokens, acc.bonus, *seen
        return accept

    def _compact(self, cache: KVCache, lengths: torch.Tensor, acc: Acceptance) -> None:
        """Move the accepted path's KV (tree node i at slot len+i) onto slots len..len+k (a chain's accepted path is
        already nodes 0..k at slots len..len+k: nothing to move)."""
        if not self.spec.chain:
            cache.compact_path(lengths, acc.path)

    # ---- bookkeeping -------------------------------------------------------------------------
    def _may_finish_next(self, seen: StepView, max_new: int) -> bool:
        """Whether one speculative cycle after ``seen`` (a lagged view) can finish every row by length: each row not
        done has at most ``max_depth + 1`` tokens (a whole path and its bonus) left. Plain decoding's step count is
        exact, and an EOS cannot be foreseen: neither needs the check."""
        got = seen.read()
        left = max_new - got["n_out"][~got["done"]]
        return bool((left <= self.spec.max_depth + 1).all())

    def _stream(self, views: list[StepView], stream: StreamFn | None, emitted: list[int]) -> list[int]:
        """Hand ``stream`` each row's tokens emitted since ``emitted``, as of the last of ``views`` (steps read
        in launch order; tokens once emitted never change, so the last view holds all of theirs)."""
        if stream is None or not views:
            return emitted
        got = views[-1].read()
        n_out = got["n_out"].tolist()
        for b, (old, new) in enumerate(zip(emitted, n_out)):
            if new > old:
                stream(b, got["out"][b, old:new].tolist())
        return n_out

    def _forget_extra(self, extra: int, accepted: list) -> None:
        """The steps launched after the one that finished every row (``extra``, 0 or 1) changed nothing:
        they are not cycles of the run, and the observer never sees them."""
        if not extra:
            return
        assert extra == 1, f"{extra} steps after the last: the loop reads one step late at most"
        self._cycle -= 1
        self._rows_run.pop()
        if self.spec.enabled:
            accepted.pop()
        self._pending = None  # its stats (queued, not delivered: the observer is a cycle behind)

    def _finish(self, prompts, tokens: list[list[int]], reasons: list[str], seconds: float, accepted,
                setup: float, prefills: list[int]) -> GenerationResult:
        """The run's result, read from the device in a few copies: a readback per cycle (a masked index and a
        ``tolist`` each, both syncs) cost a speculative request ~1-2 ms on the GPU, inside bench's wall time."""
        accept_lens: list[list[int]] = []
        if accepted:  # each cycle's [B] (B shrinks as a batch sheds its ended rows: .shrink), in two copies
            lens, active = (torch.cat([pair[i] for pair in accepted]).tolist() for i in range(2))
            widths = [n.shape[0] for n, _ in accepted]
            accept_lens = [[n for n, a in zip(lens[e - w: e], active[e - w: e]) if a]
                           for e, w in zip(accumulate(widths), widths)]
        res = GenerationResult(
            tokens=tokens, stop_reasons=reasons, prompt_tokens=sum(len(p) for p in prompts),
            seconds=seconds, cycles=self._cycle, accept_lens=accept_lens, setup_seconds=setup, prefill_rows=prefills,
            row_cycles=sum(self._rows_run),
        )
        if self.observer is not None:
            self.observer.on_run_end(RunSummary(
                prompt_tokens=res.prompt_tokens, generated_tokens=res.generated_tokens, seconds=seconds,
                cycles=res.cycles, mean_accept_len=res.mean_accept_len, stop_reasons=tuple(reasons),
                setup_seconds=setup,
            ))
        return res

    # ---- observer ----------------------------------------------------------------------------
    def _announce(self, batch: int) -> None:
        if self.observer is None:
            return
        dev = str(self.device)
        if self.device.type == "cuda":
            dev += f" ({torch.cuda.get_device_name(self.device)})"
        info = dict(self.run_info)
        self.observer.on_run_start(RunInfo(
            model=info.get("model", "?"), model_digest=info.get("digest", ""), device=dev,
            dtype=str(self.dtype).replace("torch.", ""), batch_size=batch, spec=json_values(self.spec.to_dict()),
            model_config=json_values(self.target.config.to_dict()),
            versions={"torch": torch.__version__, "python": platform.python_version(),
                      "eaglelab": info.get("eaglelab_version", ""), "platform": sys.platform},
            tp_size=self.target.tp.world_size if self.target.tp else 1, baseline=bool(info.get("baseline", False)),
        ))

    def _emit(self, kind: str, st: Batch, readback: dict[str, torch.Tensor] | None = None,
              tree_nodes: int = 0) -> None:
        """Queue this cycle's stats for the observer: its device tensors go to the host in one copy
        (``readback``: "active" [B], and for a spec cycle "committed", "path", "ranks", "open"; None:
        the rows not done, built here so an unobserved run launches nothing for it); the previous
        cycle's stats are built and delivered now, while the device runs this one."""
        if self.observer is None:
            return
        if self._muted:  # a warm-up: nothing to tell
            self.clock.take()
            return
        if readback is None:
            readback = {"active": ~st.done}
        batch = st.lengths.shape[0]
        now = self.runner.setup_seconds  # set-up made during this cycle (a lazy capture, a compile, a tuning)
        setup, self._setup_seen = now - self._setup_seen, now
        pending = _Pending(index=self._cycle, kind=kind, marks=self.clock.take(), tree_nodes=tree_nodes,
                           graph=self.graph_status(kind, batch), setup_ms=setup * 1e3,
                           staged=self._stager.stage(readback))
        previous, self._pending = self._pending, pending
        if previous is not None:
            self._deliver(previous)
        if self.target.tp is not None:  # graphs replayed next cycle re-record the all-reduce events: no lag
            self._flush_observed()

    def _flush_observed(self) -> None:
        """Deliver the stats still queued (at the end of a run)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._deliver(pending)

    def _deliver(self, p: "_Pending") -> None:
        """Build one cycle's :class:`CycleStats` from its readback and hand it to the observer."""
        got = p.staged.read()
        active = [b for b, (a,) in enumerate(got["active"]) if a]
        acc_len: tuple[int, ...] = ()
        positions: tuple[tuple[int, ...], ...] = ()
        ranks: tuple[tuple[int, ...], ...] = ()
        opened: tuple[bool, ...] = ()
        if p.kind == "spec":
            lens = [n for (n,) in got["committed"]]
            acc_len = tuple(lens[b] for b in active)
            positions = tuple(tuple(n for n in got["path"][b][1: lens[b]] if n >= 0) for b in active)
            ranks = tuple(tuple(got["ranks"][b][: lens[b] - 1]) for b in active)
            opened = tuple(bool(got["open"][b][0]) for b in active)
        self._warn_eager(p.graph)
        self.observer.on_cycle(CycleStats(
            index=p.index, kind=p.kind, phase_ms=self.clock.elapsed(p.marks), accept_len=acc_len,
            accepted_positions=positions, num_draft_tokens=p.tree_nodes, verify_tokens=p.tree_nodes * len(acc_len),
            graph=p.graph, active_rows=len(active), accepted_ranks=ranks, path_open=opened, setup_ms=p.setup_ms,
        ))

    def _warn_eager(self, graph: dict[str, str]) -> None:
        """Tell the observer, once per run, of each forward that ran eagerly when nobody chose it."""
        for phase, status in graph.items():
            message = eager_warning(phase, status)
            if message is not None and message not in self._warned:
                self._warned.add(message)
                self.observer.on_warning(SOURCE_RUNNER, message)


_CYCLE_MARKS: "weakref.WeakKeyDictionary[Runner, dict[tuple, tuple[PartMarks, PartMarks]]]" = weakref.WeakKeyDictionary()
_UNTIMED = PartMarks(torch.device("cpu"), enabled=False)  # an unobserved cycle marks nothing


@dataclass(frozen=True)
class _Pending:
    """A cycle's stats waiting for their readback (delivered one cycle later)."""

    index: int
    kind: str
    marks: list  # the phase clock's marks, read when delivered
    graph: dict[str, str]
    tree_nodes: int
    staged: Staged
    setup_ms: float = 0.0


def runs_one_graph_cycle(spec: SpecConfig, drafter: Drafter | None, target: Transformer) -> bool:
    """Whether an engine runs the speculative cycle as one phase: asked (``spec.one_graph_cycle``), a drafter
    whose phases are functions of tensors (EAGLE-3), decode-mode verify (fixed shapes), no tensor parallelism
    (its all-reduces are timed per phase)."""
    return (spec.enabled and spec.one_graph_cycle and spec.attention_mode == "decode" and target.tp is None
            and isinstance(drafter, FusableDrafter))


def _eager_reason(spec: SpecConfig, device: torch.device) -> str:
    """Why the default (eager) runner replays no graph: graphs off, no CUDA, or no graph runner given."""
    if not spec.cuda_graphs:
        return EAGER_OFF
    return EAGER_NO_CUDA if device.type != "cuda" else EAGER_NO_RUNNER


def _tree_inputs(tree: DraftTree) -> dict[str, torch.Tensor]:
    return {"tokens": tree.tokens, "parents": tree.parents, "depth": tree.depth, "mask": tree.mask}


def _pick(logits: torch.Tensor, sampling: SamplingParams, race: torch.Tensor | None) -> torch.Tensor:
    """[B, V] -> [B]: argmax when greedy, else the race over the processed distribution."""
    if sampling.greedy:
        return greedy_token(logits)
    return sample_with(probs_from_logits(logits, sampling), race)
