"""What a prompt-lookup branch beside the tree would add, replayed offline from the engine's own cycles.

Runs the drafter on MT-bench first turns (greedy, EOS honoured) and keeps each prompt, its output and the accepted
length of every cycle (``--rows OUT.json``; or reads such a file with ``--from``). Then, for each lookup length K,
walks each output again: at a cycle starting at position c the branch proposes the K tokens that followed the
context's latest earlier 4..1-gram (the engine's own lookup, ``engine/runtime/lookup.py``), the cycle keeps
the longer of the drafter's path and the branch's matched prefix (plus the bonus), and the next cycle starts after
it. Where the replay starts a cycle the engine never started, the drafter's length there is taken as what is left
of the engine's cycle covering c, or the next cycle's length, whichever is larger (an estimate, said as such).

Variants of the branch the engine does not build, replayed the same way: ``--max-ngram N`` looks up tails of up to N
tokens (the engine: 4); ``--matches M`` proposes the continuations of the M best distinct matches (longest, then
latest), each K // M tokens long, merged into a token tree (shared prefixes once), and the cycle keeps the tree's
longest path that matches (M = 1 is the engine's chain).

    python benchmarks/lookup_replay.py --device cpu --steps 5 --topk 4 --draft-tokens 24 --rows rows.json --k 8,16
    python benchmarks/lookup_replay.py --from rows.json --k 4,8,16,32
    python benchmarks/lookup_replay.py --from rows.json --k 16 --max-ngram 8 --matches 2
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict


def lookup(context: list[int], k: int) -> list[int]:
    """The K tokens the engine's branch proposes after ``context`` (:func:`~eaglelab.engine.runtime.lookup.lookup_chain`,
    on the host)."""
    import torch

    from eaglelab.engine.runtime.lookup import lookup_chain

    return lookup_chain(torch.tensor([context]), torch.tensor([len(context)]), k)[0].tolist()


def continuations(context: list[int], k: int, max_ngram: int, matches: int) -> list[list[int]]:
    """The K tokens that followed each of the ``matches`` best earlier matches of the context's tail (tails of
    ``max_ngram`` down to 1 tokens; the longest, then the latest; distinct continuations only), each wrapping around
    a repeat that runs into the context's end as the engine's chain does. No match: the last token repeated."""
    last, found = len(context) - 1, []
    for end in range(last):
        n = 0
        while n < max_ngram and end - n >= 0 and context[end - n] == context[last - n]:
            n += 1
        if n:
            found.append((n, end))
    out: list[list[int]] = []
    for _, end in sorted(found, reverse=True):
        period = last - end
        c = [context[end + 1 + s % period] for s in range(k)]
        if c not in out:
            out.append(c)
        if len(out) == matches:
            break
    return out or [[context[-1]] * k]


def tree_of(paths: list[list[int]], budget: int) -> set[tuple[int, ...]]:
    """``paths`` merged into a token tree (its nodes as the prefixes they end), in order, up to ``budget`` nodes."""
    nodes: set[tuple[int, ...]] = set()
    for path in paths:
        for d in range(1, len(path) + 1):
            if len(nodes) == budget:
                return nodes
            nodes.add(tuple(path[:d]))
    return nodes


def matched(proposal: list[int] | set[tuple[int, ...]], future: list[int]) -> int:
    """How many of ``future``'s tokens the proposal (a chain, or a tree as :func:`tree_of` gives) holds in a row."""
    nodes = proposal if isinstance(proposal, set) else tree_of([proposal], len(proposal))
    n = 0
    while n < len(future) and tuple(future[: n + 1]) in nodes:
        n += 1
    return n


