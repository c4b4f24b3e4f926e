"""Replay node-selection rules on ``tree_replay.py``'s recordings: how many tokens a cycle each would accept.

For each cycle the recording holds every candidate of the expansion and which of them lie on the target's path.
A rule scores the candidates; the tree keeps the root and the best ``N - 1``. Its accepted length is 1 (the
bonus) plus the correct candidates it kept (scores never rise from parent to child, so the kept set is closed
under ancestors and the correct ones form the path's first steps).

Rules:
- ``drafter``: the cumulative log-probability (the engine's ranking, SGLang's and vLLM's);
- ``calibrated``: the cumulative sum of ``logsigmoid(a[d] * logp + b[d])`` per depth d, ``a, b`` fitted on
  ``--fit`` by maximum likelihood of "correct given the parent correct" (the estimated probability that the
  node's whole path is accepted, so the N - 1 best maximise the expected accepted length of this expansion);
- ``oracle``: every correct candidate first (the most this expansion can give).

    python benchmarks/tree_select.py --fit heldout.safetensors --eval mtbench.safetensors --nodes 24 16 12 8

It also says why the full expansion's cycles stopped (:func:`stop_reasons`): what a deeper tree, a wider frontier
or a better drafter could each give back.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file


def read_replay(path: str) -> dict[str, torch.Tensor]:
    """A recording of ``tree_replay.py``; anything else ends the script with what it found and what it wants."""
    want = {"correct", "parent", "depth", "score", "logp", "prompt", "full_accept_len"}
    try:
        data = load_file(path)
    except (SafetensorError, OSError) as exc:  # missing, unreadable, not safetensors
        raise SystemExit(f"error: {path}: not a readable safetensors file ({exc}); pass what tree_replay.py --out wrote")
    if not want <= set(data):
        raise SystemExit(f"error: {path}: no {', '.join(sorted(want - set(data)))} tensor; pass what tree_replay.py "
                         "--out wrote")
    return data


def fit_calibration(data: dict[str, torch.Tensor], depths: int, iters: int = 200) -> tuple[list[float], list[float]]:
    """Per depth (1-based) ``a, b`` of ``P(correct | parent correct) = sigmoid(a * logp + b)``."""
    parent = data["parent"]
    correct = data["correct"]
    parent_ok = torch.where(parent >= 0, correct.gather(1, parent.clamp(min=0)), torch.ones_like(correct))
    a_s, b_s = [], []
    for d in range(1, depths + 1):
        sel = (data["depth"] == d) & parent_ok
        x = data["logp"][sel].double().clamp(min=-30.0)
        y = correct[sel].double()
        a = torch.ones((), dtype=torch.float64, requires_grad=True)
        b = torch.zeros((), dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([a, b], max_iter=iters, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(a * x + b, y)
            loss.backward()
            return loss

        opt.step(closure)
        a_s.append(float(a.detach()))
        b_s.append(float(b.detach()))
    return a_s, b_s


def calibrated_scores(data: dict[str, torch.Tensor], a: list[float], b: list[float]) -> torch.Tensor:
    """[C, M] cumulative calibrated log-probabilities (parents come before children)."""
    depth = data["depth"].long()
    av = torch.tensor([0.0] + a, dtype=torch.float64)[depth]
    bv = torch.tensor([0.0] + b, dtype=torch.float64)[depth]
    own = torch.nn.functional.logsigmoid(av * data["logp"].double().clamp(min=-30.0) + bv)
    out = torch.zeros_like(own)
    parent = data["parent"].long()
    for c in range(own.shape[1]):  # parents come first
        p = parent[:, c]
        base = torch.where(p >= 0, out.gather(1, p.clamp(min=0)[:, None])[:, 0], torch.zeros_like(own[:, 0]))
        out[:, c] = base + own[:, c]
    return out


def accepted(data: dict[str, torch.Tensor], scores: torch.Tensor, keep: int) -> torch.Tensor:
    """[C] accepted length a cycle (bonus included) keeping the ``keep`` best candidates (stable: older first)."""
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :keep]
    kept = torch.zeros_like(data["correct"])
    kept.scatter_(1, order, True)
    # closure check: every kept node's parent kept
    parent = data["parent"].long()
    parent_kept = torch.where(parent >= 0, kept.gather(1, parent.clamp(min=0)), torch.ones_like(kept))
    assert bool((~kept | parent_kept).all()), "a rule kept a node without its parent"
    return 1 + (kept & data["correct"]).sum(dim=1)


def stop_reasons(data: dict[str, torch.Tensor], topk: int) -> dict[str, float]:
    """Why each cycle of the full expansion stopped, as shares of cycles: every draft step accepted (``depth``),
    the next correct token not among the last correct node's ``topk`` children (``top_k``), or the last correct
    node pruned off the frontier, so never expanded (``frontier``; ``frontier_2k``: of those, the ones ranked
    within ``2 * topk`` at their depth by the drafter's score, which a frontier twice as wide would have kept);
    ``top_k_at_d``: the top-k misses whose missed token sits at depth d."""
    correct, parent, depth, score = data["correct"], data["parent"].long(), data["depth"].long(), data["score"]
    cycles = correct.shape[0]
    steps = int(depth.max())
    n_ok = correct.sum(dim=1)
    out = {"depth": 0, "top_k": 0, "frontier": 0, "frontier_2k": 0}
    out.update({f"top_k_at_{d}": 0 for d in range(1, steps + 1)})  # the top-k misses by the missed token's depth
    for i in range(cycles):
        if int(n_ok[i]) == steps:
            out["depth"] += 1
            continue
        ok = correct[i].nonzero().flatten()
        if ok.numel() == 0 or bool((parent[i] == int(ok[-1])).any()):
            out["top_k"] += 1
            out[f"top_k_at_{ok.numel() + 1}"] += 1
            continue
        last = int(ok[-1])
        out["frontier"] += 1
        same = depth[i] == depth[i, last]
        out["frontier_2k"] += int((score[i][same] > score[i, last]).sum()) < 2 * topk
    return {k: v / cycles for k, v in out.items()}


def shallower(data: dict[str, torch.Tensor], depth: int, nodes: int, path: str) -> torch.Tensor:
    """The drafter's scores with every candidate past ``depth`` scored -inf: the recording read as a ``depth``-step
    tree. Ends the script, saying so, where ``nodes`` (root included) would have to keep some of those."""
    within = int((data["depth"][0] <= depth).sum())  # every cycle records the same full expansion
    if depth < 1 or nodes - 1 > within:
        raise SystemExit(f"error: {path}: --depths {depth} leaves {max(within, 0)} candidates a cycle, fewer than the "
                         f"{nodes - 1} that --nodes {nodes} keeps besides the root; pass a deeper --depths or fewer "
                         "--nodes")
    return data["score"].double().where(data["depth"] <= depth, float("-inf"))


def report(data: dict[str, torch.Tensor], rules: dict[str, torch.Tensor], nodes: list[int]) -> dict:
    out = {}
    for n in nodes:
        out[n] = {name: float(accepted(data, sc, n - 1).double().mean()) for name, sc in rules.items()}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fit", required=True)
    p.add_argument("--eval", nargs="+", required=True)
    p.add_argument("--nodes", type=int, nargs="+", default=[24, 16, 12, 8])
    p.add_argument("--depths", type=int, nargs="*", default=[],
                   help="also the drafter's rule kept to at most these depths (a 6-step recording read as 5/4/N too: "
                        "the frontier up to a depth does not depend on the steps after it)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    fit = read_replay(args.fit)
    depths = int(fit["depth"].max())
    a, b = fit_calibration(fit, depths)
    print("calibration per depth: " + "  ".join(f"d{d + 1}: a={x:.3f} b={y:.3f}" for d, (x, y) in enumerate(zip(a, b))))
    result = {"a": a, "b": b, "sets": {}}
    for path in [args.fit] + args.eval:
        data = read_replay(path)
        rules = {"drafter": data["score"].double(), "calibrated": calibrated_scores(data, a, b),
                 "oracle": data["correct"].double() * 100 + data["score"].double()}
        for d in args.depths:  # nodes past depth d score below every other, so the best N - 1 never reach them
            if d < int(data["depth"].max()):
                rules[f"drafter_d{d}"] = shallower(data, d, max(args.nodes), path)
        r = report(data, rules, args.nodes)
        topk = int((data["depth"] == 1).sum(dim=1)[0])
        why = stop_reasons(data, topk)
        result["sets"][path] = {"cycles": int(data["correct"].shape[0]), "accepted": r, "stops": why,
                                "full_expansion_accept_len": float(data["full_accept_len"].double().mean())}
        print(f"{path}: {data['correct'].shape[0]} cycles; the full expansion accepts "
              f"{result['sets'][path]['full_expansion_accept_len']:.3f}; cycles stopped by the depth {why['depth']:.1%}, "
              f"the token not in its parent's top {topk} {why['top_k']:.1%}, the parent pruned off the frontier "
              f"{why['frontier']:.1%} ({why['frontier_2k']:.1%} within the best {2 * topk} of their depth); top-{topk} misses "
              "by depth " + " ".join(f"{why[f'top_k_at_{d}']:.1%}" for d in range(1, int(data['depth'].max()) + 1)))
        meta = Path(path).with_suffix(".json")
        cats = json.loads(meta.read_text()).get("categories") if meta.exists() else None
        if cats:  # per MT-bench category: the drafter's 24-node-or-widest selection and why cycles stopped
            result["sets"][path]["by_category"] = {}
            for cat in dict.fromkeys(cats):
                rows = torch.tensor([cats[int(i)] == cat for i in data["prompt"]])
                part = {k: v[rows] for k, v in data.items()}
                w = stop_reasons(part, topk)
                n = max(args.nodes)
                got = float(accepted(part, part["score"].double(), n - 1).double().mean())
                result["sets"][path]["by_category"][cat] = {"cycles": int(rows.sum()), f"drafter_{n}": got, "stops": w}
                print(f"  {cat:<11} {int(rows.sum()):>5} cycles  {n} nodes {got:.3f}  full {float(part['full_accept_len'].double().mean()):.3f}"
                      f"  depth {w['depth']:.1%}  top-{topk} {w['top_k']:.1%}  frontier {w['frontier']:.1%}")
        for n, v in r.items():
            print(f"  {n:>3} nodes: " + "  ".join(f"{k} {x:.3f}" for k, x in v.items())
                  + f"  (calibrated {(v['calibrated'] / v['drafter'] - 1) * 100:+.1f}%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
