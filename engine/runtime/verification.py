"""Accepting draft tokens against the target: greedy matching and lossless tree rejection sampling.

The target ran once over the whole draft tree; its output at node i is its prediction for the
token that follows node i's path. Both functions walk the tree from the root and return the
accepted path, the committed tokens (accepted drafts, then one bonus token from the target) and
the accept length (SGLang's "accept len": the bonus included). They are vectorised over the
batch, keep fixed shapes and never synchronise with the host.

Worked example (greedy): tree tokens [9, 4, 7, 5], parents [-1, 0, 0, 1] (9 -> 4 -> 5, 9 -> 7);
target argmax per node [4, 5, 1, 8]. Node 1 (4) matches argmax at the root, node 3 (5) matches
argmax at node 1, node 2 (7) does not match. Path [0, 1, 3], bonus = argmax at node 3 = 8,
tokens [4, 5, 8], accept_len 3.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from eaglelab.engine.runtime.sampling import exponential_noise, sample_with
from eaglelab.engine.runtime.tree import DraftTree, greedy_token


@dataclass(frozen=True)
class Acceptance:
    """What one verify step commits, per row. D is ``tree.max_depth``.

    ``tokens[b, :accept_len[b]]`` are the committed tokens: the accepted draft tokens in path
    order, then the bonus token. ``path[b, :accept_len[b]]`` are the accepted node indices,
    starting at the root (0). Entries past ``accept_len`` are -1.
    """

    accept_len: Tensor  # [B] long, 1..D+1
    path: Tensor  # [B, D+1] long
    tokens: Tensor  # [B, D+1] long
    bonus: Tensor  # [B] long

    @property
    def last_node(self) -> Tensor:
        """Index ``[B]`` of the deepest accepted node (0 when no draft token was accepted)."""
        return self.path.gather(1, (self.accept_len - 1)[:, None]).squeeze(1)

    @property
    def num_accepted_drafts(self) -> Tensor:
        """Draft tokens accepted ``[B]``: ``accept_len - 1``."""
        return self.accept_len - 1


def greedy_accept(tree: DraftTree, target_logits: Tensor) -> Acceptance:
    """Greedy verification of ``tree`` against ``target_logits [B, N, V]``.

    A node is accepted when its token equals the target's argmax at its parent and its parent is
    accepted. The deepest accepted node wins (the first in node order among equally deep ones);
    the bonus is the target's argmax there. Commits exactly what plain greedy decoding would.
    """
    pred = greedy_token(target_logits)  # [B, N]; the target's next token after node i
    parent_pred = pred.gather(1, tree.parents.clamp(min=0))  # [B, N]
    match = (tree.tokens == parent_pred) | (tree.parents < 0)  # [B, N]; the root always matches
    accepted = ~(tree.mask & ~match[:, None, :]).any(dim=-1)  # [B, N]; every ancestor-or-self matches
    last = torch.argmax(torch.where(accepted, tree.depth, -1), dim=1)  # [B]; first deepest
    bonus = pred.gather(1, last[:, None]).squeeze(1)  # [B]
    return _commit(tree, last, bonus)


def rejection_accept(tree: DraftTree, target_probs: Tensor, generator: torch.Generator | None = None, *,
                     uniform: Tensor | None = None, race: Tensor | None = None) -> Acceptance:
    """Lossless tree rejection sampling of deterministic draft candidates.

    ``target_probs [B, N, V]`` is the target's (filtered, tempered) next-token distribution after
    each node. Starting at the root with residual p = target_probs[root], the children c of the
    current node are tried in node order: c is accepted with probability p(c) / sum(p), moving to
    c with p = target_probs[c]; otherwise p(c) is set to 0 and the next child is tried. When no
    child is accepted the bonus is drawn from the residual p. The committed tokens are then
    distributed exactly as if drawn from the target one by one.

    Computed for every node at once (no loop over nodes): child i of node u, tried after its
    earlier siblings were rejected, is accepted when ``uniform_i * (sum p_u - mass of the earlier
    siblings) < p_u(token_i)`` (a sibling repeating an earlier sibling's token has mass 0); the
    first accepted child of each node is the chosen one, and the path follows chosen children.
    ``uniform [B, N]`` and ``race [B, V]`` (Exp(1) draws for the bonus) are drawn from
    ``generator`` unless given (a captured graph takes them as inputs).
    """
    batch, nodes, vocab = target_probs.shape
    dev = target_probs.device
    if uniform is None:
        uniform = torch.rand(batch, nodes, generator=generator, device=dev)  # [B, N]
    if race is None:
        race = exponential_noise((batch, vocab), dev, generator)  # [B, V]
    probs = target_probs.float()
    parent = tree.parents.clamp(min=0)  # [B, N]
    p_tok = probs.reshape(batch, nodes * vocab).gather(1, parent * vocab + tree.tokens)  # [B, N] p_parent(token)
    ids = torch.arange(nodes, device=dev)
    is_child = tree.parents >= 0  # [B, N]
    earlier_sib = (tree.parents[:, :, None] == tree.parents[:, None, :]) & (ids[None, :] < ids[:, None])  # [B, N, N]
    earlier_sib &= is_child[:, :, None] & is_child[:, None, :]
    repeat = (earlier_sib & (tree.tokens[:, :, None] == tree.tokens[:, None, :])).any(-1)  # [B, N]
    p_tok = torch.where(repeat, 0.0, p_tok)
    prior = (earlier_sib.float() * p_tok[:, None, :]).sum(-1)  # [B, N] mass of the earlier siblings
    total = probs.sum(-1).gather(1, parent)  # [B, N] sum of p at the parent
    accept = is_child & (uniform * (total - prior) < p_tok)  # [B, N]
    chosen = accept & ~(earlier_sib & accept[:, None, :]).any(-1)  # the first accepted child
    reached = ~(tree.mask & ~(chosen | ~is_child)[:, None, :]).any(-1)  # [B, N] every ancestor chosen
    last = torch.argmax(torch.where(reached, tree.depth, -1), dim=1)  # [B]; one chosen path
    residual = probs.gather(1, last[:, None, None].expand(batch, 1, vocab)).squeeze(1)  # [B, V]
    tried = torch.zeros_like(residual).scatter_add_(1, tree.tokens, (tree.parents == last[:, None]).float())
    bonus = sample_with(torch.where(tried > 0, 0.0, residual), race)  # [B]; every child of last rejected
    return _commit(tree, last, bonus)


def _commit(tree: DraftTree, last: Tensor, bonus: Tensor) -> Acceptance:
    """The path from the root to ``last [B]`` and the committed tokens ending in ``bonus [B]``."""
    batch, nodes = tree.tokens.shape
    width = tree.max_depth + 1
    levels = torch.arange(width, device=last.device)  # [D+1]
    ids = torch.arange(nodes, device=last.device)  # [N]
    on_path = tree.mask.gather(1, last[:, None, None].expand(batch, 1, nodes)).squeeze(1)  # [B, N]
    at_level = on_path[:, None, :] & (tree.depth[:, None, :] == levels[None, :, None])  # [B, D+1, N]
    path = torch.where(at_level.any(-1), (at_level.long() * ids).sum(-1), -1)  # [B, D+1]
    accept_len = tree.depth.gather(1, last[:, None]).squeeze(1) + 1  # [B]
    drafts = tree.tokens.gather(1, path[:, 1:].clamp(min=0))  # [B, D]; tokens after the root
    drafts = torch.where(path[:, 1:] >= 0, drafts, -1)
    tokens = torch.cat([drafts, drafts.new_full((batch, 1), -1)], dim=1)  # [B, D+1]
    tokens = torch.where(levels[None, :] == (accept_len - 1)[:, None], bonus[:, None], tokens)
    return Acceptance(accept_len=accept_len, path=path, tokens=tokens, bonus=bonus)


def path_ranks(tree: DraftTree, acc: Acceptance) -> tuple[Tensor, Tensor]:
    """Sibling ranks along each accepted path, and whether its last node had drafted children.

    -> ``ranks [B, D]`` (1-based rank of the accepted node at depth 1..D, 0 past the path) and
    ``open [B]`` bool (the deepest accepted node was expanded, so the next depth was offered and
    missed). What a tuner needs to estimate acceptance per depth and rank from a wide tree.
    """
    batch, nodes = tree.tokens.shape
    rank = tree.rank if tree.rank is not None else torch.zeros_like(tree.tokens)  # [B, N]
    on_path = acc.path[:, 1:]  # [B, D]
    ranks = torch.where(on_path >= 0, rank.gather(1, on_path.clamp(min=0)) + 1, 0)  # [B, D]
    ids = torch.arange(nodes, device=tree.tokens.device)
    has_child = (tree.parents[:, :, None] == ids).any(dim=1)  # [B, N]
    return ranks, has_child.gather(1, acc.last_node[:, None]).squeeze(1)
