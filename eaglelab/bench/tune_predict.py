"""What ``eaglelab tune`` predicts, as plain data: the acceptance table, the phase costs and every grid point
ranked (:func:`predict`), from a live measuring pass or from a record one wrote (:func:`from_record`)."""

from __future__ import annotations

from typing import Any

from eaglelab.flags import int_list
from eaglelab.probes.path_replay import PathReplay, path_replay
from eaglelab.probes.tuning import AcceptanceTable, AcceptLen, expected_accept_len, table_from_steps

DEFAULT_DRAFT_TOKENS = "2,3,4,5,6,7,8,10,12,16"  # N tried for trees from a record: the CUDA grid's


def costs_from_report(d: dict[str, Any]):
    """A batch's plain-decoding costs from the report's ``costs`` (what plain decoding's prediction needs)."""
    from eaglelab.probes.tuning import PhaseCosts

    return PhaseCosts(batch=d["batch"], decode_ms=d["decode_ms"], verify_ms={}, draft_ms={}, extend_ms={},
                      accept_ms={}, prefill_ms=d["prefill_ms"], begin_ms=d["begin_ms"])


def from_record(path: str, steps_text: str | None = None, topk_text: str | None = None,
                draft_tokens_text: str = DEFAULT_DRAFT_TOKENS, top: int = 8) -> dict[str, Any]:
    """The report of a record a tuning pass wrote (``eaglelab tune --record``), running nothing: the grid from the
    flags' texts (None: what the record's wide tree covers), restricted to what its costs measured."""
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.probes.events import PhaseCost, RunStarted, Step
    from eaglelab.probes.record import read_record

    result = read_record(path)
    steps = [e for e in result.events if isinstance(e, Step)]
    costs = [e for e in result.events if isinstance(e, PhaseCost)]
    if not any(s.kind == "spec" and s.accepted_ranks for s in steps):
        raise EagleLabError("no speculative cycle with accepted ranks in this record", file=path,
                            expected="a record of a wide-tree run by this eaglelab (eaglelab tune --record FILE)")
    table = table_from_steps(steps).table()
    started = next((e for e in result.events if isinstance(e, RunStarted)), None)
    wide = started.spec if started else {}
    depth, width = int(wide.get("num_steps", table.max_depth)), int(wide.get("topk", table.max_rank))
    grid_steps = int_list(steps_text, "--steps") if steps_text else tuple(range(1, depth + 1))
    grid_topk = int_list(topk_text, "--topk") if topk_text else tuple(k for k in (1, 2, 4, 8) if k <= width)
    grid_n = int_list(draft_tokens_text, "--draft-tokens", least=2)
    cycles = sorted({(e.steps, e.topk, e.tokens) for e in costs if e.phase == "cycle"})
    if cycles:  # a tune in run's regime timed whole cycles of its candidates: those are what it can rank
        grid_steps, grid_topk = tuple(sorted({c[0] for c in cycles})), tuple(sorted({c[1] for c in cycles}))
        grid_n = tuple(sorted({c[2] for c in cycles}))
    elif costs:
        grid_steps = tuple(sorted({e.steps for e in costs if e.phase == "draft"} & set(grid_steps)))
        grid_topk = tuple(sorted({e.topk for e in costs if e.phase == "draft"} & set(grid_topk)))
        grid_n = tuple(sorted({e.tokens for e in costs if e.phase == "verify"} & set(grid_n)))
    wide_tree = (depth, width, int(wide.get("num_draft_tokens") or depth + 1)) if wide else None
    report = predict(steps, costs, grid_steps, grid_topk, grid_n, top, configs=cycles or None, wide=wide_tree)
    report.update(model=started.model if started else "?", record=path, confirmation=[],
                  hardware={"device": started.device if started else "?", "dtype": started.dtype if started else "?"},
                  notes=[f"from the record {path}: nothing was run"]
                  + ([] if costs else ["no phase costs in this record (only `eaglelab tune --record` writes them): "
                                       "ranked by expected accepted length alone"]))
    return report


def accept_model(table: AcceptanceTable, replay: PathReplay | None) -> AcceptLen:
    """E[a] per (steps, topk, N): the wide run's paths replayed when they can be (the drafter's per-cycle
    confidence kept), else the acceptance table's fixed-shape tree."""
    if replay is not None:
        return replay.accept_len
    return lambda s, k, n: expected_accept_len(table, s, k, n)


