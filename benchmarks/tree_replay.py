"""Every candidate the draft tree considers, and which of them the target took: data to choose the tree's nodes by.

Runs speculative decoding at batch 1 with a tree that keeps *every* candidate of its expansion
(``--draft-tokens`` = topk + (steps - 1) * topk^2 + 1; 69 at 5 steps, topk 4) and records, per cycle, each
candidate's depth, parent, own log-probability under the drafter, cumulative score and sibling rank, and whether
its path is the one the target would have generated (read off the run's own output: greedy speculation commits
plain greedy's tokens). With that, any rule that keeps fewer nodes of the same expansion can be replayed offline
(``benchmarks/tree_select.py``): its accepted length a cycle is how far the correct path runs inside the kept set.

    python benchmarks/tree_replay.py --device cpu --steps 5 --topk 4 --set file --file HELD_OUT.jsonl.gz \
        --prompts 200 --out replay.safetensors

Writes one safetensors file (tensors [cycles, candidates]) and a JSON beside it with the settings. The engine runs
eagerly (no CUDA graphs, no compile: each tree is read as Python builds it), on a CPU or a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from drafter_acceptance import questions_or_exit  # noqa: E402

from eaglelab.bench.harness import tokenize_prompts  # noqa: E402
from eaglelab.engine.runtime import tree as tree_mod  # noqa: E402
from eaglelab.probes.tuning import max_draft_tokens  # noqa: E402
from eaglelab.session import add_engine_args, build_session  # noqa: E402


class Recorder:
    """Wraps :meth:`TreeBuilder.finish` to keep each call's whole candidate set (row 0, :meth:`TreeBuilder.candidates`)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, torch.Tensor]] = []
        self._finish = tree_mod.TreeBuilder.finish

    def __enter__(self) -> "Recorder":
        rec = self

        def finish(builder, num_draft_tokens):
            cand = builder.candidates()
            scores = cand.scores[0].float().cpu()  # [M]
            parents = cand.parents[0].cpu() - 1  # [M]; candidate index, -1 = the root
            parent_score = torch.where(parents >= 0, scores[parents.clamp(min=0)], torch.zeros_like(scores))
            rec.calls.append({"score": scores, "logp": scores - parent_score, "parent": parents,
                              "depth": cand.depth.cpu(), "token": cand.tokens[0].cpu(),
                              "rank": torch.arange(scores.shape[0]) % builder.topk})
            return rec._finish(builder, num_draft_tokens)

        tree_mod.TreeBuilder.finish = finish
        return self

    def __exit__(self, *exc) -> None:
        tree_mod.TreeBuilder.finish = self._finish


def correct_flags(call: dict[str, torch.Tensor], truth: list[int]) -> torch.Tensor:
    """[M] bool: the candidate's path (root excluded) is ``truth[:depth]``."""
    ok = torch.zeros(call["token"].shape[0], dtype=torch.bool)
    for c in range(ok.shape[0]):  # parents come before children
        d = int(call["depth"][c])
        p = int(call["parent"][c])
        ok[c] = d <= len(truth) and int(call["token"][c]) == truth[d - 1] and (p < 0 or bool(ok[p]))
    return ok