def replay(row: dict, k: int, max_ngram: int = 4, matches: int = 1) -> int:
    """Cycles the output takes with a branch of ``k`` beside the drafter (the engine's cycles when k is 0); with the
    engine's lookup (``max_ngram`` 4, one match) its own ``lookup_chain``, else :func:`continuations` in a tree."""
    prompt, out, accepted = row["prompt"], row["out"], row["acc"]
    starts, c = [], 1  # the prefill emits out[0]; the first cycle starts after it
    for a in accepted:
        starts.append((c, a))
        c += a
    exact = dict(starts)

    def drafter_at(pos: int) -> int:
        if pos in exact:
            return exact[pos]
        left = max((c0 + a - pos for c0, a in starts if c0 <= pos < c0 + a), default=0)
        later = next((a for c0, a in starts if c0 > pos), 1)
        return max(left, later)

    if k == 0:
        return len(accepted)
    cycles, c = 0, 1
    while c < len(out):
        context = prompt + out[:c]
        if (max_ngram, matches) == (4, 1):
            branch = matched(lookup(context, k), out[c:]) + 1
        else:
            branch = matched(tree_of(continuations(context, k // matches, max_ngram, matches), k), out[c:]) + 1
        c += max(drafter_at(c), branch)
        cycles += 1
    return cycles


def record_rows(args: argparse.Namespace) -> list[dict]:
    from eaglelab.bench.harness import mtbench_questions, tokenize_prompts
    from eaglelab.session import build_session

    asked = mtbench_questions(args.prompts, None)
    s = build_session(args, log=lambda m: None)
    ids, _ = tokenize_prompts([t for t, _ in asked], s.target.tokenizer, s.target.config.vocab_size, 1024)
    engine, rows = s.engine(), []
    for i, (prompt, (_, category)) in enumerate(zip(ids, asked)):
        r = engine.generate([prompt], args.max_new_tokens)
        rows.append({"category": category, "prompt": prompt, "out": r.tokens[0],
                     "acc": [a for cycle in r.accept_lens for a in cycle]})
        print(f"  {i + 1}/{len(ids)} {category}", file=sys.stderr, flush=True)
    print(f"recorded with {s.spec_label}, {s.device_label} {s.dtype_name}")
    return rows


def main() -> int:
    from eaglelab.session import add_engine_args

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--prompts", type=int, default=80)
    p.add_argument("--rows", default=None, metavar="OUT", help="keep the recorded prompts, outputs and cycles here")
    p.add_argument("--from", dest="source", default=None, metavar="ROWS", help="replay a --rows file, run nothing")
    p.add_argument("--k", default="8,16", help="lookup lengths to replay (comma-separated)")
    p.add_argument("--max-ngram", type=int, default=4, help="the longest tail looked up (the engine: 4)")
    p.add_argument("--matches", type=int, default=1,
                   help="continuations of this many matches, K // M each, merged into a tree (the engine: 1)")
    args = p.parse_args()
    if args.source:
        rows = json.loads(open(args.source).read())
    else:
        rows = record_rows(args)
        if args.rows:
            with open(args.rows, "w") as f:
                json.dump(rows, f)
    ks = [int(k) for k in args.k.split(",")]
    tokens, cycles = defaultdict(int), defaultdict(lambda: defaultdict(int))
    for row in rows:
        for group in (row["category"], "all"):
            tokens[group] += len(row["out"]) - 1
            for k in [0, *ks]:
                cycles[group][k] += replay(row, k, args.max_ngram, args.matches)
    variant = "" if (args.max_ngram, args.matches) == (4, 1) else f" (tails up to {args.max_ngram} tokens" + (
        f"; {args.matches} matches, K // {args.matches} tokens each, merged in a tree)" if args.matches > 1 else ")")
    print(f"tokens a cycle: the drafter alone (the engine's cycles), then beside a lookup branch of K{variant} "
          "(replayed)")
    print(f"{'prompts':<12} {'drafter':>8} " + " ".join(f"{'K=' + str(k):>8}" for k in ks))
    for group in [g for g in tokens if g != "all"] + ["all"]:
        print(f"{group:<12} {tokens[group] / cycles[group][0]:>8.2f} "
              + " ".join(f"{tokens[group] / cycles[group][k]:>8.2f}" for k in ks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
