"""The generation loop's bookkeeping and its lagged stop check.

On CUDA the engine reads the stop flag of the step before the last one it launched (``stop_lag=1``),
so one extra step runs after every row has finished. That step must change nothing: the same tokens,
stop reasons, cycle count, accepted lengths and observer stats as a loop that checks after every step
(``stop_lag=0``, the CPU default), and a stream sees every token exactly once. Forced here on CPU.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.runtime.drafters import Eagle3Drafter, NgramDrafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.loop_state import emit_and_advance, emit_tokens, loop_state
from eaglelab.engine.runtime.readback import StepReader
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.engine.runtime.spec_config import SpecConfig
from tests.conftest import CycleCollector, random_model
from tests.engine.runtime.test_accepted_length import TARGET as ORACLE_TARGET
from tests.engine.runtime.test_accepted_length import OracleDrafter
from tests.engine.runtime.test_speculative import CFG, PROMPTS, TAPS, random_drafter


@pytest.fixture(scope="module")
def target():
    return random_model(CFG, seed=21)


@pytest.fixture(scope="module")
def eos(target) -> int:
    """A token plain greedy decoding emits 5th in row 0 (but not in the first 4): that row stops on EOS,
    the others (most likely) on length."""
    row = Engine(target).generate(PROMPTS[:1], 12).tokens[0]
    return next(t for t in row[4:] if t not in row[:4])


def _engine(target, eos: int, spec: SpecConfig | None, lag: int, observer=None) -> Engine:
    if spec is None:
        return Engine(target, eos_token_ids=(eos,), observer=observer, stop_lag=lag)
    drafter = Eagle3Drafter(random_drafter(target, 7), spec, TAPS) if spec.algorithm == "eagle3" \
        else NgramDrafter(spec)
    return Engine(target, eos_token_ids=(eos,), drafter=drafter, spec=spec, observer=observer, stop_lag=lag)


SPECS = {
    "plain": None,
    "chain": SpecConfig("eagle3", num_steps=3, topk=1, attention_mode="decode"),
    "tree": SpecConfig("eagle3", num_steps=2, topk=3, num_draft_tokens=6, attention_mode="decode"),
    "extend": SpecConfig("eagle3", num_steps=2, topk=2, num_draft_tokens=4, attention_mode="prefill"),
    "ngram": SpecConfig("ngram", num_steps=3, attention_mode="decode"),
}


def _lagged_run_is_direct_run(target, eos, kind, prompts, max_new):
    """Run with ``stop_lag`` 0 and 1: the same tokens, stop reasons, cycles, accepted lengths and observer
    cycles (the prefill, every cycle, never the extra step). -> the direct run's result."""
    runs = []
    for lag in (0, 1):
        seen = CycleCollector()
        out = _engine(target, eos, SPECS[kind], lag, seen).generate(prompts, max_new)
        runs.append((out, seen.cycles))
    (direct, direct_cycles), (lagged, lagged_cycles) = runs
    assert lagged.tokens == direct.tokens
    assert lagged.stop_reasons == direct.stop_reasons
    assert (lagged.cycles, lagged.accept_lens) == (direct.cycles, direct.accept_lens)
    assert [(c.index, c.kind, c.accept_len, c.active_rows) for c in lagged_cycles] == \
        [(c.index, c.kind, c.accept_len, c.active_rows) for c in direct_cycles]
    assert len(lagged_cycles) == lagged.cycles + 1  # the prefill, every cycle, never the extra step
    return direct, lagged


@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("max_new", [1, 2, 13])
def test_the_lagged_extra_step_changes_nothing(target, eos, kind, max_new):
    """Tokens, stop reasons, cycles, accepted lengths and the observer's cycles are those of a loop
    that stops at once, though the lagged loop ran one more step after every row finished."""
    direct, lagged = _lagged_run_is_direct_run(target, eos, kind, PROMPTS, max_new)
    if max_new == 13:
        assert "eos" in direct.stop_reasons and lagged.tokens[0][-1] == eos


