"""Acceptance of a drafter at batch 1: mean accepted length, per-position acceptance, speed against
plain decoding in the same run, on MT-bench (first turns), HumanEval (a second held-out set) or the first prompts of a prompts file
(``--set file --file P``: e.g. held-out prompts of a training source, to see which data a drafter lacks).

    python benchmarks/drafter_acceptance.py --set mtbench --steps 3 --topk 1 --draft-tokens 4 --json OUT.json
    python benchmarks/drafter_acceptance.py --set humaneval --humaneval FILE.jsonl.gz ...

Each prompt runs greedy, speculative then plain, with EOS honoured; the outputs must be identical
(speculation is lossless) and the script says so. Per-position acceptance is conditional:
``rate_i = P(accepted length >= i + 2 | accepted length >= i + 1)`` over all cycles, i.e. the share of
cycles that got draft position i accepted among those that reached it (depth i of the tree).
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import sys
import time
from pathlib import Path

import torch

from eaglelab.bench.harness import mtbench_questions, tokenize_prompts
from eaglelab.session import add_engine_args, build_session


def questions(which: str, n: int, humaneval: str | None, mtbench: str | None,
              file: str | None = None) -> tuple[list[str], list[str] | None]:
    """(the prompts, their MT-bench categories or None)."""
    if which == "mtbench":
        asked = mtbench_questions(n, mtbench)
        return [t for t, _ in asked], [c for _, c in asked]
    if which == "file":  # a prompts file of `eaglelab prompts` / `eaglelab synthesize` (held-out prompts of a kind)
        from eaglelab.engine.training.prompt_corpus import read_corpus

        if not file:
            raise SystemExit("--set file needs --file PROMPTS.jsonl.gz")
        return [r["prompt"] for r in read_corpus(file)[:n]], None
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.engine.formats.assets import HUMANEVAL_PROBLEMS, asset_path

    path = Path(humaneval) if humaneval else asset_path(HUMANEVAL_PROBLEMS)
    try:
        with gzip.open(path, "rt") as f:
            probs = [json.loads(line)["prompt"] for line in f if line.strip()]
    except (OSError, EOFError, ValueError, KeyError, TypeError) as exc:
        raise EagleLabError(f"not a HumanEval problems file ({type(exc).__name__}: {exc})", file=path,
                            expected='gzip JSON lines with a "prompt" field') from None
    return ["Complete this Python function:\n\n" + p for p in probs[:n]], None


def questions_or_exit(*args) -> tuple[list[str], list[str] | None]:
    """:func:`questions`; a missing or unreadable prompts file is said (exit 1), not a traceback."""
    from eaglelab.engine.errors import EagleLabError

    try:
        return questions(*args)
    except EagleLabError as exc:
        raise SystemExit(f"error: {exc}") from None


def by_group(groups: list[str], lens_per_prompt: list[list[int]], depth: int) -> dict[str, dict]:
    """Mean accepted length and per-position acceptance of each group of prompts (e.g. MT-bench category)."""
    out: dict[str, dict] = {}
    for g in dict.fromkeys(groups):
        lens = [a for gg, ls in zip(groups, lens_per_prompt) if gg == g for a in ls]
        out[g] = {"prompts": groups.count(g), "cycles": len(lens), "mean_accept_len": sum(lens) / len(lens) if lens else None,
                  "per_position_acceptance": per_position(lens, depth)}
    return out


def draft_vocabulary(engine) -> torch.Tensor | None:
    """[V] bool on the CPU: the target tokens an EAGLE-3 drafter's head can propose (None: no such head)."""
    net = getattr(getattr(engine, "drafter", None), "net", None)
    return net.t2d.bool().cpu() if net is not None and hasattr(net, "t2d") else None


def share(pairs: list[tuple[int, int]]) -> float | None:
    """sum(hits) / sum(totals) of (hits, total) pairs; None when there is nothing to count."""
    total = sum(t for _, t in pairs)
    return sum(h for h, _ in pairs) / total if total else None


def per_position(lens: list[int], depth: int) -> list[float]:
    """Conditional acceptance per draft position from accepted lengths (bonus included)."""
    out = []
    for i in range(depth):
        reached = sum(1 for a in lens if a >= i + 1)
        out.append(sum(1 for a in lens if a >= i + 2) / reached if reached else 0.0)
    return out


