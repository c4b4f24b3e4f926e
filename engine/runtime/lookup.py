"""A prompt-lookup branch beside the drafter's tree: the continuation of the context's latest earlier n-gram,
grafted onto the root as a chain of ``k`` more nodes the target verifies with the rest.

A drafter predicts the next token from the target's features; text that repeats itself (a list's markup, a name
or code line quoted again, a small model looping on a phrase) is cheaper to predict by finding where the last few
tokens appeared before and copying what followed. SGLang and vLLM offer that lookup as a speculator of its own
(``ngram``); here it rides along the EAGLE-3 tree in the same verify, so each cycle keeps the longer of the two.

Pure tensor functions with fixed shapes and no host synchronisation (they run inside the captured cycle):

* :func:`lookup_chain` finds, per row, the latest earlier position whose last ``n`` tokens equal the context's
  last ``n`` (``n`` from ``max_ngram`` down to ``min_ngram``: the longest match first, then the latest), and
  returns the ``k`` tokens that followed it. A continuation that runs into the context's end wraps around the
  repeat (``a b c a b c`` continues ``a b c``), so a loop is proposed as far as it would go on;
* :func:`graft_chain` adds those ``k`` tokens to a tree as a chain hanging off the root (node ``N`` the root's
  child, node ``N + j`` the child of ``N + j - 1``), sibling rank ``topk`` (after the drafter's children);
* :func:`branch_or_tree` (``SpecConfig.lookup_spill``) keeps that tree only where the lookup matched: where the
  context's last token never occurred before, the row verifies the drafter's best ``N + k`` nodes instead.

Worked example, one row, history ``[5, 7, 9, 4, 5, 7]`` (context length 6), k = 3, max_ngram 2: the tail
``5 7`` last appeared ending at position 1, so the chain is ``9 4 5`` (positions 2, 3, 4).
"""

from __future__ import annotations

import torch
from torch import Tensor

MAX_NGRAM = 4  # the longest tail looked up (the n-gram drafter's default too: drafters.NgramDrafter runs this search)
MIN_NGRAM = 1


def lookup_chain(history: Tensor, context_len: Tensor, k: int, max_ngram: int = MAX_NGRAM,
                 min_ngram: int = MIN_NGRAM, with_match: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """``history [B, S]`` (token ids by position; positions ``>= context_len`` are ignored) and ``context_len
    [B]`` (>= 1) -> the proposed continuation ``[B, k]`` (and, ``with_match``, the matched tail's length ``[B]``,
    0 where nothing matched). A row without any match proposes its last token repeated (a guess the verify
    rejects or keeps like any other)."""
    B, S = history.shape
    pos = torch.arange(S, device=history.device)
    last = (context_len - 1)[:, None]  # [B, 1]: the context's last position (the root)
    run = torch.zeros(B, S, dtype=torch.long, device=history.device)  # matching tail length ending at each position
    alive = torch.ones(B, S, dtype=torch.bool, device=history.device)
    for j in range(max_ngram):
        shifted = torch.nn.functional.pad(history, (j, 0), value=-1)[:, :S]  # shifted[:, e] = history[:, e - j]
        want = history.gather(1, (last - j).clamp(min=0))  # [B, 1]: the tail's j-th token from the end
        alive = alive & (shifted == want) & (last - j >= 0)
        run = run + alive.long()
    ok = (pos[None, :] < last) & (run >= min_ngram)  # an earlier occurrence, long enough
    score = torch.where(ok, run * S + pos[None, :], -1)  # the longest match, then the latest
    best = score.max(dim=1, keepdim=True).values  # [B, 1]
    end = torch.where(best >= 0, best % S, last - 1)  # [B, 1]: where the match ends (no match: the root repeats)
    period = (last - end).clamp(min=1)  # [B, 1]
    steps = torch.arange(k, device=history.device)[None, :]  # [1, k]
    chain = history.gather(1, (end + 1 + steps % period).clamp(0, S - 1))
    return (chain, torch.where(best >= 0, best // S, 0)[:, 0]) if with_match else chain


def graft_chain(tokens: Tensor, parents: Tensor, depth: Tensor, mask: Tensor, rank: Tensor, chain: Tensor,
                topk: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """A tree's ``tokens, parents, depth [B, N]``, ``mask [B, N, N]``, ``rank [B, N]`` with ``chain [B, k]``
    hanging off the root as nodes ``N .. N + k - 1`` -> the same five of ``N + k`` nodes. Parents still come
    before their children; the chain's nodes take sibling rank ``topk`` (after the drafter's own)."""
    B, N = tokens.shape
    k = chain.shape[1]
    dev = tokens.device
    steps = torch.arange(k, device=dev)
    chain_parents = torch.where(steps == 0, 0, N + steps - 1).expand(B, k)
    lower = torch.ones(k, k, dtype=torch.bool, device=dev).tril()
    # [k, N + k]: every link sees the root and the links before it, none of the drafter's nodes
    bottom = torch.cat([torch.ones(k, 1, dtype=torch.bool, device=dev),
                        torch.zeros(k, N - 1, dtype=torch.bool, device=dev), lower], dim=1)
    top = torch.cat([mask, mask.new_zeros(B, N, k)], dim=2)  # [B, N, N + k]
    return (torch.cat([tokens, chain], dim=1),
            torch.cat([parents, chain_parents], dim=1),
            torch.cat([depth, (steps + 1).expand(B, k)], dim=1),
            torch.cat([top, bottom.expand(B, k, N + k)], dim=1),
            torch.cat([rank, torch.full((B, k), topk, dtype=rank.dtype, device=dev)], dim=1))


def branch_or_tree(grafted: tuple[Tensor, ...], wide: tuple[Tensor, ...], matched: Tensor) -> tuple[Tensor, ...]:
    """Per row, the tree with its lookup branch (``grafted``: the five tensors of :func:`graft_chain`) where the
    lookup matched (``matched [B] > 0``), else ``wide``: the drafter's own tree of as many nodes (no match means the
    branch would only repeat the root; its rows serve the tree better). Shapes match, so it runs captured."""
    rows = matched > 0
    return tuple(torch.where(rows.view(-1, *[1] * (g.dim() - 1)), g, w) for g, w in zip(grafted, wide))


def record(history: Tensor, positions: Tensor, tokens: Tensor, keep: Tensor) -> None:
    """Write ``tokens [B, T]`` at ``positions [B, T]`` of ``history [>=B, S]`` where ``keep [B, T]`` (in place;
    the others are written back unchanged, so the shapes stay fixed)."""
    rows = torch.arange(tokens.shape[0], device=tokens.device)[:, None]
    at = positions.clamp(0, history.shape[1] - 1)
    history[rows, at] = torch.where(keep, tokens, history[rows, at])
