"""Sinks: bus subscribers that show a run to people. Each is a callable taking an event.

- :class:`ConsoleSummary` prints a rich table when the run finishes (tokens, tok/s, mean
  accepted length, per-phase ms, CUDA-graph replay share, verdicts).
- :class:`TensorBoardSink` writes scalars per step through ``torch.utils.tensorboard``:
  ``accept_len/mean`` (running mean over spec cycles) and ``accept_len/step``,
  ``throughput/tok_s`` (this step's tokens over its measured time), ``phase_ms/<phase>``,
  ``graph/replay_fraction`` (running share of decode/spec steps whose main phase replayed).
  The global step is the engine's cycle index.

The run record writer lives in :mod:`eaglelab.probes.record`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eaglelab.probes.bus import RunTotals
from eaglelab.probes.events import Event, GraphCaptured, RunFinished, RunStarted, Step
from eaglelab.probes.report import record_verdicts


class ConsoleSummary:
    """Collects a run's events; prints a summary table on ``run_finished`` (or on :meth:`show`)."""

    def __init__(
        self,
        console: Any = None,
        *,
        print_on_finish: bool = True,
        decode_ms: float | None = None,
        expected_accept_len: float = 2.0,
    ) -> None:
        from rich.console import Console

        self.console = console if console is not None else Console()
        self.totals = RunTotals()
        self.print_on_finish = print_on_finish
        self.decode_ms = decode_ms
        self.expected_accept_len = expected_accept_len

    def __call__(self, event: Event) -> None:
        """Bus subscriber entry point (a recorded plain baseline only lends its decode cost)."""
        own = self.totals.observe_event(event)
        if own and isinstance(event, RunFinished) and self.print_on_finish:
            self.show()

    def verdicts(self) -> list[str]:
        """The run's verdicts so far (economics when the decode cost is known)."""
        return record_verdicts(self.totals, self.decode_ms, self.expected_accept_len)

    def render(self) -> Any:
        """The summary as a rich renderable."""
        from rich.console import Group
        from rich.table import Table

        t = self.totals
        table = Table(title="eaglelab run", show_header=False, title_justify="left")
        table.add_column("figure", style="bold")
        table.add_column("value", justify="right")
        table.add_row("tokens generated", str(t.generated_tokens))
        table.add_row("seconds", f"{t.seconds:.2f}")
        table.add_row("tokens/s", _fmt(t.tokens_per_s, "{:.1f}"))
        table.add_row("mean accepted length", _fmt(t.mean_accept_len, "{:.2f}"))
        for label, value in self.probe_rows(graphs=True):
            table.add_row(label, value)
        return Group(table, *self.verdict_lines())

    def probe_rows(self, graphs: bool) -> list[tuple[str, str]]:
        """The figures only the probes know, for a summary that already shows tokens, time and accepted
        length (``eaglelab run``'s): accept rate, mean ms per phase, and the CUDA-graph replay share when
        the run could replay graphs (``graphs``; on a CPU there are none to speak of)."""
        t = self.totals
        rows = [("accept rate", _fmt(t.acceptance.accept_rate, "{:.1%}"))] if t.mean_accept_len is not None else []
        phases = [f"{p} {_fmt(t.mean_phase_ms(p), '{:.2f}')}" for p in t.phases_seen()]
        if phases:
            rows.append(("ms per phase (mean)", ", ".join(phases)))
        if graphs:
            rows.append(("CUDA-graph replay share", _fmt(t.replay_fraction, "{:.0%}")))
        return rows

    def verdict_lines(self) -> list[Any]:
        """The verdicts as bullet lines."""
        from rich.text import Text

        return [Text("• " + v) for v in self.verdicts()]

    def show(self) -> None:
        """Print the summary now."""
        self.console.print(self.render())


class TensorBoardSink:
    """Writes per-step scalars to a TensorBoard log directory (``tensorboard --logdir DIR``)."""

    def __init__(self, logdir: str | Path, *, flush_secs: int = 10) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.logdir = Path(logdir)
        # a deep queue: a step never waits for the writer thread (the default of 10 blocks the engine)
        self.writer = SummaryWriter(log_dir=str(self.logdir), flush_secs=flush_secs, max_queue=4096)
        self.totals = RunTotals()

    def __call__(self, event: Event) -> None:
        """Bus subscriber entry point (a recorded plain baseline writes no scalars)."""
        if not self.totals.observe_event(event):
            return
        if isinstance(event, Step):
            self._step(event)
        elif isinstance(event, RunStarted):
            config = {"model": event.model, "device": event.device, "dtype": event.dtype, "spec": event.spec}
            self.writer.add_text("run/config", "```\n" + json.dumps(config, indent=2) + "\n```")
        elif isinstance(event, GraphCaptured):
            self.writer.add_scalar(f"graph/capture_s/{event.name}", event.seconds, event.batch_size)
        elif isinstance(event, RunFinished):
            if event.tokens_per_s is not None:
                self.writer.add_scalar("run/tok_s", event.tokens_per_s, event.cycles)
            self.writer.flush()

    def _step(self, step: Step) -> None:
        """All of a step's scalars as one summary event (one protobuf and one queued write per step,
        not one per scalar: it is host work done every cycle)."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        scalars = {f"phase_ms/{phase}": ms for phase, ms in step.phase_ms.items()}
        if step.kind != "prefill":
            scalars.update(self._step_scalars(step))
        values = [Summary.Value(tag=tag, simple_value=float(v)) for tag, v in scalars.items()]
        self.writer.file_writer.add_summary(Summary(value=values), step.index)

    def _step_scalars(self, step: Step) -> dict[str, float]:
        out: dict[str, float] = {}
        if step.cycle_ms > 0:
            out["throughput/tok_s"] = step.tokens * 1000.0 / step.cycle_ms
        active = [a for a in step.accept_len if a > 0]
        if step.kind == "spec" and active:
            out["accept_len/step"] = sum(active) / len(active)
            out["accept_len/mean"] = self.totals.acceptance.mean_accept_len or 0.0
        if self.totals.replay_fraction is not None:
            out["graph/replay_fraction"] = self.totals.replay_fraction
        return out

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


def _fmt(value: float | None, pattern: str) -> str:
    return "—" if value is None else pattern.format(value)