@pytest.mark.parametrize("kind", list(SPECS))
def test_eos_one_step_before_the_budget_leaves_the_last_step_extra(target, eos, kind):
    """EOS finishes every row at step max_new - 2: the lagged loop has launched the last step the budget
    allows before it reads that, so that step is extra too (not a cycle, not in accept_lens nor the observer)."""
    eos_at = _engine(target, eos, SPECS[kind], 0).generate(PROMPTS[:1], 13)
    assert eos_at.stop_reasons == ["eos"]
    direct, _ = _lagged_run_is_direct_run(target, eos, kind, PROMPTS[:1], eos_at.cycles + 2)
    assert direct.stop_reasons == ["eos"] and direct.cycles == eos_at.cycles  # one step left in the budget


class CountingRunner(EagerRunner):
    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.calls: dict[str, int] = {}

    def phase(self, name, fn, inputs, caches=(), variant=None, state=None, eager=None, compile=True):
        self.calls[name] = self.calls.get(name, 0) + 1
        return super().phase(name, fn, inputs, caches, variant, state, eager, compile)


@pytest.mark.parametrize("lag", [0, 1])
def test_rows_stopped_by_length_leave_no_extra_step(target, eos, lag):
    """No EOS: after max_new - 1 steps every row is done, so even the lagged loop launches exactly those
    steps. An EOS stop can leave one step launched after every row finished (lagged loop only)."""
    runner = CountingRunner(target)
    out = Engine(target, runner=runner, stop_lag=lag).generate(PROMPTS, 9)
    assert runner.calls["decode"] == out.cycles == 8
    runner = CountingRunner(target)
    out = Engine(target, eos_token_ids=(eos,), runner=runner, stop_lag=lag).generate(PROMPTS[:1], 13)
    assert out.stop_reasons == ["eos"] and runner.calls["decode"] == out.cycles + lag


