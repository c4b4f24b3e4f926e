"""Why does a drafter accept less on a benchmark than on its held-out split? Three figures on the
same prompts, from one run of the real engine (greedy, batch 1, a chain of ``--steps`` drafts):

1. engine: the engine's mean accepted length (bonus included) over its cycles;
2. walk: the simulation of training (:mod:`offline_eval`, a batched TTT forward over the target's
   own answer with the target's states computed afresh) replayed on the engine's cycle anchors
   (first anchor: the last prompt token; next anchor: + the accepted length). With lossless greedy
   speculation the answer is the target's greedy answer, so (1) and (2) must agree up to float
   rounding: a gap here is a train/inference mismatch (taps, positions, masks, norms);
3. uniform: the same simulation averaged over EVERY answer anchor, which is what training reports
   as "held-out accepted length". Cycles land more often where drafting is hard (a cycle there
   covers fewer tokens), so (3) > (2) by construction on any data: the two are different averages.

Also: the share of the target's answer tokens outside the draft vocabulary (a drafter can never
propose them: each caps a chain).

    python benchmarks/drafter_diagnose.py --set mtbench --prompts 16 --max-new-tokens 96 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from drafter_acceptance import per_position, questions, write_report  # noqa: E402

from eaglelab.bench.harness import tokenize_prompts  # noqa: E402
from eaglelab.engine.training.offline_eval import walk  # noqa: E402
from eaglelab.session import add_engine_args, build_session  # noqa: E402


def simulated(s, prompt: list[int], answer: list[int], steps: int):
    """(hits bool [n, steps], valid bool [n]) at every anchor p of prompt + answer."""
    from eaglelab.engine.training.offline_eval import anchor_hits
    from eaglelab.engine.training.online import TargetStates
    from eaglelab.engine.training.train import TargetHead
    from eaglelab.engine.training.ttt import TrainBatch

    ids = torch.tensor([prompt + answer], device=s.target.device)  # [1, T]
    mask = torch.zeros_like(ids, dtype=torch.float32)
    mask[:, len(prompt):] = 1.0
    states = TargetStates(s.target.model, s.drafter.target_taps)
    batch = states.fill(TrainBatch(ids, mask, None, None))
    head = TargetHead.from_model(s.target.model)
    hits, valid = anchor_hits(s.drafter.net, batch, head.lm_head_weight, steps)
    return hits[0].cpu(), valid[0].cpu()


def chain_len(hits_row: torch.Tensor) -> int:
    """Accepted length (bonus included) of a chain with these per-step hits."""
    return 1 + int(hits_row.long().cumprod(0).sum())


def _mean(xs: list[int]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--set", choices=("mtbench", "humaneval"), default="mtbench")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--humaneval", default=None, metavar="FILE")
    p.add_argument("--questions", default=None, metavar="FILE")
    p.add_argument("--corpus", default=None, metavar="FILE",
                   help="prompts from an `eaglelab prompts` file instead (spread evenly over it): training-like data")
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--json", default=None, metavar="OUT")
    args = p.parse_args()
    s = build_session(args, log=lambda m: print(m, file=sys.stderr))
    if not s.spec.enabled or not hasattr(s.drafter, "net"):
        raise SystemExit("needs an EAGLE-3 drafter (--draft)")
    k = s.spec.num_steps
    if args.corpus:
        from eaglelab.engine.training.prompt_corpus import read_corpus

        recs = read_corpus(args.corpus)
        texts = [recs[i * len(recs) // args.prompts]["prompt"] for i in range(min(args.prompts, len(recs)))]
        args.set = f"corpus {args.corpus}"
    else:
        texts = questions(args.set, args.prompts, args.humaneval, args.questions)
    ids, _ = tokenize_prompts(texts, s.target.tokenizer, s.target.config.vocab_size, args.max_prompt_tokens)
    t2d = s.drafter.net.t2d.bool().cpu() if hasattr(s.drafter.net, "t2d") else None
    engine_lens, walk_lens, uniform, outside, answer_tokens = [], [], [], 0, 0
    engine = s.engine()  # one engine (and, on CUDA, one graph capture) for all prompts
    t0 = time.perf_counter()
    for n, prompt in enumerate(ids):
        res = engine.generate([prompt], args.max_new_tokens)
        answer = res.tokens[0]
        engine_lens += [a for cyc in res.accept_lens for a in cyc]
        hits, valid = simulated(s, prompt, answer, k)
        walk_lens += walk(hits, valid, len(prompt) - 1, k)  # the engine's cycles, replayed
        uniform += [chain_len(h) for h in hits[valid]]
        if t2d is not None:
            outside += int((~t2d[torch.tensor(answer)]).sum())
        answer_tokens += len(answer)
        print(f"[{n + 1}/{len(ids)} {time.perf_counter() - t0:.0f}s] engine {_mean(engine_lens):.3f} ({len(engine_lens)} cycles) "
              f"walk {_mean(walk_lens):.3f} ({len(walk_lens)}) uniform {_mean(uniform):.3f} ({len(uniform)} anchors); "
              f"answer tokens outside the draft vocabulary {outside}/{answer_tokens}", file=sys.stderr)
    report = {
        "set": args.set, "prompts": len(ids), "spec": s.spec_label, "device": s.device_label, "dtype": s.dtype_name,
        "max_new_tokens": args.max_new_tokens, "answer_tokens": answer_tokens,
        "engine": {"cycles": len(engine_lens), "mean_accept_len": _mean(engine_lens), "per_position": per_position(engine_lens, k)},
        "walk": {"cycles": len(walk_lens), "mean_accept_len": _mean(walk_lens), "per_position": per_position(walk_lens, k)},
        "uniform": {"anchors": len(uniform), "mean_accept_len": _mean(uniform), "per_position": per_position(uniform, k)},
        "answer_tokens_outside_draft_vocab": outside / answer_tokens if t2d is not None and answer_tokens else None,
    }
    print(json.dumps(report, indent=1))
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
