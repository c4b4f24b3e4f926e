"""``eaglelab tune``'s predicted vs measured figures of every confirmed row, as the tune printed them ("printed") and
recomputed from its record: E[a] replayed from the wide tree's accepted paths with the wide tree's own ranks
("replay, wide q": the rule before the narrower tree's rank cap) and with today's probes/path_replay.py ("new");
tok/s end to end from the costs the tune measured (its ``h200_tune.json``) with that E[a], and with the measured
E[a] ("cost side alone": what is left of the error once E[a] is exact). Nothing is run on a GPU: every new tok/s
is a recomputation, not a measurement.

    python benchmarks/tune_prediction_errors.py benchmarks/results/h200_2026-12-03b/C benchmarks/results/h200_2026-12-03c/C

Prints one Markdown table per result folder (each holds ``h200_tune.jsonl``, the record, and ``h200_tune.json``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from eaglelab.engine.errors import EagleLabError
from eaglelab.bench.tune_predict import record_replay
from eaglelab.probes.tuning import Prediction


def _tok_per_s(costs: dict, row: dict, accept_len: float, new_tokens: int) -> float:
    """End to end as ``eaglelab tune`` predicts it: prefill and the drafter's begin, then (new_tokens - 1) / E[a]
    cycles of the tree's measured cycle ms."""
    c = costs[str(row["batch"])]
    key = f"{row['steps']},{row['topk']},{row['draft_tokens']}"
    pred = Prediction(row["steps"], row["topk"], row["draft_tokens"], row["batch"], accept_len, c["decode_ms"],
                      0.0, 0.0, 0.0, 0.0, whole_cycle_ms=c["cycle_ms"][key])
    return pred.end_to_end_tok_per_s(new_tokens, c["prefill_ms"] + c["begin_ms"])


def rows(folder: Path) -> list[dict]:
    """Per confirmed row: E[a] and tok/s predicted (old, new) and measured."""
    for name in ("h200_tune.json", "h200_tune.jsonl"):
        if not (folder / name).is_file():
            raise EagleLabError("not a recorded tune's folder", file=str(folder / name), found="no such file",
                                expected="the folder of `eaglelab tune --json h200_tune.json --record h200_tune.jsonl`")
    report = json.loads((folder / "h200_tune.json").read_text(encoding="utf-8"))
    replay = record_replay(str(folder / "h200_tune.jsonl"))
    n = report["settings"]["new_tokens"]
    out = []
    for r in report["confirmation"]:
        got = dict(batch=r["batch"], config=f"{r['steps']}/{r['topk']}/{r['draft_tokens']}" if r["steps"] else "plain",
                   a_printed=r["predicted_accept_len"], a_wide_q=None, a_new=None, a_measured=r["measured_accept_len"],
                   tps_printed=r["predicted_tok_per_s"], tps_wide_q=r["predicted_tok_per_s"],
                   tps_new=r["predicted_tok_per_s"], tps_cost_side=r["predicted_tok_per_s"],
                   tps_measured=r["measured_tok_per_s"])  # plain decoding: no E[a], nothing recomputed
        if r["steps"]:
            c = (r["steps"], r["topk"], r["draft_tokens"])
            # the recomputation reproduces what the tune printed when fed the E[a] it printed
            again = _tok_per_s(report["costs"], r, r["predicted_accept_len"], n)
            assert abs(again / r["predicted_tok_per_s"] - 1) < 1e-9, (folder, r, again)
            got.update(a_wide_q=replay.accept_len(*c, rank_cap=False), a_new=replay.accept_len(*c))
            got.update(tps_wide_q=_tok_per_s(report["costs"], r, got["a_wide_q"], n),
                       tps_new=_tok_per_s(report["costs"], r, got["a_new"], n),
                       tps_cost_side=_tok_per_s(report["costs"], r, r["measured_accept_len"], n))
        out.append(got)
    return out


def _err(pred: float | None, measured: float | None) -> str:
    return f"{100 * (pred / measured - 1):+.1f}%" if pred is not None and measured else "-"


def table(folder: Path) -> str:
    """Two Markdown tables: E[a], then tok/s; each prediction with its error against the measured figure."""
    got = rows(folder)
    ea = ["| batch | steps/topk/N | measured E[a] | printed | error | replay, wide q | error | new | error |",
          "|" + "---|" * 9]
    for r in got:
        if r["a_measured"] is None:
            continue
        cells = [f"{r[k]:.3f} | {_err(r[k], r['a_measured'])}" for k in ("a_printed", "a_wide_q", "a_new")]
        ea.append(f"| {r['batch']} | {r['config']} | {r['a_measured']:.3f} | " + " | ".join(cells) + " |")
    tps = ["| batch | steps/topk/N | measured tok/s | printed | error | replay, wide q | error | new | error "
           "| cost side alone | error |", "|" + "---|" * 11]
    for r in got:
        cells = [f"{r[k]:,.1f} | {_err(r[k], r['tps_measured'])}"
                 for k in ("tps_printed", "tps_wide_q", "tps_new", "tps_cost_side")]
        tps.append(f"| {r['batch']} | {r['config']} | {r['tps_measured']:,.1f} | " + " | ".join(cells) + " |")
    return "\n".join(ea) + "\n\n" + "\n".join(tps)


def main(argv: list[str]) -> int:
    """Print the tables of every folder named; 2 with a clear message for no folder or one without a tune."""
    if not argv:
        print("usage: python benchmarks/tune_prediction_errors.py RESULT_FOLDER...", file=sys.stderr)
        return 2
    try:
        for arg in argv:
            print(f"{arg}\n\n{table(Path(arg))}\n")
    except EagleLabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