def record_cycles(engine, prompts: list[list[int]], max_new_tokens: int,
                  progress=lambda i, n, cycles, mean: None, outputs: list | None = None) -> dict[str, torch.Tensor]:
    """Run ``engine`` (batch 1, a tree keeping every candidate) over ``prompts``: per complete cycle (not cut by
    the token budget) every candidate and whether it is correct, as tensors ``[cycles, candidates]``, plus
    ``prompt``, ``full_accept_len`` and ``root`` (the index of the cycle's root in its prompt's output)
    ``[cycles]``; each prompt's output goes into ``outputs`` when given. Checks each cycle: the correct candidates
    are exactly the drafted tokens the engine accepted."""
    cols: dict[str, list[torch.Tensor]] = {}
    prompt_of, full_len, roots = [], [], []
    for i, prompt in enumerate(prompts):
        with Recorder() as rec:
            res = engine.generate([prompt], max_new_tokens)
        gen = res.tokens[0]
        if outputs is not None:
            outputs.append(list(gen))
        lens = [cyc[0] for cyc in res.accept_lens]
        assert len(lens) == len(rec.calls), f"{len(rec.calls)} trees built for {len(lens)} cycles"
        root = 0  # the cycle's root: generated token `root` (the first comes from the prompt's forward)
        for call, a in zip(rec.calls, lens):
            depth = int(call["depth"].max())
            if root + 2 + depth <= len(gen):  # not cut by the token budget
                call["correct"] = correct_flags(call, gen[root + 1: root + 1 + depth])
                got = int(call["correct"].sum())
                assert got == a - 1, f"prompt {i}: {got} correct candidates where the engine accepted {a - 1}"
                for k, v in call.items():
                    cols.setdefault(k, []).append(v)
                prompt_of.append(i)
                full_len.append(a)
                roots.append(root)
            root += a
        progress(i + 1, len(prompts), len(lens), sum(lens) / max(len(lens), 1))
    out = {k: torch.stack(v) for k, v in cols.items()}
    out["prompt"] = torch.tensor(prompt_of, dtype=torch.long)
    out["full_accept_len"] = torch.tensor(full_len, dtype=torch.long)
    out["root"] = torch.tensor(roots, dtype=torch.long)
    return out


def check_full_expansion(sp) -> None:
    """End the script with a message unless ``sp`` (a SpecConfig) keeps a drafter's whole expansion: EAGLE-3, no
    lookup branch, every candidate verified."""
    full = max_draft_tokens(sp.num_steps, sp.topk)  # a chain's steps + 1 too
    if sp.algorithm != "eagle3" or sp.lookup_tokens or sp.num_draft_tokens not in (0, full):
        raise SystemExit(f"error: the replay records a drafter's whole expansion: an EAGLE-3 --draft, no lookup branch, "
                         f"--draft-tokens {full} for {sp.num_steps} steps and topk {sp.topk} (or left out); got "
                         f"{sp.algorithm}, lookup {sp.lookup_tokens}, --draft-tokens {sp.num_draft_tokens}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--set", choices=("mtbench", "humaneval", "file"), default="file")
    p.add_argument("--file", default=None, metavar="PROMPTS")
    p.add_argument("--skip", type=int, default=0, help="skip the file's first N prompts")
    p.add_argument("--prompts", type=int, default=200)
    p.add_argument("--humaneval", default=None)
    p.add_argument("--questions", default=None)
    p.add_argument("--max-prompt-tokens", type=int, default=1024)
    p.add_argument("--out", required=True, metavar="OUT.safetensors")
    args = p.parse_args()
    texts, cats = questions_or_exit(args.set, args.skip + args.prompts, args.humaneval, args.questions, args.file)
    texts, cats = texts[args.skip:], (cats[args.skip:] if cats else None)
    if args.steps and args.topk and args.draft_tokens is None:
        args.draft_tokens = max_draft_tokens(args.steps, args.topk)
    if args.lookup_tokens is None:
        args.lookup_tokens = 0
    args.cuda_graphs = args.compile = False  # the recorder reads each tree as Python builds it: no graph replays
    s = build_session(args, log=lambda m: print(m, file=sys.stderr))
    check_full_expansion(s.spec)
    ids, _ = tokenize_prompts(texts, s.target.tokenizer, s.target.config.vocab_size, args.max_prompt_tokens)
    engine = s.engine()
    engine.generate([ids[0]], 8)  # warm-up
    t0 = time.perf_counter()

    def progress(i, n, cycles, mean):
        print(f"prompt {i}/{n}: {cycles} cycles, accepted {mean:.2f} ({time.perf_counter() - t0:.0f} s)",
              file=sys.stderr, flush=True)

    outputs: list[list[int]] = []
    out = record_cycles(engine, ids, args.max_new_tokens, progress, outputs)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in out.items()}, args.out)
    meta = {"set": args.set, "file": args.file, "skip": args.skip, "prompts": len(ids), "spec": s.spec.to_dict(),
            "device": s.device_label, "dtype": s.dtype_name, "torch": torch.__version__,
            "max_new_tokens": args.max_new_tokens, "cycles": int(out["prompt"].shape[0]), "categories": cats,
            "prompt_ids": ids, "outputs": outputs}  # a cycle's context: prompt_ids[p] + outputs[p][: root + 1]
    Path(args.out).with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{meta['cycles']} cycles from {len(ids)} prompts -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
