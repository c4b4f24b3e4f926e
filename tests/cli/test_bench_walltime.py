"""``eaglelab bench`` says where its wall time went (start-up, load, graphs, warm-up, timed passes, HF, other), in
one line and in the JSON's ``walltime``, the parts adding up to the run's wall time."""

from __future__ import annotations

import json
import time

import pytest

from eaglelab.bench.walltime import PARTS, WallClock, breakdown, describe
from eaglelab.cli import main

class FakeClock:
    """A host clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_breakdown_carves_the_graphs_out_of_the_warm_ups_and_passes():
    """Worked example: 2 s before the run and 68 s in it (70 s); load 5 s; our warm-ups 40 s and passes 12 s (9 s of
    them generating); captures 40 s, of which compile 30 s and kernel tuning 4 s; HF 6 s (load 2 s). -> graphs 40,
    warm-up 40 + 12 - 40 - 9 = 3, timed passes 9, capture 40 - 30 - 4 = 6, other 70 - 65 = 5."""
    clock = FakeClock()
    wall = WallClock(clock=clock, before=2.0)
    for part, s in (("load", 5.0), ("warm-up", 40.0), ("passes", 12.0), ("timed", 9.0), ("hf load", 2.0),
                    ("hf warm-up", 1.0), ("hf pass", 3.0)):
        wall.add(part, s)
    wall.compiled.update({"plain-compile b1": 12.0, "spec-compile b1": 18.0})
    clock.now += 68.0  # the run's own wall time; with the 2 s before it, 70 s
    captures = {"plain-compile": [{"seconds": 15.0}], "spec-compile": [{"seconds": 20.0}, {"seconds": 5.0}]}
    w = breakdown(wall, captures, compiled=30.0, kernel_seconds=4.0)
    assert w["parts"] == {"start-up": 2.0, "load": 5.0, "graphs": 40.0, "warm-up": 3.0, "timed passes": 9.0,
                          "HF": 6.0, "profile": 0.0, "micro": 0.0, "other": 5.0}
    assert w["seconds"] == pytest.approx(70.0) and list(w["parts"]) == list(PARTS)
    assert w["capture"] == pytest.approx(6.0) and w["hf_load"] == 2.0
    line = describe(w)
    assert line.startswith("where the time went: 70.0 s since the process started = start-up 2.0 + load 5.0")
    assert "graphs 40.0 (compile 30.0: plain-compile b1 12.0, spec-compile b1 18.0; kernel tuning 4.0; capture 6.0)" in line
    assert "HF 6.0 (load 2.0)" in line and "+ other 5.0" in line and "profile" not in line


@pytest.mark.usefixtures("one_thread", "idle_machine")
def test_a_cpu_run_says_where_its_wall_time_went(tmp_path, questions, capsys):
    """A tiny CPU headline: the JSON's parts add up to its total, which is the run's wall time as the test's own
    clock saw it (plus the process's start-up before the run); load, warm-up, timed passes and HF each took some;
    no graphs on a CPU; the printed line gives the same total."""
    out = tmp_path / "bench.json"
    t0 = time.perf_counter()
    rc = main(["bench", "--scale-model", "tiny", "--device", "cpu", "--max-new-tokens", "4", "--prompts", "2",
               "--repeats", "2", "--questions", str(questions), "--json", str(out)])
    measured = time.perf_counter() - t0
    assert rc == 0
    w = json.loads(out.read_text())["walltime"]
    parts = w["parts"]
    assert all(v >= 0 for v in parts.values()) and sum(parts.values()) == pytest.approx(w["seconds"])
    own = w["seconds"] - parts["start-up"]  # from run_bench's start to its report, inside main()
    assert measured * 0.5 <= own <= measured + 0.05
    # most of it is in a named part: "other" (the report, freeing memory) is a fixed ~0.25-0.3 s on this VM, which
    # a warm process in the full suite (HF already imported: own ~2 s) made 0.5004 s once; a ratio, not a timing
    assert parts["other"] <= max(1.0, 0.5 * own)  # in the full suite: own 0.82 s, other 0.49 s (CI, twice ~0.5)
    assert min(parts["load"], parts["warm-up"], parts["timed passes"], parts["HF"], w["hf_load"]) > 0
    assert parts["graphs"] == 0 and w["compile"] == 0 and w["compile_sets"] == {}
    flat = " ".join(capsys.readouterr().out.split())
    assert f"where the time went: {w['seconds']:.1f} s" in flat and "graphs" not in flat.split("where the time")[1]


@pytest.mark.usefixtures("one_thread", "idle_machine")
def test_the_headlines_hf_peer_times_one_group_of_at_most_32_tokens(tmp_path, questions, capsys):
    """The HF peer is a reference: with no flags it times its first group of prompts (one prompt at batch 1), once,
    at most HF_HEADLINE_TOKENS a row, and the notes say so; ours time every prompt at every token asked."""
    from eaglelab.bench.setup import HF_HEADLINE_TOKENS

    out = tmp_path / "bench.json"
    asked = HF_HEADLINE_TOKENS + 8
    assert main(["bench", "--scale-model", "tiny", "--device", "cpu", "--max-new-tokens", str(asked), "--prompts", "2",
                 "--repeats", "1", "--questions", str(questions), "--json", str(out)]) == 0
    rep = json.loads(out.read_text())
    rows = {r["config"]: r for r in rep["rows"]}
    assert rows["hf"]["tokens"] == HF_HEADLINE_TOKENS and len(rows["hf"]["sweeps_tok_per_s"]) == 1
    assert rows["plain-eager"]["tokens"] == rows["spec-decode"]["tokens"] == 2 * asked
    note = next(n for n in rep["notes"] if n.startswith("HF generate"))
    assert f"one pass, {HF_HEADLINE_TOKENS} tokens per row" in note and f"ours over {asked}" in note


def test_named_configurations_without_hf_say_nothing_of_it():
    """The note on the HF peer only where it runs: --configs without hf leaves it out; the full sweep times HF at
    every token asked."""
    from eaglelab.bench.setup import CPU_DEFAULTS, capped_peer, peer_note, runs_hf
    from eaglelab.cli import build_parser

    parse = build_parser().parse_args
    assert not runs_hf(parse(["bench", "--configs", "plain-eager,spec-decode"]))
    assert runs_hf(parse(["bench", "--configs", "plain-eager, hf"])) and runs_hf(parse(["bench"]))
    assert peer_note(None, CPU_DEFAULTS, 32) == []
    assert peer_note(lambda: None, CPU_DEFAULTS, 32) == [
        "HF generate (a reference): the first group of prompts at each batch size, one pass, 32 tokens per row"]
    calls = []
    build = capped_peer(lambda: (lambda group, max_new: calls.append(max_new)), 16)
    generate = build()
    generate([[1]], 64)
    generate([[1]], 8)
    assert calls == [16, 8] and capped_peer(None, 16) is None