def write_report(path: str | None, report: dict) -> None:
    """Write ``report`` as JSON to ``path`` (its folder made); nothing when ``path`` is None."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1) + "\n")


def timed(engine, prompt: list[int], max_new: int, device) -> tuple[object, float]:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    res = engine.generate([prompt], max_new)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return res, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--set", choices=("mtbench", "humaneval", "file"), default="mtbench")
    p.add_argument("--file", default=None, metavar="PROMPTS", help="with --set file: a prompts.jsonl(.gz) with a "
                   "\"prompt\" field per line (its first --prompts lines)")
    p.add_argument("--prompts", type=int, default=80)
    p.add_argument("--humaneval", default=None, metavar="FILE", help="HumanEval.jsonl.gz (default: the asset)")
    p.add_argument("--questions", default=None, metavar="FILE", help="an MT-bench question.jsonl (default: the asset)")
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--json", default=None, metavar="OUT")
    args = p.parse_args()
    texts, cats = questions_or_exit(args.set, args.prompts, args.humaneval, args.questions, args.file)  # before the model loads
    s = build_session(args, log=lambda m: print(m, file=sys.stderr))
    if not s.spec.enabled:
        raise SystemExit("needs a drafter (--draft)")
    device = s.target.device
    ids, how = tokenize_prompts(texts, s.target.tokenizer, s.target.config.vocab_size, args.max_prompt_tokens)
    spec_engine, plain_engine = s.engine(), s.plain_engine()
    timed(spec_engine, ids[0], 16, device), timed(plain_engine, ids[0], 16, device)  # warm-up, graph capture
    in_vocab = draft_vocabulary(spec_engine)  # [V] bool: target tokens the drafter can propose (None: no head)
    lens, spec_s, plain_s, tokens, same, per_prompt, covered = [], 0.0, 0.0, 0, 0, [], []
    for prompt in ids:
        r_spec, t_spec = timed(spec_engine, prompt, args.max_new_tokens, device)
        r_plain, t_plain = timed(plain_engine, prompt, args.max_new_tokens, device)
        per_prompt.append([a for cyc in r_spec.accept_lens for a in cyc])
        if in_vocab is not None:  # (tokens the draft vocabulary holds, tokens) of plain greedy's answer
            covered.append((sum(bool(in_vocab[t]) for t in r_plain.tokens[0]), len(r_plain.tokens[0])))
        lens += per_prompt[-1]
        spec_s, plain_s = spec_s + t_spec, plain_s + t_plain
        tokens += r_spec.generated_tokens
        same += r_spec.tokens == r_plain.tokens
    report = {
        "set": args.set, "prompts": len(ids), "prompt_tokens": how, "spec": s.spec.to_dict(), "spec_label": s.spec_label,
        "device": s.device_label, "dtype": s.dtype_name, "torch": torch.__version__, "python": platform.python_version(),
        "notes": list(s.notes),  # how the session chose (on a CPU: which side runs the few-row kernel, both timings)
        "max_new_tokens": args.max_new_tokens, "cycles": len(lens),
        "mean_accept_len": sum(lens) / len(lens) if lens else None,
        "per_position_acceptance": per_position(lens, s.spec.max_depth),
        "accept_len_histogram": {k: lens.count(k) for k in sorted(set(lens))},
        "spec_tok_s": tokens / spec_s, "plain_tok_s": tokens / plain_s, "speedup": plain_s / spec_s,
        "identical_outputs": f"{same}/{len(ids)}",
        "accept_len_per_prompt": [sum(ls) / len(ls) if ls else None for ls in per_prompt],
        "draft_vocab_coverage": share(covered),
    }
    if cats is not None:
        report["by_category"] = by_group(cats, per_prompt, s.spec.max_depth)
        for cat, r in report["by_category"].items():
            r["draft_vocab_coverage"] = share([c for g, c in zip(cats, covered) if g == cat])
    rates = " ".join(f"{r:.2f}" for r in report["per_position_acceptance"])
    print(f"{args.set} {len(ids)} prompts, {s.spec_label}, {s.device_label} {s.dtype_name}: mean accepted length "
          f"{report['mean_accept_len']:.3f} (bonus included, {len(lens)} cycles); per position {rates}; "
          f"spec {report['spec_tok_s']:.1f} tok/s vs plain {report['plain_tok_s']:.1f} tok/s = {report['speedup']:.2f}x; "
          f"identical outputs {report['identical_outputs']}")
    if report["draft_vocab_coverage"] is not None:
        print(f"  the draft vocabulary holds {report['draft_vocab_coverage']:.2%} of plain greedy's tokens")
    for cat, r in report.get("by_category", {}).items():
        cov = f"  draft vocabulary {r['draft_vocab_coverage']:.1%}" if r.get("draft_vocab_coverage") is not None else ""
        print(f"  {cat:<12} {r['prompts']:>3} prompts  mean accepted length {r['mean_accept_len']:.3f}  per position "
              + " ".join(f"{x:.2f}" for x in r["per_position_acceptance"]) + cov)
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
