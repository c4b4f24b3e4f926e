"""The TUI fed by the real engine: `eaglelab run --record` on CPU with the default model (a few
tokens), the record replayed, every panel checked against figures computed from the record itself.

Run with ``--cuda-graphs`` on a machine without CUDA, so the engine's own warnings (every forward
eager: no CUDA device) reach the warnings panel and the graph table; the plain baseline that
``run`` records after the speculative run fills the "verify x decode" figures.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from eaglelab.cli import main
from eaglelab.probes.events import EAGER_NO_CUDA, RunFinished, RunStarted, Step, WarningEvent, eager_warning
from eaglelab.probes.record import read_record
from eaglelab.tui.app import EagleLabApp
from eaglelab.tui.w_allreduce import AllReduceTable
from eaglelab.tui.w_cycle import CycleBreakdown
from eaglelab.tui.w_graphs import GraphStatus
from eaglelab.tui.w_histogram import AcceptHistogram
from eaglelab.tui.w_metric import MetricCard
from eaglelab.tui.w_status import RunStatus
from eaglelab.tui.w_warnings import WarningLog
from tests.tui.test_app import drive, plain, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.skipif(torch.cuda.is_available(), reason="pins CPU-only fallbacks")]


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("real") / "run.jsonl"
    rc = main(["run", "Name three colours.", "--device", "cpu", "--max-new-tokens", "8", "--steps", "3",
               "--cuda-graphs", "--record", str(path)])
    assert rc == 0
    return path


def _runs(path: Path) -> tuple[list[Any], list[Any]]:
    """The record's speculative run and its baseline, split at the baseline's run_started."""
    events = read_record(path).events
    cut = next(i for i, e in enumerate(events) if isinstance(e, RunStarted) and e.baseline)
    return events[:cut], events[cut:]


def test_run_records_the_speculative_run_then_its_plain_baseline(record):
    spec_run, baseline = _runs(record)
    assert isinstance(spec_run[0], RunStarted) and spec_run[0].spec["algorithm"] == "eagle3"
    assert isinstance(spec_run[-1], RunFinished) and isinstance(baseline[-1], RunFinished)
    assert baseline[0].spec["algorithm"] == "none"
    assert {e.kind for e in baseline if isinstance(e, Step)} == {"prefill", "decode"}
    assert {e.kind for e in spec_run if isinstance(e, Step)} == {"prefill", "spec"}
    warned = {e.message for e in spec_run if isinstance(e, WarningEvent)}
    assert warned == {eager_warning(p, EAGER_NO_CUDA) for p in ("prefill", "draft", "verify", "draft_extend")}


def test_every_panel_shows_the_real_records_figures(record, tmp_path):
    spec_run, baseline = _runs(record)
    steps = [e for e in spec_run if isinstance(e, Step)]
    cycles = [e for e in steps if e.kind == "spec"]
    rows = [a for e in cycles for a in e.accept_len if a > 0]
    decode = [e.phase_ms["decode"] for e in baseline if isinstance(e, Step) and e.kind == "decode"]
    verify = sum(e.phase_ms["verify"] for e in cycles) / len(cycles)
    ratio = verify / (sum(decode) / len(decode))
    n_events = len(spec_run) + len(baseline)
    app = EagleLabApp(record=record)

    async def script(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.view.events == n_events, timeout_s=30)
        await pilot.pause(0.15)
        status = plain(app.query_one(RunStatus).render())
        assert "cpu · float32" in status and "eagle3 steps 3" in status and "finished" in status
        assert "run 2 of" not in status  # the baseline is not a second run
        assert app.query_one("#acceptance", MetricCard).value_text == f"{sum(rows) / len(rows):.2f} tokens / verify"
        assert app.query_one("#throughput", MetricCard).detail_text.endswith(f"{spec_run[-1].generated_tokens} tokens")
        assert app.query_one("#cycle", MetricCard).detail_text == f"{len(cycles)} cycles · verify {ratio:.2f}× decode"
        hist = plain(AcceptHistogram.renderable_for(app.view, 60))
        for a in range(1, 5):
            assert any(line.split()[:1] == [str(a)] and f" {rows.count(a)} " in line for line in hist.splitlines())
        breakdown = plain(CycleBreakdown.renderable_for(app.view, 80))
        assert [r.phase for r in app.view.phases] == ["draft", "verify", "accept", "draft_extend"]
        assert f"verify = {ratio:.2f}× a plain decode" in breakdown
        graphs = plain(app.query_one(GraphStatus).renderable_for(app.view))
        verify_line = next(line for line in graphs.splitlines() if line.strip().startswith("verify"))
        assert verify_line.split()[1:4] == ["eager", "0", str(len(cycles))]
        assert f"verify {EAGER_NO_CUDA} ({len(cycles)})" in graphs
        table = app.query_one(AllReduceTable)
        assert table.row_count == 0 and not table.display and "none reported (tp 1)" in str(table.border_subtitle)
        lines = app.query_one(WarningLog).lines_text
        assert any(eager_warning("verify", EAGER_NO_CUDA) in line for line in lines)
        assert not any(eager_warning("decode", EAGER_NO_CUDA) in line for line in lines)  # the baseline's own
        app.save_screenshot("real.svg", str(tmp_path))

    drive(app, script)
    assert (tmp_path / "real.svg").stat().st_size > 10_000
