"""Where the target's next token ranks in the drafter's first draft step, at the start of every cycle the engine ran
(``../cpu_2026-12-04b/replay_rows_5-4-24.json``: 80 MT-bench first turns, 5/4/24, float32): the drafter run
teacher-forced over each prompt and its greedy answer (the training's step 0 at the anchor before each cycle's
first drafted token), its logits over the draft vocabulary ranked. Rank 0 is its top choice; -1 a token outside the
draft vocabulary. A root with more than 4 children could catch ranks 4..7.

    python first_rank.py
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from eaglelab.engine.training.online import TargetStates
from eaglelab.engine.training.ttt import TrainBatch, ttt_hidden
from eaglelab.session import add_engine_args, build_session

ROWS = Path(__file__).resolve().parents[1] / "cpu_2026-12-04b" / "replay_rows_5-4-24.json"


def main() -> None:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    s = build_session(p.parse_args(["--device", "cpu", "--steps", "5", "--topk", "4", "--draft-tokens", "24"]),
                      log=lambda m: None)
    net = s.drafter.net
    index = {int(t): i for i, t in enumerate(net.token_map().tolist())}
    hist: dict[int, int] = {}
    torch.set_grad_enabled(False)
    for row in json.loads(ROWS.read_text()):
        prompt, out = row["prompt"], row["out"]
        ids = torch.tensor([prompt + out])
        mask = torch.zeros_like(ids, dtype=torch.float32)
        mask[:, len(prompt):] = 1
        batch = TargetStates(s.target.model, s.drafter.target_taps).fill(TrainBatch(ids, mask, None, None))
        logits = net.lm_head(net.norm(next(iter(ttt_hidden(net, ids, batch.aux, 1)))))[0]  # [T, V_draft]
        c = 1
        for a in row["acc"]:
            if c >= len(out):
                break
            at, tok = len(prompt) + c - 2, out[c]  # step 0 at anchor p predicts the token at p + 2
            rank = int((logits[at] > logits[at, index[tok]]).sum()) if tok in index else -1
            hist[rank] = hist.get(rank, 0) + 1
            c += a
    n = sum(hist.values())
    share = lambda lo, hi: sum(v for k, v in hist.items() if lo <= k <= hi) / n  # noqa: E731
    print(f"cycles {n}: rank 0 {share(0, 0):.3f}, ranks 1-3 {share(1, 3):.3f}, ranks 4-7 {share(4, 7):.3f}, "
          f"8-15 {share(8, 15):.3f}, 16 or lower {share(16, 10**9):.3f}, outside the draft vocabulary "
          f"{hist.get(-1, 0) / n:.3f}")


if __name__ == "__main__":
    main()
