"""Two more lookup sources replayed beside the shipped tree (5/4/24) and its context lookup of 16, offline, on the
engine's own cycles (``../cpu_2026-12-04b/replay_rows_5-4-24.json``, the walk of ``benchmarks/lookup_replay.py``):

* ``store``: an n-gram store of the target's own text (2..4-gram -> most frequent next token, a greedy walk of K
  tokens), proposed where the context has no match (``fill``) or a longer one (``longer``); the store either learns
  each prompt's answer after it is served (``online``, as SGLang's n-gram cache does across requests) or holds a
  corpus of the target's answers to training prompts (``corpus:DIR``, an ``eaglelab distill`` output);
* ``extend``: a second lookup chain hung off the drafter's depth-5 path, from the context's match of the tail that
  path ends (credited only where the engine's cycle accepted all 5 drafted tokens: an upper bound).

    python lookup_variants2.py store online fill
    python lookup_variants2.py store corpus:/tmp/store/distill fill
    python lookup_variants2.py extend
"""

from __future__ import annotations

import glob
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import lookup_replay as lr  # noqa: E402

from eaglelab.engine.runtime.lookup import lookup_chain  # noqa: E402

ROWS = Path(__file__).resolve().parents[1] / "cpu_2026-12-04b" / "replay_rows_5-4-24.json"
DEPTH, K = 5, 16


class Store:
    """n-grams (``min_n``..``max_n`` tokens) -> counts of the token that followed."""

    def __init__(self, max_n: int = 4, min_n: int = 2) -> None:
        self.max_n, self.min_n = max_n, min_n
        self.next: dict[tuple, Counter] = defaultdict(Counter)

    def add(self, seq: list[int]) -> None:
        for e in range(len(seq) - 1):
            for n in range(self.min_n, min(self.max_n, e + 1) + 1):
                self.next[tuple(seq[e - n + 1:e + 1])][seq[e + 1]] += 1

    def propose(self, context: list[int], k: int) -> tuple[int, list[int]]:
        """(the first step's matched n, 0: none; up to k tokens of the back-off greedy walk)."""
        ctx, out, first = list(context), [], 0
        for i in range(k):
            for n in range(self.max_n, self.min_n - 1, -1):
                c = self.next.get(tuple(ctx[-n:]))
                if c:
                    first = n if i == 0 else first
                    tok = c.most_common(1)[0][0]
                    break
            else:
                break
            out.append(tok)
            ctx.append(tok)
        return first, out


def context_lookup(context: list[int], k: int) -> tuple[int, list[int]]:
    chain, m = lookup_chain(torch.tensor([context]), torch.tensor([len(context)]), k, with_match=True)
    return int(m[0]), chain[0].tolist()


def drafter_at_fn(row: dict):
    starts, c = [], 1
    for a in row["acc"]:
        starts.append((c, a))
        c += a
    exact = dict(starts)

    def at(pos: int) -> int:  # as lookup_replay.replay estimates a cycle the engine never started
        if pos in exact:
            return exact[pos]
        left = max((c0 + a - pos for c0, a in starts if c0 <= pos < c0 + a), default=0)
        return max(left, next((a for c0, a in starts if c0 > pos), 1))
    return at


def cycles(row: dict, store: Store | None, policy: str, extend: int) -> int:
    prompt, out, at = row["prompt"], row["out"], drafter_at_fn(row)
    n, c = 0, 1
    while c < len(out):
        context = prompt + out[:c]
        m, chain = context_lookup(context, K)
        if store is not None:
            s, proposal = store.propose(context, K)
            if (policy == "fill" and m == 0 and s > 0) or (policy == "longer" and s > m):
                chain = proposal
        d = at(c)
        best = max(d, lr.matched(chain, out[c:]) + 1)
        if extend and d >= DEPTH + 1 and c + DEPTH < len(out):
            m2, tail = context_lookup(context + out[c:c + DEPTH], extend)
            if m2:
                best = max(best, DEPTH + lr.matched(tail, out[c + DEPTH:]) + 1)
        c += best
        n += 1
    return n


def table(rows: list[dict], label: str, **kw) -> None:
    tokens, cyc = defaultdict(int), defaultdict(int)
    online = kw.pop("online", None)
    for row in rows:
        got = cycles(row, **kw)
        for g in (row["category"], "all"):
            tokens[g] += len(row["out"]) - 1
            cyc[g] += got
        if online is not None:
            online.add(row["prompt"] + row["out"])
    print(f"{label:<34} " + " ".join(f"{g} {tokens[g] / cyc[g]:.3f}" for g in tokens))


def main() -> None:
    rows = json.loads(ROWS.read_text())
    what = sys.argv[1]
    table(rows, "tree + context lookup 16", store=None, policy="", extend=0)
    if what == "store":
        source, policy = sys.argv[2], sys.argv[3]
        store = Store()
        if source.startswith("corpus:"):
            from safetensors.torch import load_file

            n = 0
            for f in sorted(glob.glob(source[7:] + "/shards/*.safetensors")):
                d = load_file(f)
                for i in range(len(d["offsets"]) - 1):
                    seq = d["tokens"][d["offsets"][i]:d["offsets"][i + 1]].long().tolist()
                    store.add(seq)
                    n += len(seq)
            print(f"store: {n} tokens (training prompts and the target's answers to them), {len(store.next)} n-grams")
            table(rows, f"+ store ({policy})", store=store, policy=policy, extend=0)
        else:
            table(rows, f"+ online store ({policy})", store=store, policy=policy, extend=0, online=store)
    else:
        for ext in (8, 16):
            table(rows, f"+ a chain of {ext} off depth {DEPTH}", store=None, policy="", extend=ext)


if __name__ == "__main__":
    main()
