"""The micro-measure of ``eaglelab bench``: one 1-token decode against one verify of N tokens (N = 2..8) over
a cache holding ``context`` tokens, with and without CUDA graphs, in both attention modes, each call
synchronised and timed on the host (so launch overhead counts), median of many. ``eaglelab tune`` times its
verifies with it, and ``bench --tp`` its steps with and without collectives (:class:`MicroBench`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from eaglelab.bench.timing import time_call
from eaglelab.engine.model.layers import prefix_mask
from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner, GraphPlan
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.engine.runtime.tree import chain_tree, tree_attention_mask


@dataclass(frozen=True)
class MicroRow:
    """One micro-measure: a 1-token decode (tokens == 1) or a verify of ``tokens`` tokens."""

    batch: int
    tokens: int
    attention_mode: str  # "decode" | "prefill"
    graphs: bool
    ms: float
    status: str  # "replay" | "eager: why"
    over_decode: float | None = None  # ms / the 1-token decode's ms (graph-captured where possible)


class MicroBench:
    """A cache holding ``context`` tokens per row, and the three calls the micro-measure times."""

    def __init__(self, target, batch_sizes, widths, context: int, graphs: bool) -> None:
        dev = next(target.parameters()).device
        self.target, self.device, self.context = target, dev, context
        S = -(-(context + max(widths) + 2) // 64) * 64
        plan = GraphPlan(buckets=tuple(batch_sizes), max_len=S, decode=True, verify_tokens=tuple(widths),
                         draft_width=0, extend_width=0)
        self.graph_runner = CudaGraphRunner(target, plan=plan, enabled=graphs) if graphs else None
        self.eager = EagerRunner(target)
        if self.graph_runner is not None and self.graph_runner.make_cache(max(batch_sizes), S) is not None:
            self.cache = self.graph_runner.cache
        else:
            self.cache = target.make_cache(max(batch_sizes), S, dtype=next(target.parameters()).dtype, device=dev)
        self._fill(max(batch_sizes))

    @torch.inference_mode()
    def _fill(self, rows: int) -> None:
        g = torch.Generator(device="cpu").manual_seed(0)
        ids = torch.randint(0, self.target.config.vocab_size, (rows, self.context), generator=g).to(self.device)
        pos = torch.arange(self.context, device=self.device).expand(rows, -1)
        self.eager.prefill(self.cache, ids, pos, prefix_mask(pos, self.cache.max_len), ())

    def runner(self, graphs: bool):
        return self.graph_runner if graphs else self.eager

    def decode_fn(self, batch: int, graphs: bool) -> Callable[[], Any]:
        runner, S = self.runner(graphs), self.cache.max_len
        tok = torch.full((batch, 1), 7, dtype=torch.long, device=self.device)
        slots = torch.full((batch, 1), self.context, dtype=torch.long, device=self.device)

        def call():
            hidden = runner.decode(self.cache, tok, slots, prefix_mask(slots, S))
            return self.target.logits(hidden[:, 0]).argmax(-1)

        return call

    def verify_fn(self, batch: int, n: int, mode: str, graphs: bool) -> Callable[[], Any]:
        runner, S = self.runner(graphs), self.cache.max_len
        lengths = torch.full((batch,), self.context, dtype=torch.long, device=self.device)
        tree = chain_tree(torch.full((batch, n), 7, dtype=torch.long, device=self.device))
        slots = lengths[:, None] + torch.arange(n, device=self.device)
        positions = tree.positions(lengths)

        def call():  # mirrors Engine._verify
            if mode == "decode":
                mask = tree_attention_mask(lengths, tree, S)
                hidden, _ = runner.verify(self.cache, tree.tokens, positions, slots, mask, ())
            else:
                kv_len = int(lengths.max()) + n  # the extend path's host sync
                mask = tree_attention_mask(lengths, tree, kv_len)
                hidden, _ = runner.verify_extend(self.cache, tree.tokens, positions, slots, mask, (), kv_len)
            return self.target.logits(hidden).argmax(-1)

        return call

    def status(self, graphs: bool, phase: str) -> str:
        runner = self.runner(graphs)
        return runner.graph_status("spec" if phase == "verify" else "decode", "decode", 1)[phase]


@torch.inference_mode()
def micro_measure(target, batch_sizes: tuple[int, ...], widths: tuple[int, ...] = tuple(range(2, 9)),
                  context: int = 256, warmup: int = 5, iters: int = 30, log=lambda m: None) -> list[MicroRow]:
    """1-token decode vs verify of N tokens, graphs on/off, attention modes decode/prefill."""
    dev = next(target.parameters()).device
    cuda = dev.type == "cuda"
    mb = MicroBench(target, batch_sizes, widths, context, graphs=cuda)
    rows: list[MicroRow] = []
    for b in batch_sizes:
        timed = lambda fn: time_call(fn, dev, warmup, iters)  # noqa: E731
        dec = {g: timed(mb.decode_fn(b, g)) for g in ((False, True) if cuda else (False,))}
        base = dec[True] if cuda else dec[False]
        for g, ms in dec.items():
            rows.append(MicroRow(b, 1, "decode", g, ms, mb.status(g, "decode"), ms / base))
        for n in widths:
            for mode, g in (("decode", False), ("decode", True), ("prefill", False)):
                if g and not cuda:
                    continue
                ms = timed(mb.verify_fn(b, n, mode, g))
                rows.append(MicroRow(b, n, mode, g, ms, mb.status(g, "verify"), ms / base))
        log(f"  micro batch {b:>3}: decode {base:.3f} ms")
    return rows
