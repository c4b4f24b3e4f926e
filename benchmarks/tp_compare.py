"""Put ``eaglelab bench --tp 1`` and ``--tp N`` reports of one shape side by side (README table rows).

    python benchmarks/tp_compare.py --tp1 r/llama8b_tp1.json --tpn r/llama8b_tp2.json [--markdown]

Prints, per configuration and batch size: tok/s at TP=1 and TP=N (same machine, same run of the
script), their ratio, speculative over plain at TP=N (against the plain configuration with the same
graphs / compile setting), and the all-reduce share of a decode and a
verify step (graph replays where they ran) from the TP=N report. Reads the JSON only: no torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


# the plain configuration a speculative one is read against (same graphs / compile setting)
PLAIN_OF = {"spec-compile": "plain-compile", "spec-decode-graphs": "plain-graphs", "spec-prefill-graphs": "plain-graphs",
            "spec-decode": "plain-eager", "spec-prefill": "plain-eager"}


def load(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        sys.exit(f"error: {path}: cannot read a bench report ({exc}); run `eaglelab bench --json {path}` first")


def speeds(report: dict) -> dict[tuple[str, int], float]:
    return {(r["config"], r["batch"]): r["tok_per_s"] for r in report["rows"] if r.get("tok_per_s")}


def shares(report: dict) -> dict[tuple[int, str], float]:
    """(batch, step) -> the all-reduce share, from graph replays when measured, else eager."""
    out: dict[tuple[int, str], float] = {}
    for r in sorted(report.get("tp", {}).get("share", []), key=lambda r: r["graphs"]):
        out[(r["batch"], r["step"])] = r["share"]  # graphs sort last: they win
    return out


def rows(one: dict, many: dict) -> list[list[str]]:
    s1, sn, sh = speeds(one), speeds(many), shares(many)
    out = []
    for (cfg, b), tn in sorted(sn.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        t1 = s1.get((cfg, b))
        plain = sn.get((PLAIN_OF.get(cfg, "plain-graphs"), b)) or sn.get(("plain-graphs", b)) or sn.get(("plain-eager", b))
        spec_over_plain = f"{tn / plain:.2f}x" if cfg.startswith("spec") and plain else "-"
        share = sh.get((b, "verify" if cfg.startswith("spec") else "decode"))
        out.append([cfg, str(b), f"{t1:.1f}" if t1 else "-", f"{tn:.1f}", f"{tn / t1:.2f}x" if t1 else "-",
                    spec_over_plain, f"{share:.0%}" if share is not None else "-"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tp1", required=True, help="the --tp 1 report (JSON)")
    p.add_argument("--tpn", required=True, help="the --tp N report (JSON)")
    p.add_argument("--markdown", action="store_true", help="a Markdown table (for the README)")
    a = p.parse_args(argv)
    one, many = load(a.tp1), load(a.tpn)
    n = many.get("tp", {}).get("world_size", "N")
    head = ["config", "batch", "TP=1 tok/s", f"TP={n} tok/s", f"TP={n} / TP=1", f"spec / plain (TP={n})",
            "all-reduce share of the step"]
    hw = many["hardware"]
    print(f"{many['settings']['model']}, {hw.get('gpu') or hw.get('cpu')}, {hw['dtype']}, torch {hw['torch']}")
    table = rows(one, many)
    if a.markdown:  # the README's columns: the shape first
        shape = many["settings"].get("scale_model") or many["settings"]["model"]
        print("| " + " | ".join(["shape", *head]) + " |")
        print("|" + "---|" * (len(head) + 1))
        for r in table:
            print("| " + " | ".join([shape, *r]) + " |")
    else:
        widths = [max(len(x) for x in col) for col in zip(head, *table)]
        for r in [head, *table]:
            print("  ".join(x.rjust(w) if i else x.ljust(w) for i, (x, w) in enumerate(zip(r, widths))))
    for label, rep in (("TP=1", one), (f"TP={n}", many)):
        for line in fallbacks(rep):
            print(f"{label} not compiled: {line}")
    return 0


def fallbacks(report: dict) -> list[str]:
    """Each *-compile config's phase compiles that fell back to eager (they ran eager inside their graphs)."""
    out: list[str] = []
    for r in report["rows"]:
        for why in r.get("compile_fallbacks", ()):
            line = f"{r['config']}: {why}"
            if line not in out:
                out.append(line)
    return out


if __name__ == "__main__":
    sys.exit(main())