@pytest.mark.parametrize("steps", [1, 3, 5])
@pytest.mark.parametrize("max_new", [2, 7, 13, 30])
def test_speculation_stopped_by_length_launches_no_extra_cycle(steps, max_new):
    """No EOS, a drafter whose every draft is accepted (cycles of steps + 1 tokens): once every row is within
    one cycle of its budget, the lagged loop waits for the cycle in flight before it queues another, so it
    launches exactly the run's cycles, as the direct loop does. (An extra cycle costs a whole verify; the
    wait, one launch.) Without that wait the lagged loop launched one cycle more."""
    free = Engine(ORACLE_TARGET).generate([[7, 8, 9]], max_new).tokens[0]
    spec = SpecConfig("ngram", num_steps=steps)
    outs = []
    for lag in (0, 1):
        runner = CountingRunner(ORACLE_TARGET)
        out = Engine(ORACLE_TARGET, drafter=OracleDrafter(spec, free), spec=spec, runner=runner,
                     stop_lag=lag).generate([[7, 8, 9]], max_new)
        assert runner.calls.get("verify", 0) == out.cycles, (lag, runner.calls, out.cycles)
        outs.append(out)
    assert outs[0].tokens == outs[1].tokens == [free]
    assert outs[1].cycles == -(-(max_new - 1) // (steps + 1))  # every cycle but the last commits steps + 1


@pytest.mark.parametrize("kind", ["plain", "tree"])
def test_a_lagged_loop_streams_a_step_once_the_next_is_queued(target, kind):
    """Lagged: the tokens of the step just read go to the stream after the next step is launched, so the host's
    printing overlaps the device's work instead of delaying the launch (on the GPU, printing each cycle's text
    before the launch made `eaglelab run` half as fast as its cycles). The prefill's token: after step 2."""
    log: list[str] = []

    class Logging(CountingRunner):
        def phase(self, name, *args, **kw):
            log.append(name)
            return super().phase(name, *args, **kw)

    spec = SPECS[kind]
    drafter = None if spec is None else Eagle3Drafter(random_drafter(target, 7), spec, TAPS)
    runner = Logging(target, None if drafter is None else drafter.net)
    engine = Engine(target, drafter=drafter, spec=spec or SpecConfig(), runner=runner, stop_lag=1)
    out = engine.generate(PROMPTS[:1], 9, stream=lambda row, toks: log.append("stream"))
    step = "decode" if spec is None else "cycle"
    launches = [i for i, name in enumerate(log) if name == step]
    assert len(launches) >= 3 and out.cycles >= 3
    assert log.index("stream") > launches[1]  # the prefill's token streamed after the second step's launch


@pytest.mark.parametrize("kind", ["plain", "tree"])
@pytest.mark.parametrize("lag", [0, 1])
def test_a_stream_sees_every_token_once(target, eos, kind, lag):
    got: dict[int, list[int]] = {b: [] for b in range(len(PROMPTS))}
    calls = []

    def stream(row: int, tokens: list[int]) -> None:
        assert tokens, "a stream call carries at least one token"
        calls.append(row)
        got[row].extend(tokens)

    out = _engine(target, eos, SPECS[kind], lag).generate(PROMPTS, 13, stream=stream)
    assert [got[b] for b in range(len(PROMPTS))] == out.tokens
    assert len(calls) <= sum(len(t) for t in out.tokens)


def test_emit_tokens_stops_after_eos_and_at_the_limit():
    """Row 0: [5, 2, 7] with EOS 2 emits [5, 2] and stops on EOS. Row 1: 3 tokens offered, 1 left
    under its limit of 4. Row 2: already done, emits nothing."""
    state = {
        "out": torch.full((3, 8), -1), "n_out": torch.tensor([0, 3, 1]), "limit": torch.tensor([8, 4, 8]),
        "done": torch.tensor([False, False, True]), "hit_eos": torch.zeros(3, dtype=torch.bool),
    }
    state["out"][1, :3] = torch.tensor([4, 4, 4])
    state["out"][2, 0] = 9
    toks = torch.tensor([[5, 2, 7], [6, 6, 6], [1, 1, 1]])
    emitted = emit_tokens(state, toks, torch.tensor([3, 3, 3]), torch.tensor([2]))
    assert emitted.tolist() == [2, 1, 0]
    assert state["out"].tolist()[0][:3] == [5, 2, -1]
    assert state["out"].tolist()[1][:5] == [4, 4, 4, 6, -1]
    assert state["out"].tolist()[2][:2] == [9, -1]
    assert state["n_out"].tolist() == [2, 4, 1]
    assert state["hit_eos"].tolist() == [True, False, False]
    assert state["done"].tolist() == [True, True, True]


def _reference_step(rows, toks, count, root, eos):
    """One step's bookkeeping, row by row in plain Python (the spec emit_and_advance must meet)."""
    out = []
    for r, (t, c, new_root) in enumerate(zip(toks, count, root)):
        row = dict(rows[r])
        emitted = 0
        if not row["done"]:
            for tok in t[:c]:
                if row["n_out"] >= row["limit"]:
                    break
                row["out"] = row["out"] + [tok]
                row["n_out"] += 1
                emitted += 1
                if tok in eos:
                    row["hit_eos"] = True
                    break
            row["done"] = row["hit_eos"] or row["n_out"] >= row["limit"]
            row["lengths"] += c
            row["root"] = new_root
        out.append((row, emitted, not rows[r]["done"]))
    return out


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_emit_and_advance_meets_a_row_by_row_reference(data):
    """Any batch, any tokens, counts, budgets, EOS sets and rows already done: the tensor bookkeeping
    equals the plain-Python reference, step after step (three steps from the same start)."""
    B, K = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 4))
    eos = data.draw(st.sets(st.integers(0, 6), min_size=1, max_size=3))
    limit = data.draw(st.lists(st.integers(0, 8), min_size=B, max_size=B))
    state = loop_state(torch.tensor([5] * B), torch.zeros(B, dtype=torch.long), 8 + K + 1, 0)
    state["limit"] = torch.tensor(limit)
    state["done"] = torch.tensor(data.draw(st.lists(st.booleans(), min_size=B, max_size=B)))
    rows = [{"out": [], "n_out": 0, "limit": limit[b], "done": bool(state["done"][b]), "hit_eos": False,
             "lengths": 5, "root": 0} for b in range(B)]
    for _ in range(3):
        toks = data.draw(st.lists(st.lists(st.integers(0, 9), min_size=K, max_size=K), min_size=B, max_size=B))
        count = data.draw(st.lists(st.integers(1, K), min_size=B, max_size=B))
        root = data.draw(st.lists(st.integers(0, 9), min_size=B, max_size=B))
        emitted, active = emit_and_advance(state, torch.tensor(toks), torch.tensor(count), torch.tensor(root),
                                           torch.tensor(sorted(eos)))
        want = _reference_step(rows, toks, count, root, eos)
        rows = [r for r, _, _ in want]
        assert emitted.tolist() == [e for _, e, _ in want] and active.tolist() == [a for _, _, a in want]
        for b, row in enumerate(rows):
            assert state["out"][b, : row["n_out"]].tolist() == row["out"]
            assert (state["out"][b, row["n_out"]:] == -1).all()
            for name in ("n_out", "done", "hit_eos", "lengths", "root"):
                assert state[name][b].item() == row[name], (name, b)