# ---- the model's side -------------------------------------------------------------------------
def predict(steps: list, costs: list, grid_steps: tuple[int, ...], grid_topk: tuple[int, ...], grid_n: tuple[int, ...],
            top: int, configs: list[tuple[int, int, int]] | None = None,
            wide: tuple[int, int, int] | None = None) -> dict[str, Any]:
    """The acceptance table, costs and ranked predictions, as plain data: of ``configs`` (steps, topk, N) when given,
    else of the grid's; each batch size ranks those its costs cover. E[a] is replayed from the accepted paths of
    the ``wide`` tree (steps, topk, N) that ``steps`` ran (:func:`accept_model`)."""
    from dataclasses import asdict

    from eaglelab.probes import tuning as T

    counts = T.table_from_steps(steps)
    table = counts.table()
    tried = configs if configs is not None else T.grid_configs(grid_steps, grid_topk, grid_n)
    configs = [c for c in tried if c[0] <= max(table.max_depth, 1)]
    replay = path_replay(steps, *wide) if wide is not None else None
    if replay is not None:
        configs = [c for c in configs if c[0] <= replay.steps and c[1] <= replay.topk]
    accept = accept_model(table, replay)
    by_batch = T.costs_from_events(costs)
    preds = {str(b): [dict(asdict(p), cycle_ms=p.cycle_ms, tok_per_s=p.tok_per_s, speedup=p.speedup,
                           break_even_accept_len=p.break_even_accept_len, plain_tok_per_s=p.plain_tok_per_s)
                      for p in T.rank_configs(table, c, configs, accept)]
             for b, c in by_batch.items()}
    by_len = [dict(steps=c[0], topk=c[1], draft_tokens=c[2], accept_len=a) for c, a in T.rank_by_accept_len(table, configs, accept)]
    return {
        "schema": "eaglelab.tune/1",
        "acceptance": {"rates": [list(r) for r in table.rates], "offered": list(table.offered),
                       "row_cycles": counts.row_cycles, "wide_mean_accept_len": counts.mean_accept_len,
                       "model": "replayed paths of the wide tree" if replay is not None else "acceptance table"},
        "costs": {str(b): {"batch": b, "decode_ms": c.decode_ms, "prefill_ms": c.prefill_ms, "begin_ms": c.begin_ms,
                           "verify_ms": {str(n): v for n, v in sorted(c.verify_ms.items())},
                           "draft_ms": {f"{s},{k}": v for (s, k), v in sorted(c.draft_ms.items())},
                           "extend_ms": {f"{s},{k}": v for (s, k), v in sorted(c.extend_ms.items())},
                           "accept_ms": {f"{s},{k}": v for (s, k), v in sorted(c.accept_ms.items())},
                           "cycle_ms": {f"{s},{k},{n}": v for (s, k, n), v in sorted(c.cycle_ms.items())}}
                  for b, c in by_batch.items()},
        "predictions": preds,
        "by_accept_len": by_len,
        "shown": top,
    }


def record_replay(record: str):
    """The :class:`PathReplay` of a tune's ``--record`` (its wide tree's accepted paths). A file that is not such a
    record is an :class:`EagleLabError` naming it."""
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.probes.events import RunStarted, Step
    from eaglelab.probes.record import read_record

    events = read_record(record).events
    started = next((e for e in events if isinstance(e, RunStarted)), None)
    wide = started.spec if started is not None else {}
    if not all(isinstance(wide.get(k), int) for k in ("num_steps", "topk", "num_draft_tokens")):
        raise EagleLabError("no wide tree in this record", file=record, field="RunStarted.spec",
                            found=None if started is None else {k: wide.get(k) for k in ("num_steps", "topk",
                                                                                          "num_draft_tokens")},
                            expected="the record of a tuning pass (eaglelab tune --record FILE)")
    replay = path_replay([e for e in events if isinstance(e, Step)], wide["num_steps"], wide["topk"],
                         wide["num_draft_tokens"])
    if replay is None:
        raise EagleLabError("the wide tree's accepted paths cannot be replayed", file=record,
                            expected="a full wide tree whose cycles carry accepted positions (eaglelab tune --record)")
    return replay


def replay_against_confirmation(record: str, report: str) -> list[dict[str, Any]]:
    """Per speculative row a tune confirmed (``report``: the JSON ``eaglelab tune --json`` wrote; ``record``: its
    ``--record``): E[a] as the tune predicted it, replayed from the record's wide tree now, and measured. A file
    that is not what a tune wrote is an :class:`EagleLabError` naming it."""
    from eaglelab.engine.errors import EagleLabError, read_json_object

    replay = record_replay(record)
    rows = read_json_object(report).get("confirmation")
    keys = ("batch", "steps", "topk", "draft_tokens", "predicted_accept_len", "measured_accept_len")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and all(k in r for k in keys) for r in rows):
        raise EagleLabError("no confirmation rows in this report", file=report, field="confirmation",
                            expected="rows of " + ", ".join(keys), hint="pass the JSON of `eaglelab tune --json FILE`")
    return [dict(batch=r["batch"], config=(r["steps"], r["topk"], r["draft_tokens"]), before=r["predicted_accept_len"],
                 after=replay.accept_len(r["steps"], r["topk"], r["draft_tokens"]), measured=r["measured_accept_len"])
            for r in rows if r["steps"] and not r.get("lookup_tokens")]  # a branch is measured, never predicted


def print_replay_table(argv: list[str]) -> int:
    """``python -m eaglelab.bench.tune_predict RECORD.jsonl REPORT.json``: :func:`replay_against_confirmation` as a
    Markdown table, each model's error against the measured E[a]."""
    from eaglelab.engine.errors import EagleLabError

    if len(argv) != 2:
        raise EagleLabError("needs two files", field="arguments", found=" ".join(argv) or "none",
                            expected="RECORD.jsonl (eaglelab tune --record) REPORT.json (eaglelab tune --json)")
    rows = replay_against_confirmation(*argv)
    print("| batch | steps/topk/N | measured E[a] | table model | error | replayed paths | error |\n|---|---|---|---|---|---|---|")
    for r in rows:
        m = r["measured"]
        print(f"| {r['batch']} | {'/'.join(map(str, r['config']))} | {m:.2f} | {r['before']:.2f} | "
              f"{100 * (r['before'] / m - 1):+.1f}% | {r['after']:.2f} | {100 * (r['after'] / m - 1):+.1f}% |")
    return 0


if __name__ == "__main__":
    import sys

    from eaglelab.errors import run_guarded

    sys.exit(run_guarded(print_replay_table, sys.argv[1:], sys.argv))
