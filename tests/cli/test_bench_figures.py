"""``eaglelab bench --figures``: speculative vs plain per MT-bench category, MT-bench as a whole and code, per batch
size, with issue 40's goals marked met / not met (a tiny random-weight model on the CPU: the structure and the
arithmetic, not the speed)."""

from __future__ import annotations

import gzip
import json

import pytest

from eaglelab.bench import figures as F
from eaglelab.bench.prompt_sets import CODE_PREFIX, figure_sets
from eaglelab.bench.timing import MachineLoad
from eaglelab.cli import main

QUESTIONS = [{"question_id": i, "category": c, "turns": [t, "second turn, never asked"]} for i, (c, t) in enumerate([
    ("writing", "Write a haiku about the sea."), ("math", "What is 12 times 12?"),
    ("writing", "Write a limerick about a cat."), ("math", "What is the square root of 81?")])]
PROBLEMS = [{"task_id": f"HumanEval/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n"} for i in range(5)]


@pytest.fixture()
def sets_files(tmp_path):
    q = tmp_path / "question.jsonl"
    q.write_text("\n".join(json.dumps(x) for x in QUESTIONS) + "\n")
    he = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(he, "wt") as f:
        f.write("\n".join(json.dumps(p) for p in PROBLEMS) + "\n")
    return q, he


def test_figure_sets_are_every_first_turn_by_category_then_spread_code_prompts(sets_files):
    """Four questions of two categories -> writing (2), math (2), first turns only in file order; 2 of 5 problems
    spread evenly (0 and 2), asked as code requests."""
    q, he = sets_files
    sets = figure_sets(q, 2, he)
    assert [(s.name, s.kind, len(s.texts)) for s in sets] == [("writing", "category", 2), ("math", "category", 2),
                                                            ("code", "code", 2)]
    assert sets[0].texts == ("Write a haiku about the sea.", "Write a limerick about a cat.")
    assert sets[2].texts == (CODE_PREFIX + PROBLEMS[0]["prompt"], CODE_PREFIX + PROBLEMS[2]["prompt"])
    assert [s.name for s in figure_sets(q, 0, he)] == ["writing", "math"]


