"""The draft tree: building it step by step, its attention masks and positions.

Pure tensor functions with fixed shapes and no host synchronisation, testable without a model.

Semantics follow SGLang's EAGLE tree (``topk`` children per node, ``num_steps`` drafter steps):

* step 0 expands the root (the last committed token) into its ``topk`` most likely children,
  scored by their log-probability (the drafter's logits normalised: :func:`top_k_log_softmax`);
* every later step expands each of the ``topk`` frontier nodes into ``topk`` children
  (``topk * topk`` candidates, cumulative score = parent score + child log-prob) and keeps the
  best ``topk`` as the new frontier;
* after ``num_steps`` steps every candidate ever produced (``topk + (num_steps - 1) * topk**2``)
  is ranked by cumulative score and the best ``num_draft_tokens - 1`` are kept, plus the root.

Child log-probs are clamped to ``<= 0`` (NaN counts as ``-inf``) and ties rank the older node
first, so a node never outranks its parent: the kept set is always closed under ancestors.
Every ranking here (:func:`top_k`, :func:`order_desc`) breaks ties towards the lower index, as a
stable sort does. Inside a compiled phase both are built from reductions and elementwise work only,
which inductor fuses, where ``torch.topk`` and ``torch.sort`` would stay ATen's own multi-kernel
launches (on the H200 they were most of the draft phase's kernels); run eagerly, where every
operation is a launch or a pass of its own, they take the few operations that give the same result.
``topk == 1`` gives a chain of ``num_steps + 1`` nodes, the same tree :func:`chain_tree` builds.

Worked example, B = 1, topk = 2, num_steps = 2, num_draft_tokens = 4, root token 9::

    step 0: root -> a (log p -0.2), b (-1.8)                     frontier (a, b)
    step 1: a -> c (-0.1), d (-2.5); b -> e (-0.05), f (-3.5)     cumulative c -0.3, e -1.85, d -2.7, f -5.3
    finish: rank a -0.2, c -0.3, b -1.8, e -1.85, ...  keep a, c, b  ->  nodes ordered by (depth, rank):
    tokens  [9, a, b, c]    parents [-1, 0, 0, 1]    depth [0, 1, 1, 2]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from eaglelab.engine.runtime import cycle_ops


@dataclass(frozen=True)
class DraftTree:
    """A batch of draft trees, all with N nodes; node 0 is the root (the last committed token).

    Nodes are ordered so that a parent always comes before its children (by depth, then rank).
    ``max_depth`` is a static upper bound on ``depth`` (the number of draft steps); it sizes the
    acceptance outputs. Left at -1 it is read from ``depth`` (one host sync, at construction).
    """

    tokens: Tensor  # [B, N] long
    parents: Tensor  # [B, N] long; parent node index, -1 for the root
    depth: Tensor  # [B, N] long; 0 for the root
    mask: Tensor  # [B, N, N] bool; mask[b, i, j]: j is i or an ancestor of i
    max_depth: int = -1
    rank: Tensor | None = None  # [B, N] long; 0-based rank among its siblings (0 for the root); None = all 0

    def __post_init__(self) -> None:
        batch, nodes = self.tokens.shape
        assert self.parents.shape == (batch, nodes), f"parents {tuple(self.parents.shape)} != {(batch, nodes)}"
        assert self.depth.shape == (batch, nodes), f"depth {tuple(self.depth.shape)} != {(batch, nodes)}"
        assert self.mask.shape == (batch, nodes, nodes), f"mask {tuple(self.mask.shape)} != {(batch, nodes, nodes)}"
        assert self.mask.dtype == torch.bool, f"mask must be bool, got {self.mask.dtype}"
        assert self.rank is None or self.rank.shape == (batch, nodes), f"rank {tuple(self.rank.shape)} != {(batch, nodes)}"
        if self.max_depth < 0:
            object.__setattr__(self, "max_depth", int(self.depth.max()))

    @property
    def batch_size(self) -> int:
        """B."""
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        """N, the root included (SGLang's ``num_draft_tokens``)."""
        return self.tokens.shape[1]

    def positions(self, base: Tensor) -> Tensor:
        """Position ids ``[B, N]`` of the nodes when the root sits at ``base [B]``."""
        return base[:, None] + self.depth


def make_tree(tokens: Tensor, parents: Tensor, max_depth: int | None = None, rank: Tensor | None = None) -> DraftTree:
    """A :class:`DraftTree` from ``tokens [B, N]`` and ``parents [B, N]`` (parents before children).

    ``max_depth`` bounds the depth (it saves work and a host sync); ``None`` means N - 1.
    ``rank [B, N]``: each node's 0-based rank among its siblings, when known.
    """
    steps = tokens.shape[1] - 1 if max_depth is None else max_depth
    depth, mask = _ancestry(parents, steps)
    return DraftTree(tokens=tokens, parents=parents, depth=depth, mask=mask, max_depth=steps, rank=rank)


def chain_tree(tokens: Tensor) -> DraftTree:
    """The chain ``root -> t1 -> ... -> tS`` from ``tokens [B, S+1]`` (topk = 1)."""
    batch, nodes = tokens.shape
    device = tokens.device
    parents = torch.arange(-1, nodes - 1, device=device).expand(batch, nodes)  # [B, N]
    depth = torch.arange(nodes, device=device).expand(batch, nodes)  # [B, N]
    mask = torch.ones(nodes, nodes, dtype=torch.bool, device=device).tril().expand(batch, nodes, nodes)
    return DraftTree(tokens=tokens, parents=parents, depth=depth, mask=mask, max_depth=nodes - 1)


def _ancestry(parents: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """Depth ``[B, N]`` and ancestor-or-self mask ``[B, N, N]`` by ``steps`` pointer jumps."""
    batch, nodes = parents.shape
    mask = torch.eye(nodes, dtype=torch.bool, device=parents.device).expand(batch, nodes, nodes).clone()
    depth = torch.zeros_like(parents)
    ids = torch.arange(nodes, device=parents.device)  # [N]
    cur = ids.expand(batch, nodes)  # [B, N]; the ancestor reached so far, -1 past the root
    for _ in range(steps):
        up = parents.gather(1, cur.clamp(min=0))  # [B, N]
        cur = torch.where(cur >= 0, up, cur)
        depth = depth + (cur >= 0).long()
        mask = mask | (cur[:, :, None] == ids)  # [B, N, N]; cur = -1 matches nothing
    return depth, mask


TOP_K_CHUNK = 256  # vocabulary entries per block of top_k's first stage (cycle_kernels.CHUNK: the same)
# Vocabularies up to this size are ranked in one pass. On the H200 two stages won at 12,288 (the shipped drafter's
# draft vocabulary) and at 32,000: the draft's expansion step 13-16 us against 20-23 us a call, a 5/4/24 draft phase
# 0.271 ms against 0.292 (benchmarks/topk_bench.py, results/h200_2026-12-01i/D). Smaller vocabularies: not measured.
TOP_K_ONE_PASS = 4096


def top_k(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest entries of ``x [..., V]`` (float) along its last dim, largest first: values and
    indices ``[..., k]``. Ties go to the lower index; NaN ranks as ``-inf`` (its value is returned).

    Eagerly: ``k`` rounds of a max, each taking its entry out in place (:func:`_top_k_eager`). Compiled
    (:func:`_top_k_fused`): one pass of :func:`_argmax_rounds` over each row, or, for a vocabulary larger
    than :data:`TOP_K_ONE_PASS`, two: the best ``k`` of every block of :data:`TOP_K_CHUNK` entries, then
    the best ``k`` of those candidates (blocks in order, so ties still go to the lower index). One
    program per row of a 32,000-entry vocabulary ran ~30 us a step on the H200 (a 6/4/16 draft spent
    165 us of each cycle there), of a 12,288-entry one ~13 us; blocks give the GPU rows enough to run side
    by side.
    """
    if torch.compiler.is_compiling():
        return _top_k_fused(x, k)
    return _top_k_eager(x, k)


def greedy_token(logits: Tensor) -> Tensor:
    """The greedy pick over ``logits [..., V]``: the index of the largest entry, the first of equal maxima.

    Eagerly ``argmax``; compiled, :func:`top_k`'s fused form with k = 1, which ranks a vocabulary past
    :data:`TOP_K_ONE_PASS` entries in blocks (inductor's ``argmax`` gives each row one program: SmolLM2's 49,152
    logits took ~9-10 us that way on the H200, in a decode's pick and a verify's 24 alike). A NaN wins eagerly, as in
    ``argmax``, and ranks as ``-inf`` compiled: a target and its speculation pick in the same mode, so alike.
    """
    if torch.compiler.is_compiling():
        return _top_k_fused(logits, 1)[1][..., 0]
    return logits.argmax(dim=-1)


def _top_k_eager(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """:func:`top_k` in ``2k + 2`` operations (on a 2-core CPU, k = 4 over [1, 4, 12288]: 0.34 ms, the fused form
    run eagerly 1.1 ms, torch.topk 0.08-0.12 ms, whose ties fall where they may)."""
    floor = torch.finfo(x.dtype).min
    key = torch.nan_to_num(x, nan=floor, posinf=float("inf"), neginf=floor)  # a copy; every entry > -inf
    picked = []
    for r in range(k):
        index = key.argmax(dim=-1, keepdim=True)  # [..., 1]; the first of equal maxima
        if r + 1 < k:
            key.scatter_(-1, index, float("-inf"))
        picked.append(index)
    indices = torch.cat(picked, dim=-1)  # [..., k]
    return x.gather(-1, indices), indices


def _top_k_fused(x: Tensor, k: int, chunk: int | None = None, normalise: bool = False) -> tuple[Tensor, Tensor]:
    """:func:`top_k` from reductions and elementwise work (the entries taken are masked by comparison with
    the indices picked, not written), in blocks past :data:`TOP_K_ONE_PASS` entries (blocks of ``chunk``
    entries whenever it is given: the tests' way to the two-stage path). ``normalise``: the values less the row's
    log-sum-exp (:func:`top_k_log_softmax`; ``x`` then float32), which in blocks comes from each block's max (its
    first pick) and sum of exponentials, reductions over the same block as its picks."""
    floor = torch.finfo(x.dtype).min
    key = torch.where(torch.isnan(x) | (x == float("-inf")), floor, x)  # every entry above the mask value
    vocab = x.shape[-1]
    if chunk is None:
        chunk = TOP_K_CHUNK if vocab > TOP_K_ONE_PASS else vocab
    if vocab <= 2 * chunk:
        indices = _argmax_rounds(key, k)[1]
        shift = torch.logsumexp(x, dim=-1, keepdim=True) if normalise else 0.0
        return x.gather(-1, indices) - shift, indices
    blocks = torch.nn.functional.pad(key, (0, -vocab % chunk), value=float("-inf")).unflatten(-1, (-1, chunk))
    local_key, local = _argmax_rounds(blocks, min(k, chunk))  # [..., C, k']; -inf past a block's entries
    start = torch.arange(blocks.shape[-2], device=x.device)[:, None] * chunk  # [C, 1]
    pick = _argmax_rounds(local_key.flatten(-2), k)[1]  # [..., k] into the candidates
    indices = (local + start).flatten(-2).gather(-1, pick)  # [..., k]
    if not normalise:
        return x.gather(-1, indices), indices
    peak = local_key[..., 0]  # [..., C]: each block's max
    mass = torch.exp(blocks - peak[..., None]).sum(dim=-1)  # [..., C]; padding adds exp(-inf) = 0
    top = peak.amax(dim=-1, keepdim=True)  # [..., 1]
    lse = top + torch.log((mass * torch.exp(peak - top)).sum(dim=-1, keepdim=True))
    return x.gather(-1, indices) - lse, indices


def top_k_log_softmax(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` most likely entries of ``softmax(x)`` over ``x [..., V]``'s last dim: their log-probabilities
    (float32) and indices ``[..., k]``, most likely first, ties to the lower index; a NaN entry has probability 0.

    Ranked on ``x`` itself (a log-probability is ``x`` less the row's log-sum-exp, one shift for the whole row),
    so compiled, the normaliser comes out of :func:`top_k`'s own passes and no softmax reads the vocabulary
    apart from them (on the H200 a draft step's log-softmax was four launches of its own). Log-probabilities given
    as ``x`` come back as they were, up to rounding: normalising twice changes nothing.
    """
    x = torch.where(torch.isnan(x), float("-inf"), x.float())
    if torch.compiler.is_compiling():
        return _top_k_fused(x, k, normalise=True)
    values, indices = _top_k_eager(x, k)
    return values - torch.logsumexp(x, dim=-1, keepdim=True), indices


def _argmax_rounds(key: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``k`` rounds of one max each over ``key [..., M]`` (no NaN; ``-inf`` only for padding), the entries
    already taken masked to ``-inf``: values and indices ``[..., k]``, ties to the lower index; a value
    is ``-inf`` (its index a repeat or padding) once fewer than ``k`` entries above ``-inf`` were left.
    ``k`` fused reductions under inductor."""
    pos = torch.arange(key.shape[-1], device=key.device)  # [M]
    values: list[Tensor] = []
    picked: list[Tensor] = []
    for _ in range(k):
        taken = torch.zeros_like(key, dtype=torch.bool)
        for i in picked:
            taken = taken | (pos == i[..., None])
        value, index = torch.where(taken, float("-inf"), key).max(dim=-1)
        values.append(value)
        picked.append(index)
    return torch.stack(values, dim=-1), torch.stack(picked, dim=-1)


def order_desc(x: Tensor, k: int) -> Tensor:
    """Indices ``[..., k]`` of the ``k`` largest entries of ``x [..., M]``, largest first, ties to the lower
    index (a stable descending sort's first ``k``); NaN ranks as ``-inf``.

    Compiled: each entry's rank is counted (how many entries come before it: ``M * M`` compares) and
    the first ``k`` ranks are read back: elementwise work and sums, for the tree's few candidates.
    Eagerly: a stable descending sort.
    """
    if x.is_floating_point():
        x = torch.where(torch.isnan(x), float("-inf"), x)
    if not torch.compiler.is_compiling():
        return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]
    return _order_desc_fused(x, k)


def _order_desc_fused(x: Tensor, k: int) -> Tensor:
    """:func:`order_desc` of a NaN-free ``x`` by counting ranks."""
    pos = torch.arange(x.shape[-1], device=x.device)  # [M]
    xi, xj = x[..., :, None], x[..., None, :]  # entry i against entry j
    before = (xj > xi) | ((xj == xi) & (pos[None, :] < pos[:, None]))  # [..., M, M]: j ranks before i
    rank = before.sum(dim=-1)  # [..., M]; a permutation of 0..M-1
    slots = torch.arange(k, device=x.device)  # [k]
    return ((rank[..., None, :] == slots[:, None]) * pos).sum(dim=-1)  # [..., k]


@dataclass(frozen=True)
class Expansion:
    """One step's expansion of a frontier of F nodes into F * topk candidates.

    Candidates are ordered frontier-major: candidate ``f * topk + r`` is the r-th most likely
    child of frontier node f. ``selected`` indexes the ``topk`` best candidates (the new frontier),
    best first.
    """

    tokens: Tensor  # [B, F*K] long
    scores: Tensor  # [B, F*K] float; cumulative log-prob
    parent_slot: Tensor  # [B, F*K] long; index into the expanded frontier
    selected: Tensor  # [B, K] long; index into the candidates


def expand_step(scores: Tensor, logits: Tensor, topk: int) -> Expansion:
    """Expand a frontier with cumulative ``scores [B, F]`` given the drafter's ``logits [B, F, V]`` (or log-probs)."""
    batch, width, _ = logits.shape
    slot = torch.arange(width, device=logits.device).repeat_interleave(topk).expand(batch, width * topk)  # [B, F*K]
    if cycle_ops.applies(logits):  # compiled on CUDA: two kernels (the rest of this function in one pass)
        tokens, cand_scores, selected = cycle_ops.tree_expand(scores, logits, topk)
        return Expansion(tokens=tokens, scores=cand_scores, parent_slot=slot, selected=selected)
    vals, idx = top_k_log_softmax(logits, topk)  # [B, F, K]
    vals = torch.where(torch.isnan(vals), float("-inf"), vals.clamp(max=0.0))  # log p <= 0
    cand_scores = (scores.float()[:, :, None] + vals).reshape(batch, width * topk)  # [B, F*K]
    return Expansion(
        tokens=idx.reshape(batch, width * topk),
        scores=cand_scores,
        parent_slot=slot,
        selected=order_desc(cand_scores, topk),
    )


@dataclass(frozen=True)
class Frontier:
    """The nodes the drafter runs on next (returned by :meth:`TreeBuilder.step`).

    ``parent_slot[b, k]`` is the index, in the previous frontier (0 = the root at step 0), of the
    node that frontier node k descends from: gather the drafter's hidden state with it.
    ``mask[b, k, t * K + j]`` says whether node j of the step-t frontier is frontier node k or
    one of its ancestors (steps 0..depth-1 flattened): the drafter's tree attention over the
    frontiers drafted so far. Positions: root position + ``depth``.
    """

    tokens: Tensor  # [B, K] long; token ids (mapped through token_map)
    parent_slot: Tensor  # [B, K] long
    scores: Tensor  # [B, K] float; cumulative log-prob
    mask: Tensor  # [B, K, depth*K] bool
    depth: int  # depth of these nodes in the tree (step + 1)


@dataclass(frozen=True)
class Candidates:
    """Every candidate a :class:`TreeBuilder` drafted, side by side: step by step, within a step frontier-major
    (candidate ``f * topk + r`` of a step is the r-th child of that step's frontier node f)."""

    tokens: Tensor  # [B, M] long; target ids (through token_map)
    scores: Tensor  # [B, M] float; cumulative log-prob
    parents: Tensor  # [B, M] long; the parent's global id: 0 the root, c + 1 candidate c
    depth: Tensor  # [M] long; 1 for the root's children


def _ranked(cand: Candidates, count: int) -> Tensor:
    """Indices ``[B, count]`` of the best candidates, sorted by (depth, rank)."""
    ranked = order_desc(cand.scores, count)  # [B, count]
    key = cand.depth[ranked] * max(count, 1) + torch.arange(count, device=ranked.device)  # [B, count]; distinct
    return ranked.gather(1, order_desc(-key, count))  # ascending key


class TreeBuilder:
    """Builds a :class:`DraftTree` one drafter step at a time.

    Usage (``num_steps`` calls to :meth:`step`; the drafter runs between them)::

        builder = TreeBuilder(root_tokens, topk)                   # root_tokens [B]
        frontier = builder.step(drafter_logits_at_root)            # [B, V] or [B, 1, V]
        for _ in range(num_steps - 1):
            hidden = hidden.gather(1, frontier.parent_slot ...)     # the drafter's own state
            logits = drafter(frontier.tokens, hidden, ...)         # [B, K, V]
            frontier = builder.step(logits)
        tree = builder.finish(num_draft_tokens)

    ``token_map [V_draft]`` maps drafter vocabulary ids to target ids (EAGLE-3's ``d2t``:
    ``arange + d2t``); without it drafter ids are target ids.
    """

    def __init__(self, root_tokens: Tensor, topk: int, token_map: Tensor | None = None) -> None:
        assert topk >= 1, f"topk must be >= 1, got {topk}"
        self.topk = topk
        self._root = root_tokens  # [B]
        self._map = token_map
        self._tokens: list[Tensor] = []  # per step: [B, C_s] candidate tokens
        self._scores: list[Tensor] = []  # per step: [B, C_s]
        self._parents: list[Tensor] = []  # per step: [B, C_s] global id of the parent (0 = root)
        self._depths: list[Tensor] = []  # per step: [C_s] depth of its candidates
        self._frontier_ids = torch.zeros_like(root_tokens)[:, None]  # [B, F] global ids
        self._frontier_scores = torch.zeros(root_tokens.shape[0], 1, device=root_tokens.device)
        self._frontier_mask: Tensor | None = None  # [B, K, s*K]

    @property
    def num_candidates(self) -> int:
        """Candidates produced so far (the root not included)."""
        return sum(t.shape[1] for t in self._tokens)

    def step(self, logits: Tensor) -> Frontier:
        """Expand the current frontier given the drafter's ``logits [B, F, V]`` (``[B, V]`` at the root; log-probs
        do as well: the step normalises each row, :func:`top_k_log_softmax`)."""
        if logits.dim() == 2:
            logits = logits[:, None, :]
        assert logits.shape[:2] == self._frontier_ids.shape, (
            f"logits {tuple(logits.shape)} do not match the frontier {tuple(self._frontier_ids.shape)}"
        )
        assert logits.shape[2] >= self.topk, f"vocab {logits.shape[2]} < topk {self.topk}"
        exp = expand_step(self._frontier_scores, logits, self.topk)
        tokens = exp.tokens if self._map is None else self._map[exp.tokens]  # [B, F*K]
        offset = 1 + self.num_candidates
        self._tokens.append(tokens)
        self._scores.append(exp.scores)
        self._parents.append(self._frontier_ids.gather(1, exp.parent_slot))
        self._depths.append(torch.full((tokens.shape[1],), len(self._depths) + 1, device=tokens.device))
        self._frontier_ids = offset + exp.selected  # [B, K]
        self._frontier_scores = exp.scores.gather(1, exp.selected)  # [B, K]
        parent_slot = exp.parent_slot.gather(1, exp.selected)  # [B, K]
        self._frontier_mask = self._next_frontier_mask(parent_slot)
        return Frontier(
            tokens=tokens.gather(1, exp.selected),
            parent_slot=parent_slot,
            scores=self._frontier_scores,
            mask=self._frontier_mask,
            depth=len(self._depths),
        )

    def _next_frontier_mask(self, parent_slot: Tensor) -> Tensor:
        """Ancestor-or-self mask ``[B, K, (s+1)*K]`` of the new frontier over all frontiers so far."""
        batch, width = parent_slot.shape
        eye = torch.eye(width, dtype=torch.bool, device=parent_slot.device).expand(batch, width, width)
        if self._frontier_mask is None:
            return eye
        old = self._frontier_mask  # [B, K, s*K]
        inherited = old.gather(1, parent_slot[:, :, None].expand(batch, width, old.shape[2]))
        return torch.cat([inherited, eye], dim=2)

    def candidates(self) -> Candidates:
        """Every candidate drafted so far, in the order drafted (what :meth:`finish` keeps the best of)."""
        batch = self._root.shape[0]
        return Candidates(
            tokens=self._cat(self._tokens, self._root.new_zeros(batch, 0)),
            scores=self._cat(self._scores, self._frontier_scores[:, :0]),
            parents=self._cat(self._parents, self._root.new_zeros(batch, 0)),
            depth=self._cat(self._depths, self._root.new_zeros(0)),
        )

    def finish(self, num_draft_tokens: int) -> DraftTree:
        """Keep the root and the best ``num_draft_tokens - 1`` candidates; nodes ordered by (depth, rank)."""
        total = self.num_candidates
        assert 1 <= num_draft_tokens <= total + 1, (
            f"num_draft_tokens {num_draft_tokens} must be in 1..{total + 1} "
            f"(topk {self.topk}, {len(self._depths)} steps)"
        )
        cand = self.candidates()
        keep = _ranked(cand, num_draft_tokens - 1)  # [B, N-1] index into candidates
        batch, device = self._root.shape[0], self._root.device
        node_ids = torch.cat([keep.new_zeros(batch, 1), keep + 1], dim=1)  # [B, N] global ids
        remap = torch.full((batch, total + 1), -1, dtype=torch.long, device=device)
        remap.scatter_(1, node_ids, torch.arange(num_draft_tokens, device=device).expand(batch, -1))
        parents = remap.gather(1, cand.parents.gather(1, keep))  # [B, N-1]; ancestors are always kept
        parents = torch.cat([parents.new_full((batch, 1), -1), parents], dim=1)  # [B, N]
        tokens = torch.cat([self._root[:, None], cand.tokens.gather(1, keep)], dim=1)  # [B, N]
        # Each step's candidates are F*K (frontier slot f, rank r at f*K + r), so candidate c has rank c % K.
        rank = torch.cat([keep.new_zeros(batch, 1), keep % self.topk], dim=1)  # [B, N]
        return make_tree(tokens, parents, max_depth=len(self._depths), rank=rank)

    @staticmethod
    def _cat(parts: list[Tensor], empty: Tensor) -> Tensor:
        """The per-step candidate tensors side by side along the last dim (``empty`` before any step)."""
        return torch.cat(parts, dim=-1) if parts else empty


def tree_attention_mask(prefix_len: Tensor, tree: DraftTree, kv_len: int) -> Tensor:
    """Verify mask ``[B, N, kv_len]`` over a KV cache holding the tree at slots
    ``prefix_len .. prefix_len + N - 1``.

    Slots before ``prefix_len [B]`` are visible to every node, tree slots follow ``tree.mask``,
    everything after the tree is hidden. Fixed shapes, no host sync (CUDA-graph capturable).
    """
    batch, nodes = tree.tokens.shape
    slots = torch.arange(kv_len, device=prefix_len.device)  # [S]
    rel = slots[None, :] - prefix_len[:, None]  # [B, S]; slot index relative to the root
    in_prefix = rel < 0  # [B, S]
    in_tree = (rel >= 0) & (rel < nodes)  # [B, S]
    index = rel.clamp(0, nodes - 1)[:, None, :].expand(batch, nodes, kv_len)  # [B, N, S]
    tree_vis = tree.mask.gather(2, index)  # [B, N, S]
    return in_prefix[:, None, :] | (in_tree[:, None, :] & tree_vis)
