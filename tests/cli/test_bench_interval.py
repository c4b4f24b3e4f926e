"""The bench's 95% interval of a speedup over the prompt groups drawn (``harness.speedup_interval``): a paired
bootstrap, checked against what it must be where the answer is known, and end to end in the headline."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.bench.harness import INTERVAL_GROUPS, BenchRow, finish_rows, speedup_interval

rates = st.floats(min_value=50.0, max_value=5000.0, allow_nan=False)


def _row(name: str, tok_per_s, tokens) -> BenchRow:
    total = sum(tokens)
    seconds = sum(n / t for n, t in zip(tokens, tok_per_s))
    return BenchRow(config=name, batch=1, tok_per_s=total / seconds, tokens=total, seconds=seconds,
                    sweeps_tok_per_s=(total / seconds,), group_tok_per_s=tuple(tok_per_s), group_tokens=tuple(tokens))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(rates, min_size=INTERVAL_GROUPS, max_size=30), st.floats(0.5, 4.0),
       st.lists(st.integers(1, 512), min_size=30, max_size=30))
def test_a_speedup_the_same_on_every_group_has_no_width(plain, factor, tokens):
    """Paired: where every group runs exactly `factor` times faster, every draw reads `factor`, however unlike the
    groups are (fast and slow prompts, long and short answers)."""
    tokens = tokens[:len(plain)]
    lo, hi = speedup_interval(_row("spec", [t * factor for t in plain], tokens), _row("plain", plain, tokens))
    assert lo == pytest.approx(factor, rel=1e-9) and hi == pytest.approx(factor, rel=1e-9)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.lists(st.tuples(rates, st.floats(0.8, 3.0), st.integers(16, 256)), min_size=INTERVAL_GROUPS, max_size=24))
def test_the_interval_holds_the_headline_within_the_groups_range(groups):
    """The speedup over all groups (tokens over seconds on each side) lies inside the interval, and the interval
    inside the range of the group-by-group speedups; the same rows give the same interval."""
    plain = [g[0] for g in groups]
    spec = [g[0] * g[1] for g in groups]
    tokens = [g[2] for g in groups]
    a, b = _row("spec", spec, tokens), _row("plain", plain, tokens)
    lo, hi = speedup_interval(a, b)
    whole = a.tok_per_s / b.tok_per_s
    ratios = [g[1] for g in groups]
    assert min(ratios) - 1e-9 <= lo <= hi <= max(ratios) + 1e-9
    assert lo - 1e-9 <= whole <= hi + 1e-9 or hi - lo < 1e-6
    assert speedup_interval(a, b) == (lo, hi)


def test_one_runaway_prompt_widens_it_and_few_groups_give_none():
    """Ten prompts at 2x and one at 5x (a text fallen into repetition): the interval reaches above 2x; with the
    outlier gone it is 2x to 2x; under five groups there is none; without the tokens there is none."""
    plain, tokens = [1000.0] * 10, [128] * 10
    steady = speedup_interval(_row("s", [2000.0] * 10, tokens), _row("p", plain, tokens))
    assert steady == pytest.approx((2.0, 2.0))
    lo, hi = speedup_interval(_row("s", [2000.0] * 9 + [5000.0], tokens), _row("p", plain, tokens))
    assert lo >= 2.0 and hi > 2.15
    assert speedup_interval(_row("s", [2000.0] * 4, [128] * 4), _row("p", [1000.0] * 4, [128] * 4)) is None
    bare = BenchRow(config="s", batch=1, tok_per_s=2.0, group_tok_per_s=(2.0,) * 6)
    assert speedup_interval(bare, bare) is None


def test_finish_rows_gives_speculative_rows_their_interval_and_the_headline_states_it():
    from eaglelab.bench.report import headline
    from eaglelab.cmd_bench import _headline_lines

    tokens = [128] * 8
    rows = [_row("plain-compile-gemv-attn", [1000.0 + 10 * i for i in range(8)], tokens),
            _row("spec-compile-gemv-attn", [2000.0 + 150 * i for i in range(8)], tokens)]
    done = finish_rows(rows, {})
    assert done[0].speedup_interval == pytest.approx((1.0, 1.0))
    lo, hi = done[1].speedup_interval
    assert lo < 2.4 < hi
    h = headline(done, [], 0, 0.0)
    assert h["spec_speedup_spread"]["spec-compile-gemv-attn"][1]["interval"] == [lo, hi]
    text = "\n".join(_headline_lines(h))
    assert f"95% over the prompts drawn (bootstrap): {lo:.2f}x .. {hi:.2f}x" in text


def test_mtbench_as_a_whole_pools_the_categories_prompts_and_the_table_shows_the_interval():
    """`bench --figures`: each category's interval over its own prompts, MT-bench as a whole's over all of theirs
    (a category of ten prompts says less than eighty do); the markdown table gives it beside the speedup."""
    from dataclasses import asdict

    from eaglelab.bench import figures as F
    from eaglelab.bench.prompt_sets import PromptSet

    def cat(name, ratios):
        tokens = [128] * len(ratios)
        plain = _row("plain", [1000.0 + 7 * i for i in range(len(ratios))], tokens)
        spec = _row("spec", [t * r for t, r in zip(plain.group_tok_per_s, ratios)], tokens)
        spec = finish_rows([plain, spec], {}, prefer="plain")[1]
        return F.set_figure(PromptSet(name, "category", ("q",) * len(ratios)), 1, plain, spec, None)

    stem, writing = cat("stem", [1.8, 2.0, 1.9, 2.2, 1.7, 2.1]), cat("writing", [2.4, 2.2, 2.6, 2.3, 2.5, 2.9])
    whole = F.whole([stem, writing], 1)
    pooled = speedup_interval(_row("s", [g[3] for g in whole.groups], [g[2] for g in whole.groups]),
                              _row("p", [g[1] for g in whole.groups], [g[0] for g in whole.groups]))
    assert len(whole.groups) == 12 and whole.interval == pooled
    assert stem.interval[1] < writing.interval[1] and whole.interval[0] > stem.interval[0]
    settings = {"model": "m", "speculative": "s", "plain": "p", "regime": "r", "repeats": 1, "batch_sizes": [1],
                "max_new_tokens": 128, "eos": False}
    md = F.markdown({"settings": settings, "figures": [asdict(f) for f in (stem, writing, whole)], "goals": []})
    assert f"| {whole.interval[0]:.2f}x .. {whole.interval[1]:.2f}x |" in md and "paired bootstrap" in md


def test_a_goal_within_the_worst_figures_interval_says_another_draw_could_read_the_other_verdict():
    """stem at 1.97x with 1.80x .. 2.15x: "not met", and the goal of 2.0x lies inside its interval, so the goal line
    says so; writing's 2.40x with 2.30x .. 2.50x alone would be met beyond the noise (no such words)."""
    from dataclasses import replace

    from eaglelab.bench import figures as F

    def cat(name, s, interval):
        base = F.SetFigure(name, "category", 1, 10, 1280, 1000.0, 1000.0 * s, s, (s,), (1000.0,), (1000.0 * s,),
                           3.0, None)
        return F.with_goal(replace(base, interval=interval))

    stem, writing = cat("stem", 1.97, (1.80, 2.15)), cat("writing", 2.40, (2.30, 2.50))
    g = next(g for g in F.goal_lines([stem, writing], 2) if g["minimum"] == 2.0)
    assert g["status"] == "not met" and g["where"] == "stem" and g["interval"] == [1.80, 2.15] and g["within_noise"]
    alone = next(g for g in F.goal_lines([writing], 1) if g["minimum"] == 2.0)
    assert alone["status"] == "met" and alone["within_noise"] is False
    settings = {"model": "m", "speculative": "s", "plain": "p", "regime": "r", "repeats": 1, "batch_sizes": [1],
                "max_new_tokens": 128, "eos": False}
    md = F.markdown({"settings": settings, "figures": [], "goals": [g, alone]})
    assert "1.97x, lowest: stem; 95% over the prompts 1.80x .. 2.15x; the goal is within it" in md
    assert "2.40x, lowest: writing; 95% over the prompts 2.30x .. 2.50x)" in md