def test_figures_report_per_category_whole_and_code_with_goals(sets_files, tmp_path, monkeypatch, capsys):
    """batch 1 and 2: a line per category, code, and MT-bench as a whole per batch; the whole's tok/s is the
    categories' tokens over their seconds pass by pass; goals at batch 1 marked, batch 8 and 32 not measured."""
    from eaglelab.bench import suite

    monkeypatch.setattr(suite, "machine_load", lambda own: MachineLoad(own, 2, own))
    q, he = sets_files
    out = tmp_path / "fig.json"
    assert main(["bench", "--figures", "--scale-model", "tiny", "--device", "cpu", "--max-new-tokens", "4",
                 "--batch-sizes", "1,2", "--repeats", "2", "--questions", str(q), "--humaneval", str(he),
                 "--code-prompts", "2", "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep["schema"] == F.SCHEMA and rep["settings"]["sets"] == {"writing": 2, "math": 2, "code": 2}
    assert rep["settings"]["plain"] == "plain-eager" and rep["settings"]["speculative"] == "spec-decode"
    figs = {(f["name"], f["batch"]): f for f in rep["figures"]}
    assert set(figs) == {(n, b) for n in ("writing", "math", "code", "mt-bench") for b in (1, 2)}
    for f in rep["figures"]:
        # 2 prompts a set, 4 tokens a row: one group of 2 rows at batch 2, two of 1 at batch 1; the whole: 2 sets
        assert f["tokens"] == 2 * 4 * (2 if f["kind"] == "mt-bench" else 1)
        assert len(f["pass_speedups"]) == 2 and f["plain_tok_per_s"] > 0 and f["spec_tok_per_s"] > 0
        assert f["accept_len"] is not None and f["accept_len"] >= 1
        assert f["same_tokens"] == 1.0  # float32 on the CPU: speculation never changes the output
    for b in (1, 2):
        cats, w = [figs[("writing", b)], figs[("math", b)]], figs[("mt-bench", b)]
        for p in range(2):
            plain = sum(c["tokens"] for c in cats) / sum(c["tokens"] / c["plain_passes"][p] for c in cats)
            spec = sum(c["tokens"] for c in cats) / sum(c["tokens"] / c["spec_passes"][p] for c in cats)
            assert w["pass_speedups"][p] == pytest.approx(spec / plain)
        assert w["prompts"] == 4
        assert len(w["groups"]) == sum(len(c["groups"]) for c in cats) == (4 if b == 1 else 2)  # the whole pools them
        assert w["interval"] is None  # under five prompt groups: no interval
    assert figs[("writing", 1)]["goal"] == 2.0 and figs[("mt-bench", 1)]["goal"] == 2.5
    assert figs[("code", 1)]["goal"] == 2.8 and figs[("code", 2)]["goal"] is None
    assert figs[("code", 1)]["met"] == (figs[("code", 1)]["speedup"] >= 2.8)
    status = {(g["minimum"], g["batch"]): g["status"] for g in rep["goals"]}
    assert status[(1.8, 8)] == "not measured" and status[(1.3, 32)] == "not measured"
    assert status[(2.5, 1)] in ("met", "not met")
    for (name, b), f in figs.items():  # rows busy: plain's rows, ending together, every step; the whole weighs sets
        plain_busy, spec_busy = f["busy_rows"]
        assert plain_busy == 1.0 and 0 < spec_busy <= 1.0 and all(n > 0 for n in f["row_slots"])
    for b in (1, 2):
        cats, w = [figs[("writing", b)], figs[("math", b)]], figs[("mt-bench", b)]
        assert w["row_slots"][1] == sum(c["row_slots"][1] for c in cats)
        assert w["busy_rows"][1] == pytest.approx(sum(c["busy_rows"][1] * c["row_slots"][1] for c in cats)
                                                  / w["row_slots"][1])
    md = out.with_suffix(".md").read_text()
    assert "## Batch 1" in md and "## Batch 2" in md and "| writing | 2 |" in md and "MT-bench as a whole" in md
    batch1, batch2 = md.split("## Batch 2")
    assert "rows busy" not in batch1 and "| rows busy, plain / speculative |" in batch2  # a batch's column only
    w2 = figs[("mt-bench", 2)]["busy_rows"]
    assert f"| {w2[0]:.2f} / {w2[1]:.2f} |" in batch2
    assert "not measured" in capsys.readouterr().out


def test_mt_bench_as_a_whole_weighs_each_categorys_busy_rows_by_the_rows_x_cycles_it_ran():
    """writing 0.5 of 100 rows x cycles, stem 1.0 of 300: the whole 350 / 400; a category without the figure (a
    report from before it, the HF peer) leaves the whole's unknown."""
    from dataclasses import replace

    writing = replace(_category("writing", 2.0), batch=8, busy_rows=(1.0, 0.5), row_slots=(80, 100))
    stem = replace(_category("stem", 2.0), batch=8, busy_rows=(1.0, 1.0), row_slots=(120, 300))
    w = F.whole([writing, stem], 8)
    assert w.busy_rows == (1.0, pytest.approx(0.875)) and w.row_slots == (200, 400)
    assert F.whole([writing, replace(stem, busy_rows=(None, None))], 8).busy_rows == (None, None)


def test_goal_marks_the_worst_category():
    """Every category must reach 2.0x at batch 1: one at 1.9x makes the goal not met, named by that category."""
    figs = [_category("writing", 2.4), _category("stem", 1.9)]
    g = next(g for g in F.goal_lines(figs, 2) if g["minimum"] == 2.0)
    assert g["status"] == "not met" and g["where"] == "stem" and g["speedup"] == 1.9


def test_every_category_is_not_met_by_the_categories_measured_so_far():
    """2 of 8 categories measured, both at 2.4x: "every category" is not measured (6 are missing), not met; one of
    the 2 at 1.9x is already not met whatever the other 6 read."""
    every = lambda figs: next(g for g in F.goal_lines(figs, 8) if g["minimum"] == 2.0)  # noqa: E731
    assert every([_category("writing", 2.4), _category("stem", 2.4)])["status"] == "not measured"
    assert every([_category("writing", 2.4), _category("stem", 2.4)])["speedup"] is None
    assert every([_category("writing", 2.4), _category("stem", 1.9)])["status"] == "not met"


def _category(name: str, s: float) -> F.SetFigure:
    return F.with_goal(F.SetFigure(name, "category", 1, 10, 640, 100.0, 100.0 * s, s, (s,), (100.0,), (100.0 * s,),
                                   3.0, 1.0))


def _cut_after(monkeypatch, figures: int, stop) -> list[int]:
    """run_batch measures ``figures`` set x batch figures, then ``stop()`` is called in its place."""
    from eaglelab.bench import harness

    real, calls = harness.run_batch, []

    def cut(cfgs, ctx, batch, systems, **kw):
        calls.append(batch)
        if len(calls) > figures:
            stop()
        return real(cfgs, ctx, batch, systems, **kw)

    monkeypatch.setattr(harness, "run_batch", cut)
    return calls


def _figures(q, he, out) -> int:
    return main(["bench", "--figures", "--scale-model", "tiny", "--device", "cpu", "--max-new-tokens", "4",
                 "--batch-sizes", "1,2", "--repeats", "1", "--questions", str(q), "--humaneval", str(he),
                 "--code-prompts", "2", "--json", str(out)])


def test_a_figures_run_stopped_by_sigterm_keeps_the_partial_report(sets_files, tmp_path, monkeypatch, capsys):
    """`timeout` sends SIGTERM after the first figure (writing at batch 1): the JSON and its .md hold that figure alone,
    marked partial, no MT-bench as a whole and its goals not measured; exit 130, one line naming the files."""
    import os
    import signal

    def sigterm():
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, "SIGTERM would kill the run (and pytest)"
        os.kill(os.getpid(), signal.SIGTERM)

    calls = _cut_after(monkeypatch, 1, sigterm)
    q, he = sets_files
    out = tmp_path / "fig.json"
    assert _figures(q, he, out) == 130 and calls == [1, 2]
    rep = json.loads(out.read_text())
    assert rep["partial"] is True and [(f["name"], f["batch"]) for f in rep["figures"]] == [("writing", 1)]
    status = {g["goal"]: g["status"] for g in rep["goals"]}
    assert status[">= 2.5x at batch 1: mt-bench"] == "not measured"
    assert status[">= 2.8x at batch 1: code"] == "not measured"
    writing = rep["figures"][0]
    assert status[">= 2x at batch 1: every category"] == ("not met" if writing["speedup"] < 2.0 else "not measured")
    assert "**Partial**: cut short after 1 of 6 figures" in out.with_suffix(".md").read_text()
    err = capsys.readouterr().err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert "Traceback" not in err and last == (f"interrupted: what was measured (1 of 6 figures) is in {out} and "
                                               f'{out.with_suffix(".md")} ("partial": true)')
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is the command's only


def test_mtbench_as_a_whole_shows_only_once_every_category_is_in(sets_files, tmp_path, monkeypatch, capsys):
    """Interrupted after writing at batch 1 and 2 and math at batch 1: the whole at batch 1 (both categories in),
    none at batch 2 (math missing); the final report of an uncut run has no "partial"."""
    def interrupt():
        raise KeyboardInterrupt

    _cut_after(monkeypatch, 3, interrupt)
    q, he = sets_files
    out = tmp_path / "fig.json"
    assert _figures(q, he, out) == 130
    rep = json.loads(out.read_text())
    assert rep["partial"] is True and [(f["name"], f["batch"]) for f in rep["figures"]] == [
        ("writing", 1), ("writing", 2), ("math", 1), ("mt-bench", 1)]
    whole = rep["figures"][-1]
    assert whole["prompts"] == 4 and whole["tokens"] == sum(f["tokens"] for f in rep["figures"] if f["batch"] == 1
                                                           and f["kind"] == "category")
    monkeypatch.undo()
    assert _figures(q, he, out) == 0
    rep = json.loads(out.read_text())
    assert "partial" not in rep and len(rep["figures"]) == 3 * 2 + 2
    assert "Partial" not in out.with_suffix(".md").read_text()


def test_the_figures_header_says_whether_rows_ended_at_eos():
    from eaglelab.bench.figures import row_length

    assert row_length({"max_new_tokens": 128, "eos_token_ids": []}) == "128 tokens a row"
    assert row_length({"max_new_tokens": 128}) == "128 tokens a row"  # a report from before --eos
    assert row_length({"max_new_tokens": 128, "eos_token_ids": [2]}) == \
        "up to 128 tokens a row, each ending at the model's EOS"