def test_a_lagged_reader_keeps_each_steps_own_copy():
    """On CPU with a lag, each view is a copy of the state when it was taken, not the live tensor."""
    done = torch.tensor([False, False])
    reader = StepReader(1, {"done": done})
    first = reader.view({"done": done})
    done[0] = True
    second = reader.view({"done": done})
    assert first.read()["done"].tolist() == [False, False] and not first.all_done()
    done[1] = True
    assert second.read()["done"].tolist() == [True, False]
    assert reader.view({"done": done}).all_done()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kind", ["plain", "eagle3"])
def test_on_cuda_graphs_the_lagged_loop_gives_the_stop_at_once_run(kind):
    """Real CUDA graphs with the bookkeeping in-graph: the default lagged stop check (pinned copy + event)
    gives the tokens, stop reasons, cycles and accepted lengths of a loop that reads every step at once,
    a stream sees every token once, and the emitting phase replays."""
    from eaglelab.engine.model.scale_models import build_scale_model, random_eagle3
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner

    model = build_scale_model("tiny", device="cuda", seed=3).model
    algo = "none" if kind == "plain" else "eagle3"
    spec = SpecConfig(algo, num_steps=3, topk=2, num_draft_tokens=5, attention_mode="decode", cuda_graphs=True)
    eos = Engine(model, stop_lag=0).generate(PROMPTS[:1], 12).tokens[0][5]
    runs = []
    for lag in (1, 0):
        drafter = None
        if kind == "eagle3":
            net, taps = random_eagle3(model, seed=5, draft_vocab=256)
            drafter = Eagle3Drafter(net, spec, taps)
        runner = CudaGraphRunner.for_engine(model, spec, drafter, max_len=64, buckets=(1, 4))
        engine = Engine(model, eos_token_ids=(eos,), drafter=drafter, spec=spec, runner=runner, stop_lag=lag)
        got: dict[int, list[int]] = {b: [] for b in range(len(PROMPTS))}
        out = engine.generate(PROMPTS, 12, stream=lambda b, t: got[b].extend(t))
        assert [got[b] for b in range(len(PROMPTS))] == out.tokens
        assert engine.one_graph == (kind == "eagle3")  # the emitting phase: the decode step, or the one-graph cycle
        assert runner._status["decode" if kind == "plain" else "cycle"] == "replay", runner._failed
        runs.append(out)
    lagged, direct = runs
    assert engine.stop_lag == 0 and Engine(model).stop_lag == 1  # the CUDA default: lagged
    assert (lagged.tokens, lagged.stop_reasons) == (direct.tokens, direct.stop_reasons)
    assert (lagged.cycles, lagged.accept_lens) == (direct.cycles, direct.accept_lens)


@pytest.mark.parametrize("kind", ["chain", "tree", "plain"])
def test_the_result_is_read_in_a_few_copies_not_one_per_cycle(target, kind, monkeypatch):
    """On a GPU each read is a sync: the result (tokens, stop reasons, accepted lengths) takes a fixed handful of
    reads however many cycles ran (a read per cycle cost a speculative request ~1-2 ms, inside bench's timing),
    and gives what reading each cycle gives."""
    from eaglelab.engine.runtime import generate as G

    engine = _engine(target, -1, SPECS[kind], 0)
    reads = []

    def counted(read):  # the reads after the loop: the rows' tokens (read_rows), the accepted lengths (_finish)
        def wrapped(*args):
            original = torch.Tensor.tolist

            def tolist(t):
                reads.append(tuple(t.shape))
                return original(t)

            monkeypatch.setattr(torch.Tensor, "tolist", tolist)
            try:
                return read(*args)
            finally:
                monkeypatch.setattr(torch.Tensor, "tolist", original)
        return wrapped

    monkeypatch.setattr(Engine, "_finish", counted(Engine._finish))
    monkeypatch.setattr(G, "read_rows", counted(G.read_rows))
    out = engine.generate(PROMPTS, 13)
    assert out.cycles >= 4 and len(reads) <= 5, reads
    if kind != "plain":
        assert sum(map(sum, out.accept_lens)) + len(PROMPTS) == sum(map(len, out.tokens))  # 1 + accepted per row
