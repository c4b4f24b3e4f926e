"""The TUI's reducer (eaglelab.tui.model) on hand-made and synthetic events; no Textual needed."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.probes.events import AllReduce, RunFinished, RunStarted, Step, WarningEvent
from eaglelab.probes.record import read_record
from eaglelab.tui.model import RunModel, reduce_events
from eaglelab.tui.synthetic import synthetic_run, write_synthetic_record


def started(num_steps: int = 3, algorithm: str = "eagle3", tp_size: int = 1) -> RunStarted:
    spec = {"algorithm": algorithm, "num_steps": num_steps, "topk": 1, "num_draft_tokens": num_steps + 1,
            "attention_mode": "decode", "cuda_graphs": True}
    return RunStarted("m", "d", "cpu", "float32", 1, spec, {}, {}, tp_size=tp_size)


def spec_step(i: int, rows: tuple[int, ...], n: int = 4, **phase_ms: float) -> Step:
    phases = phase_ms or {"draft": 1.0, "verify": 2.0, "accept": 0.5, "draft_extend": 0.5}
    return Step(index=i, kind="spec", phase_ms=phases, accept_len=rows, num_draft_tokens=n)


def test_acceptance_of_two_chain_cycles():
    """Accept lengths 3 and 1 on a chain of 3 drafts: mean 2, rate (2+0)/(3+3), histogram padded to 4."""
    view = reduce_events([started(3), spec_step(1, (3,)), spec_step(2, (1,))])
    assert view.mean_accept_len == pytest.approx(2.0)
    assert view.accept_rate == pytest.approx(1 / 3)
    assert view.legacy_accept_rate == pytest.approx(4 / 8)
    assert view.accept_histogram == ((1, 1), (2, 0), (3, 1), (4, 0))
    assert view.per_position == pytest.approx((0.5, 0.5, 0.0))
    assert view.accept_len_history == (3.0, 1.0)
    assert view.spec_cycles == 2 and view.generated_tokens == 4


def test_finished_rows_with_zero_accept_are_not_counted():
    """A row that stopped (accept 0) is neither in the histogram nor in the per-cycle mean."""
    view = reduce_events([started(3), spec_step(1, (4, 0)), spec_step(2, (2, 0))])
    assert view.accept_histogram == ((1, 0), (2, 1), (3, 0), (4, 1))
    assert view.accept_len_history == (4.0, 2.0)


def test_phase_means_recent_window_and_shares():
    """Verify 10, 20, 30 ms: run mean 20, mean of the last 2 is 25; shares are of the summed means."""
    model = RunModel(window=2)
    model.apply(started())
    for i, v in enumerate((10.0, 20.0, 30.0)):
        model.apply(spec_step(i, (2,), draft=5.0, verify=v, accept=1.0, draft_extend=4.0))
    rows = {p.phase: p for p in model.view().phases}
    assert [p.phase for p in model.view().phases] == ["draft", "verify", "accept", "draft_extend"]
    assert rows["verify"].mean_ms == pytest.approx(20.0)
    assert rows["verify"].recent_ms == pytest.approx(25.0)
    assert rows["verify"].share == pytest.approx(20.0 / 30.0)
    assert model.view().cycle_ms == pytest.approx(30.0)


def test_rolling_tokens_per_second_and_history():
    """Window 2: (2 tok, 10 ms), (4 tok, 10 ms), (1 tok, 20 ms) -> 200, 300, then 5 tok / 30 ms."""
    model = RunModel(window=2)
    model.apply(started())
    for i, (a, ms) in enumerate(((2, 10.0), (4, 10.0), (1, 20.0))):
        model.apply(spec_step(i, (a,), verify=ms))
    view = model.view()
    assert view.tokens_per_s_history == pytest.approx((200.0, 300.0, 5000.0 / 30.0))
    assert view.recent_tokens_per_s == pytest.approx(5000.0 / 30.0)
    assert view.tokens_per_s == pytest.approx(7000.0 / 40.0)  # not finished: tokens over busy time
    assert view.accept_len_trend == pytest.approx((2.0, 3.0, 2.5))


def test_history_is_bounded():
    model = RunModel(history=5)
    model.apply(started())
    model.apply_all(spec_step(i, (1 + i % 4,)) for i in range(12))
    assert len(model.view().accept_len_history) == 5
    assert model.view().accept_len_history == (1.0 + 7 % 4, 1.0 + 8 % 4, 1.0 + 9 % 4, 1.0 + 10 % 4, 1.0 + 11 % 4)


def test_graph_rows_count_replays_and_reasons():
    """Rows in engine phase order; eager reasons counted, most frequent first."""
    events = [started()]
    graphs = [
        {"draft": "replay", "verify": "eager: prefill attention"},
        {"draft": "replay", "verify": "eager: prefill attention"},
        {"draft": "replay", "verify": "eager: batch 3 has no graph"},
        {"draft": "eager: warming up", "verify": "replay"},
    ]
    for i, g in enumerate(graphs):
        events.append(Step(index=i, kind="spec", phase_ms={"verify": 1.0}, accept_len=(1,), num_draft_tokens=4, graph=g))
    view = reduce_events(events)
    assert [r.phase for r in view.graphs] == ["draft", "verify"]
    draft, verify = view.graphs
    assert (draft.replays, draft.eager, draft.reasons) == (3, 1, (("warming up", 1),))
    assert (verify.replays, verify.eager) == (1, 3)
    assert verify.reasons == (("prefill attention", 2), ("batch 3 has no graph", 1))
    assert verify.replay_share == pytest.approx(0.25)
    assert view.replay_fraction == pytest.approx(0.25)  # spec steps count verify


def test_allreduce_rows_sum_over_phases_of_one_rank():
    """A TP record holds every rank's calls; the table shows the lowest rank's, so nothing is counted twice."""
    events = [started(tp_size=2)]
    for rank in (1, 0):  # rank 1's events may come first
        for phase, ms in (("verify", 0.5), ("draft", 0.25)):
            events.append(AllReduce(layer=1, site="attn", nbytes=100, ms=ms * (1 + rank), rank=rank, world_size=2,
                                    phase=phase))
    events.append(AllReduce(layer=0, site="mlp", nbytes=40, ms=1.0, rank=0, world_size=2, phase="verify", in_graph=True))
    events.append(spec_step(1, (2,), verify=10.0))
    view = reduce_events(events)
    assert [(r.layer, r.site) for r in view.allreduce] == [(0, "mlp"), (1, "attn")]
    mlp, attn = view.allreduce
    assert (attn.calls, attn.total_ms, attn.nbytes, attn.in_graph) == (2, pytest.approx(0.75), 200, 0)
    assert attn.mean_ms == pytest.approx(0.375) and attn.mean_bytes == pytest.approx(100.0)
    assert mlp.in_graph == 1
    assert view.allreduce_ms == pytest.approx(1.75)
    assert view.allreduce_share == pytest.approx(1.75 / 10.0)


def test_verify_over_decode_and_plain_phase_rows():
    """With plain decode steps (12 ms) and spec cycles (verify 30 ms): verify costs 2.5 decodes."""
    events = [started()]
    events += [Step(index=i, kind="decode", phase_ms={"decode": 12.0}, accept_len=(1,)) for i in range(3)]
    events += [spec_step(3 + i, (2,), verify=30.0) for i in range(2)]
    view = reduce_events(events)
    assert view.decode_ms == pytest.approx(12.0)
    assert view.verify_over_decode == pytest.approx(2.5)
    plain = reduce_events([started(algorithm="none"), *events[1:4]])
    assert [p.phase for p in plain.phases] == ["decode"]
    assert plain.accept_rate is None and plain.accept_histogram == ()
    assert plain.cycle_ms == pytest.approx(12.0)
    assert plain.header is not None and plain.header.spec_label == "plain decoding"


def test_second_run_started_resets_the_view():
    events = [started(), spec_step(1, (4,)), RunFinished(1, 4, 1.0, 1), started(), spec_step(1, (1,))]
    view = reduce_events(events)
    assert view.runs_seen == 2
    assert view.spec_cycles == 1 and view.mean_accept_len == pytest.approx(1.0)
    assert not view.finished


def test_a_recorded_baseline_lends_its_decode_cost_and_nothing_else():
    """`eaglelab run --record` writes the plain baseline after the speculative run: the view keeps
    the speculative run's figures and takes the baseline's mean decode (12 ms) for verify x decode."""
    spec_run = [started(), spec_step(1, (4,), verify=30.0), RunFinished(1, 4, 1.0, 1, 4.0)]
    plain = dataclasses.replace(started(algorithm="none"), baseline=True)
    baseline = [plain, Step(index=1, kind="decode", phase_ms={"decode": 10.0}, accept_len=(1,)),
                Step(index=2, kind="decode", phase_ms={"decode": 14.0}, accept_len=(1,)),
                WarningEvent("runner", "only the baseline's"), RunFinished(1, 2, 2.0, 2)]
    for events in (spec_run + baseline, baseline + spec_run):  # either order
        view = reduce_events(events)
        assert view.runs_seen == 1 and view.finished and view.header.speculative
        assert view.decode_ms == pytest.approx(12.0) and view.verify_over_decode == pytest.approx(2.5)
        assert (view.spec_cycles, view.decode_steps, view.generated_tokens, view.run_seconds) == (1, 0, 4, 1.0)
        assert view.warnings == () and view.cycle_ms_history == (30.0,)


def test_finished_uses_engine_wall_time():
    view = reduce_events([started(), spec_step(1, (3,)), RunFinished(5, 3, 0.5, 1, 3.0, ("eos",))])
    assert view.finished and view.run_seconds == pytest.approx(0.5)
    assert view.tokens_per_s == pytest.approx(6.0)
    assert view.stop_reasons == ("eos",)


def test_warnings_are_capped_to_the_latest():
    model = RunModel(max_warnings=3)
    model.apply_all(WarningEvent("w", str(i)) for i in range(5))
    assert model.view().warnings == (("w", "2"), ("w", "3"), ("w", "4"))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=3), min_size=1, max_size=30))
def test_histogram_and_mean_match_a_naive_count(cycles):
    """Histogram totals, mean accept length and per-cycle history agree with a direct count."""
    view = reduce_events([started(4), *(spec_step(i, tuple(c), n=5) for i, c in enumerate(cycles))])
    rows = [a for c in cycles for a in c if a > 0]
    assert sum(n for _, n in view.accept_histogram) == len(rows)
    for a, n in view.accept_histogram:
        assert n == rows.count(a)
    if rows:
        assert view.mean_accept_len == pytest.approx(sum(rows) / len(rows))
        assert view.accept_histogram[-1][0] == 5  # padded to num_steps + 1
    per_cycle = [sum(x for x in c if x > 0) / len([x for x in c if x > 0]) for c in cycles if any(x > 0 for x in c)]
    assert view.accept_len_history == pytest.approx(tuple(per_cycle))


def test_synthetic_record_round_trips_to_the_same_view(tmp_path):
    """The generator's record, read back, gives the view of the events themselves."""
    knobs = dict(cycles=40, tp_size=2, verify_mode="prefill", seed=3)
    path = write_synthetic_record(tmp_path / "run.jsonl", **knobs)
    result = read_record(path)
    assert result.skipped_lines == 0
    assert reduce_events(result.events) == reduce_events(synthetic_run(**knobs))


def test_synthetic_prefill_verify_is_slow_and_eager():
    """The demo tells the deployment story: eager verify at ~2.4 decodes, graphs for the rest."""
    view = reduce_events(synthetic_run(cycles=60, verify_mode="prefill", seed=0))
    assert view.verify_over_decode == pytest.approx(2.4, rel=0.06)
    verify = next(r for r in view.graphs if r.phase == "verify")
    assert verify.replays == 0 and verify.eager == 60
    fast = reduce_events(synthetic_run(cycles=60, verify_mode="decode", seed=0))
    assert fast.verify_over_decode == pytest.approx(1.05, rel=0.06)
    assert fast.recent_tokens_per_s > view.recent_tokens_per_s


def test_model_imports_neither_torch_nor_textual():
    code = ("import sys, eaglelab.tui.model, eaglelab.tui.synthetic; "
            "print('torch' in sys.modules, 'textual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
