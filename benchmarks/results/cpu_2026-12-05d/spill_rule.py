"""Where should the lookup branch spill into the tree? Replays the engine at 5/4/24 + 16 with --lookup-spill on the
80 MT-bench first turns (CPU, float32, greedy, EOS honoured, 128 tokens), the branch kept only where the lookup's
matched tail has at least T tokens (the engine: T = 1, spilling only where nothing matched), for each T given.

    OMP_NUM_THREADS=1 python benchmarks/results/cpu_2026-12-05d/spill_rule.py 2 3 1 > log.txt
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # benchmarks/: drafter_acceptance's prompt helpers
import drafter_acceptance as da  # noqa: E402

from eaglelab.engine.runtime import drafters, lookup  # noqa: E402
from eaglelab.session import add_engine_args, build_session  # noqa: E402

thresholds = [int(t) for t in sys.argv[1:]] or [1]
p = argparse.ArgumentParser()
add_engine_args(p)
args = p.parse_args(["--device", "cpu", "--dtype", "float32", "--steps", "5", "--topk", "4", "--draft-tokens", "24",
                     "--lookup-tokens", "16", "--lookup-spill", "--max-new-tokens", "128"])
texts, cats = da.questions_or_exit("mtbench", 80, None, None, None)
s = build_session(args, log=lambda m: None)
ids, _ = da.tokenize_prompts(texts, s.target.tokenizer, s.target.config.vocab_size, 1024)
out = {}
for T in thresholds:
    def branch_or_tree(grafted, wide, matched, T=T):  # a tail shorter than T counts as no match
        return lookup.branch_or_tree(grafted, wide, torch.where(matched >= T, matched, torch.zeros_like(matched)))

    drafters.branch_or_tree = branch_or_tree
    engine, t0, lens, per = s.engine(), time.time(), [], []
    for prompt in ids:
        r = engine.generate([prompt], 128)
        per.append([a for cyc in r.accept_lens for a in cyc])
        lens += per[-1]
    by_cat = {}
    for c in dict.fromkeys(cats):
        got = [a for cc, ls in zip(cats, per) if cc == c for a in ls]
        by_cat[c] = round(sum(got) / len(got), 3)
    out[T] = dict(mean=sum(lens) / len(lens), cycles=len(lens), by_cat=by_cat, secs=time.time() - t0)
    print(T, out[T], flush=True)
json.dump({str(k): v for k, v in out.items()}, open(HERE / "spill_rule.json", "w"), indent=1)
