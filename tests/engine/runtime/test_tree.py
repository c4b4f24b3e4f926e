"""engine.tree: building the draft tree (SGLang EAGLE semantics), its masks and positions."""

from __future__ import annotations

import math
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.runtime.tree import (
    DraftTree, TreeBuilder, _order_desc_fused, _top_k_fused, chain_tree, greedy_token, make_tree, order_desc, top_k,
    top_k_log_softmax, tree_attention_mask,
)

Path = tuple[int, ...]


def _logprobs_for(path: Path, row: int, vocab: int, seed: int, ties: bool) -> np.ndarray:
    """The drafter's log-probs after ``path`` in batch row ``row``: a fixed function of the path."""
    rng = np.random.default_rng([seed, row, len(path), *path])
    logits = rng.normal(size=vocab) * 2.0
    if ties:  # coarse values: equal scores and log-probs of exactly 0 happen
        logits = np.round(logits)
        logits[rng.integers(vocab)] = 50.0
    out = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
    return out.astype(np.float32)


def _drive(builder: TreeBuilder, batch: int, steps: int, vocab: int, seed: int, ties: bool):
    """Run ``steps`` builder steps, feeding each frontier node the log-probs of its own path.

    Returns the per-step frontiers and the per-row paths of each step's frontier nodes.
    """
    paths: list[list[Path]] = [[()] for _ in range(batch)]
    frontiers, all_paths = [], []
    for _ in range(steps):
        lp = np.stack([np.stack([_logprobs_for(p, b, vocab, seed, ties) for p in paths[b]]) for b in range(batch)])
        frontier = builder.step(torch.from_numpy(lp))
        slots, toks = frontier.parent_slot.tolist(), frontier.tokens.tolist()
        paths = [[paths[b][s] + (t,) for s, t in zip(slots[b], toks[b])] for b in range(batch)]
        frontiers.append(frontier)
        all_paths.append(paths)
    return frontiers, all_paths


def _reference_tree(row: int, steps: int, topk: int, vocab: int, num_draft: int, seed: int) -> list[Path]:
    """Slow SGLang-style reference: the kept node paths of one row, ordered by (depth, rank)."""
    frontier: list[tuple[Path, np.float32]] = [((), np.float32(0.0))]
    candidates: list[tuple[Path, np.float32]] = []
    for _ in range(steps):
        new = []
        for path, score in frontier:
            lp = _logprobs_for(path, row, vocab, seed, ties=False)
            for tok in sorted(range(vocab), key=lambda t: -lp[t])[:topk]:
                new.append((path + (tok,), np.float32(score + min(lp[tok], np.float32(0.0)))))
        candidates += new
        frontier = sorted(new, key=lambda c: -c[1])[:topk]
    ranked = [c[0] for c in sorted(candidates, key=lambda c: -c[1])[: num_draft - 1]]
    rank = {p: i for i, p in enumerate(ranked)}
    return [()] + sorted(ranked, key=lambda p: (len(p), rank[p]))


def _node_paths(tree: DraftTree, row: int) -> list[Path]:
    parents, tokens = tree.parents[row].tolist(), tree.tokens[row].tolist()
    paths: list[Path] = []
    for i, par in enumerate(parents):
        paths.append(() if par < 0 else paths[par] + (tokens[i],))
    return paths


def _check_tree_invariants(tree: DraftTree, num_nodes: int) -> None:
    """Root at 0, parents before children, depth = parent depth + 1, mask = ancestor-or-self."""
    batch = tree.batch_size
    assert tree.num_nodes == num_nodes
    assert tree.tokens.shape == tree.parents.shape == tree.depth.shape == (batch, num_nodes)
    assert tree.mask.shape == (batch, num_nodes, num_nodes) and tree.mask.dtype == torch.bool
    assert bool((tree.parents[:, 0] == -1).all()) and bool((tree.depth[:, 0] == 0).all())
    assert bool(tree.mask.diagonal(dim1=1, dim2=2).all())
    assert int(tree.depth.max()) <= tree.max_depth
    for b in range(batch):
        parents, depth = tree.parents[b].tolist(), tree.depth[b].tolist()
        for i in range(1, num_nodes):
            assert 0 <= parents[i] < i, (b, i, parents)
            assert depth[i] == depth[parents[i]] + 1
            expected_row = tree.mask[b, parents[i]].clone()
            expected_row[i] = True
            assert torch.equal(tree.mask[b, i], expected_row)
        for i in range(num_nodes):
            ancestors, j = set(), i
            while j >= 0:
                ancestors.add(j)
                j = parents[j]
            assert set(torch.nonzero(tree.mask[b, i]).flatten().tolist()) == ancestors


def _max_nodes(topk: int, steps: int) -> int:
    return 1 + topk + (steps - 1) * topk * topk


tree_shapes = st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 4)).flatmap(
    lambda bks: st.tuples(
        st.just(bks), st.integers(bks[1], 12), st.integers(1, _max_nodes(bks[1], bks[2])), st.integers(0, 10**6)
    )
)


@settings(max_examples=60, deadline=None)
@given(shape=tree_shapes)
def test_builder_matches_sglang_reference(shape) -> None:
    """Kept nodes (as token paths, in (depth, rank) order) equal a slow pure-Python reference."""
    (batch, topk, steps), vocab, num_draft, seed = shape
    root = torch.arange(100, 100 + batch)
    builder = TreeBuilder(root, topk)
    _drive(builder, batch, steps, vocab, seed, ties=False)
    assert builder.num_candidates == _max_nodes(topk, steps) - 1
    tree = builder.finish(num_draft)
    _check_tree_invariants(tree, num_draft)
    assert tree.max_depth == steps
    assert torch.equal(tree.tokens[:, 0], root)
    for b in range(batch):
        assert _node_paths(tree, b) == _reference_tree(b, steps, topk, vocab, num_draft, seed)
        assert tree.rank[b].tolist() == [_sibling_rank(p, b, vocab, seed) for p in _node_paths(tree, b)]


def _sibling_rank(path: Path, row: int, vocab: int, seed: int) -> int:
    """0-based rank of the path's last token among the drafter's choices after its parent path."""
    if not path:
        return 0
    lp = _logprobs_for(path[:-1], row, vocab, seed, ties=False)
    return sorted(range(vocab), key=lambda t: -lp[t]).index(path[-1])


@settings(max_examples=60, deadline=None)
@given(shape=tree_shapes)
def test_builder_with_ties_keeps_ancestors(shape) -> None:
    """Coarse log-probs (ties, log p = 0): every kept node's parent is kept, invariants hold."""
    (batch, topk, steps), vocab, num_draft, seed = shape
    builder = TreeBuilder(torch.zeros(batch, dtype=torch.long), topk)
    _drive(builder, batch, steps, vocab, seed, ties=True)
    _check_tree_invariants(builder.finish(num_draft), num_draft)


@settings(max_examples=40, deadline=None)
@given(shape=tree_shapes)
def test_frontier_parent_slot_and_mask(shape) -> None:
    """Frontier k of step s descends from frontier parent_slot[k] of step s-1; its mask over all
    frontiers so far marks exactly the nodes whose path is a prefix of its own."""
    (batch, topk, steps), vocab, _, seed = shape
    frontiers, all_paths = _drive(TreeBuilder(torch.zeros(batch, dtype=torch.long), topk), batch, steps, vocab, seed, False)
    for s, frontier in enumerate(frontiers):
        assert frontier.depth == s + 1
        assert frontier.tokens.shape == frontier.parent_slot.shape == frontier.scores.shape == (batch, topk)
        assert frontier.mask.shape == (batch, topk, (s + 1) * topk)
        for b in range(batch):
            flat = [p for t in range(s + 1) for p in all_paths[t][b]]
            for k, path in enumerate(all_paths[s][b]):
                expected = [path[: len(q)] == q for q in flat]
                assert frontier.mask[b, k].tolist() == expected
            scores = frontier.scores[b].tolist()
            assert scores == sorted(scores, reverse=True)


def test_worked_example() -> None:
    """topk 2, 2 steps, 4 nodes: root 9 -> a(-0.2), b(-1.8); a -> c(-0.1), d(-2.5); b -> e(-0.05), f(-3.5).
    Ranking a -0.2, c -0.3, b -1.8, e -1.85: tokens [9, a, b, c], parents [-1, 0, 0, 1]."""
    a, b, c, d, e, f = 1, 2, 3, 4, 5, 6

    def lp(vals: dict[int, float]) -> torch.Tensor:
        """Log-probs over 8 tokens: ``vals``, the rest of the mass shared by the others (a distribution, so the
        builder's own normalising leaves it as it is)."""
        rest = (1.0 - sum(math.exp(v) for v in vals.values())) / (8 - len(vals))
        out = torch.full((8,), math.log(rest))
        for tok, v in vals.items():
            out[tok] = v
        return out

    builder = TreeBuilder(torch.tensor([9]), topk=2)
    first = builder.step(lp({a: -0.2, b: -1.8})[None])  # [B, V] at the root
    assert first.tokens.tolist() == [[a, b]] and first.parent_slot.tolist() == [[0, 0]]
    second = builder.step(torch.stack([lp({c: -0.1, d: -2.5}), lp({e: -0.05, f: -3.5})])[None])
    assert second.tokens.tolist() == [[c, e]] and second.parent_slot.tolist() == [[0, 1]]
    torch.testing.assert_close(second.scores, torch.tensor([[-0.3, -1.85]]))
    tree = builder.finish(4)
    assert tree.tokens.tolist() == [[9, a, b, c]]
    assert tree.parents.tolist() == [[-1, 0, 0, 1]]
    assert tree.depth.tolist() == [[0, 1, 1, 2]]
    assert tree.rank.tolist() == [[0, 0, 1, 0]]  # b is the root's second choice
    assert builder.finish(7).tokens.tolist() == [[9, a, b, c, e, d, f]]


def test_logits_are_normalised_per_row() -> None:
    """The builder takes logits: a row shifted by a constant drafts the same, with the same scores, and a score is
    the log-probability (log-softmax), eagerly and in the fused form (one pass and in blocks)."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(2, 3, 700, generator=gen) * 3.0
    shifted = logits + torch.tensor([10.0, -4.0, 0.5])[None, :, None]
    want = torch.log_softmax(logits, -1).topk(4, dim=-1)
    for make in (top_k_log_softmax, lambda x, k: _top_k_fused(x.float(), k, normalise=True),
                 lambda x, k: _top_k_fused(x.float(), k, chunk=64, normalise=True)):
        for x in (logits, shifted):
            values, indices = make(x, 4)
            assert torch.equal(indices, want.indices)
            torch.testing.assert_close(values, want.values, atol=2e-5, rtol=0)
    nan = logits.clone()
    nan[0, 0, 3] = float("nan")
    values, indices = top_k_log_softmax(nan, 4)
    assert 3 not in indices[0, 0].tolist() and torch.isfinite(values).all()  # NaN: probability 0, never picked
    builders = [TreeBuilder(torch.zeros(2, dtype=torch.long), topk=3) for _ in range(2)]
    frontiers = [builders[0].step(logits[:, 0]), builders[1].step(logits[:, 0] + 7.0)]
    assert torch.equal(frontiers[0].tokens, frontiers[1].tokens)
    torch.testing.assert_close(frontiers[0].scores, frontiers[1].scores)


def test_token_map_translates_drafter_ids() -> None:
    """With token_map = reversed ids, the tree holds target ids map[draft id]."""
    vocab = 6
    token_map = torch.arange(vocab).flip(0) + 1000
    logprobs = torch.log_softmax(torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0, -2.0]]), -1)
    builder = TreeBuilder(torch.tensor([7]), topk=2, token_map=token_map)
    frontier = builder.step(logprobs)
    assert frontier.tokens.tolist() == [[1000 + 4, 1000 + 2]]  # draft ids 1, 3
    assert builder.finish(3).tokens.tolist() == [[7, 1004, 1002]]


def test_topk_one_is_the_chain() -> None:
    """topk 1, 3 steps: the builder's tree equals chain_tree of the greedy tokens; mask lower-triangular."""
    gen = torch.Generator().manual_seed(0)
    builder = TreeBuilder(torch.tensor([5, 6]), topk=1)
    picks = []
    for _ in range(3):
        lp = torch.log_softmax(torch.randn(2, 1, 10, generator=gen), -1)
        picks.append(builder.step(lp).tokens)
    tree = builder.finish(4)
    chain = chain_tree(torch.cat([torch.tensor([[5], [6]])] + picks, dim=1))
    for name in ("tokens", "parents", "depth", "mask"):
        assert torch.equal(getattr(tree, name), getattr(chain, name)), name
    assert chain.max_depth == 3
    assert torch.equal(chain.mask[0], torch.ones(4, 4, dtype=torch.bool).tril())
    _check_tree_invariants(chain, 4)


@settings(max_examples=30, deadline=None)
@given(batch=st.integers(1, 4), length=st.integers(1, 9))
def test_chain_tree_invariants(batch: int, length: int) -> None:
    tree = chain_tree(torch.randint(0, 50, (batch, length)))
    _check_tree_invariants(tree, length)
    assert torch.equal(tree.mask, torch.ones(length, length, dtype=torch.bool).tril().expand(batch, -1, -1))
    assert tree.parents[0].tolist() == list(range(-1, length - 1))


def test_make_tree_depth_and_mask() -> None:
    """parents [-1, 0, 0, 1, 3, 2]: depths [0, 1, 1, 2, 3, 2]; node 4's ancestors {0, 1, 3}."""
    tree = make_tree(torch.arange(6)[None], torch.tensor([[-1, 0, 0, 1, 3, 2]]))
    assert tree.depth.tolist() == [[0, 1, 1, 2, 3, 2]]
    assert torch.nonzero(tree.mask[0, 4]).flatten().tolist() == [0, 1, 3, 4]
    assert tree.max_depth == 5  # the static bound N - 1 when none is given
    assert DraftTree(tree.tokens, tree.parents, tree.depth, tree.mask).max_depth == 3  # read from depth


def test_unnormalised_scores_still_keep_ancestors() -> None:
    """Raw logits (positive values) as 'log-probs': clamped to <= 0, so no child outranks its parent."""
    gen = torch.Generator().manual_seed(3)
    builder = TreeBuilder(torch.zeros(4, dtype=torch.long), topk=3)
    width = 1
    for _ in range(4):
        builder.step(torch.rand(4, width, 20, generator=gen) * 5.0 + torch.arange(20.0))
        width = 3
    _check_tree_invariants(builder.finish(20), 20)


def test_finish_rejects_too_many_nodes() -> None:
    builder = TreeBuilder(torch.tensor([0]), topk=2)
    builder.step(torch.log_softmax(torch.randn(1, 5), -1))
    with pytest.raises(AssertionError, match="num_draft_tokens"):
        builder.finish(4)


@settings(max_examples=40, deadline=None)
@given(shape=tree_shapes, data=st.data())
def test_tree_attention_mask_and_positions(shape, data) -> None:
    """Prefix slots visible to all nodes, tree slots equal tree.mask, slots after the tree hidden."""
    (batch, topk, steps), vocab, num_draft, seed = shape
    builder = TreeBuilder(torch.zeros(batch, dtype=torch.long), topk)
    _drive(builder, batch, steps, vocab, seed, ties=False)
    tree = builder.finish(num_draft)
    kv_len = data.draw(st.integers(num_draft, num_draft + 12))
    prefix = torch.tensor([data.draw(st.integers(0, kv_len - num_draft)) for _ in range(batch)])
    mask = tree_attention_mask(prefix, tree, kv_len)
    assert mask.shape == (batch, num_draft, kv_len) and mask.dtype == torch.bool
    for b in range(batch):
        p = int(prefix[b])
        assert bool(mask[b, :, :p].all())
        assert torch.equal(mask[b, :, p : p + num_draft], tree.mask[b])
        assert not bool(mask[b, :, p + num_draft :].any())
    base = prefix + 3
    assert torch.equal(tree.positions(base), base[:, None] + tree.depth)
    assert torch.equal(tree.positions(base)[:, 0], base)


def test_tree_attention_mask_example() -> None:
    """Chain of 3 at slots 2..4 of a 6-slot cache: row i sees slots 0, 1 and 2..2+i."""
    mask = tree_attention_mask(torch.tensor([2]), chain_tree(torch.tensor([[4, 5, 6]])), kv_len=6)
    assert mask[0].int().tolist() == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
    ]


def _stable_desc(values: list[float]) -> list[int]:
    """Indices of ``values`` by a stable descending sort, NaN as -inf (the reference for the rankings)."""
    key = [float("-inf") if v != v else v for v in values]
    return sorted(range(len(values)), key=lambda i: -key[i])


# coarse values: ties, infinities and NaN are common
ranked_values = st.lists(st.sampled_from([0.0, -1.0, 2.5, -2.5, 7.0, float("inf"), float("-inf"), float("nan")])
                         | st.floats(-4, 4, width=32), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(values=ranked_values, data=st.data())
def test_top_k_is_a_stable_descending_sort(values, data) -> None:
    """top_k's indices = a stable descending sort's first k (ties to the lower index, NaN last with -inf);
    its values are the entries at those indices; batched rows rank independently. The eager form and the
    compiled phases' fused form alike, the fused one in blocks of any size (the last one short, or
    holding fewer than k entries)."""
    k = data.draw(st.integers(1, len(values)))
    x = torch.tensor([values, values[::-1]], dtype=torch.float32)
    chunk = data.draw(st.sampled_from([1, 2, 3, 5, 8, 256]))
    for vals, idx in (top_k(x, k), _top_k_fused(x, k, chunk)):
        for row in range(2):
            expected = _stable_desc(x[row].tolist())[:k]
            assert idx[row].tolist() == expected
            torch.testing.assert_close(vals[row], x[row, expected], rtol=0, atol=0, equal_nan=True)


@settings(max_examples=150, deadline=None)
@given(values=ranked_values, data=st.data())
def test_order_desc_is_a_stable_descending_sort(values, data) -> None:
    """order_desc = a stable descending sort's first k, for floats (ties, infinities, NaN) and integers; the
    compiled phases' fused form (NaN-free input) alike."""
    k = data.draw(st.integers(1, len(values)))
    x = torch.tensor([values, values[::-1]], dtype=torch.float32)
    clean = torch.where(torch.isnan(x), float("-inf"), x)
    for row in range(2):
        assert order_desc(x, k)[row].tolist() == _stable_desc(x[row].tolist())[:k]
        assert _order_desc_fused(clean, k)[row].tolist() == _stable_desc(x[row].tolist())[:k]
    ints = torch.tensor([[int(v) if v == v and abs(v) < 1e9 else 3 for v in values]])
    for rank in (order_desc, _order_desc_fused):
        assert rank(ints, k)[0].tolist() == _stable_desc([float(v) for v in ints[0].tolist()])[:k]


def test_top_k_never_takes_a_blocks_padding_or_an_entry_twice() -> None:
    """Every entry wanted, -inf and NaN among them, in blocks of 2 (the last one half padding): the
    exhausted blocks' markers rank below every real entry."""
    x = torch.tensor([[1.0, float("-inf"), float("nan"), 2.0, 3.0]])
    vals, idx = _top_k_fused(x, 5, chunk=2)
    assert idx.tolist() == [[4, 3, 0, 1, 2]]
    torch.testing.assert_close(vals, x[:, [4, 3, 0, 1, 2]], rtol=0, atol=0, equal_nan=True)


def test_compiled_ranking_takes_the_fused_forms(monkeypatch) -> None:
    """Under torch.compile the tree ranks with the fused forms (no topk or sort in the traced graph), eagerly
    with the eager ones; both give the same indices."""
    import torch._dynamo.testing as dt

    calls: list[str] = []
    monkeypatch.setattr("eaglelab.engine.runtime.tree._top_k_eager", lambda *a: calls.append("eager") or _top_k_fused(*a))
    backend = dt.EagerAndRecordGraphs()
    x = torch.randn(2, 3, 50)
    got = torch.compile(lambda t: (top_k(t, 3)[1], order_desc(t[..., 0], 2)), backend=backend, fullgraph=True)(x)
    assert calls == []  # traced: the fused form only
    traced = [str(n.target) for g in backend.graphs for n in g.graph.nodes]
    assert traced and not any("topk" in t or "sort" in t for t in traced)
    assert torch.equal(got[0], top_k(x, 3)[1]) and calls == ["eager"]
    assert torch.equal(got[1], order_desc(x[..., 0], 2))


def test_the_shipped_drafters_vocabulary_is_ranked_in_blocks(monkeypatch) -> None:
    """A 12,288-token draft vocabulary (the shipped drafter's) takes the two-stage top-k: its first ranking is
    over blocks of TOP_K_CHUNK entries, not the whole row (on the H200 one program per row cost ~13 us a draft
    step there, the blocks less); the result is the one-pass result."""
    from eaglelab.engine.runtime import tree

    shapes: list[tuple[int, ...]] = []
    rounds = tree._argmax_rounds
    monkeypatch.setattr(tree, "_argmax_rounds", lambda key, k: shapes.append(tuple(key.shape)) or rounds(key, k))
    x = torch.randn(1, 4, 12288, generator=torch.Generator().manual_seed(0))
    vals, idx = _top_k_fused(x, 4)
    assert shapes[0] == (1, 4, 12288 // tree.TOP_K_CHUNK, tree.TOP_K_CHUNK)
    assert idx.tolist() == _top_k_fused(x, 4, chunk=12288)[1].tolist() == torch.topk(x, 4).indices.tolist()
    torch.testing.assert_close(vals, torch.topk(x, 4).values, rtol=0, atol=0)


def test_greedy_token_is_argmax_eagerly_and_compiled(monkeypatch) -> None:
    """The greedy pick: argmax eagerly; compiled, the fused top-1, in blocks past TOP_K_ONE_PASS entries (a
    49,152-token vocabulary: blocks of TOP_K_CHUNK), the same index on ties (the first of equal maxima), bf16 too."""
    import torch._dynamo.testing as dt

    from eaglelab.engine.runtime import tree

    gen = torch.Generator().manual_seed(2)
    x = torch.round(torch.randn(3, 24, 49152, generator=gen) * 2)  # coarse: many equal maxima
    x[0, 0, 100] = x[0, 0, 40000] = 50.0  # the first of two maxima in different blocks
    shapes: list[tuple[int, ...]] = []
    rounds = tree._argmax_rounds
    monkeypatch.setattr(tree, "_argmax_rounds", lambda key, k: shapes.append(tuple(key.shape)) or rounds(key, k))
    picks = []
    for t in (x, x.bfloat16()):
        shapes.clear()
        got = torch.compile(greedy_token, backend=dt.EagerAndRecordGraphs(), fullgraph=True)(t)
        assert shapes and shapes[0] == (3, 24, 49152 // tree.TOP_K_CHUNK, tree.TOP_K_CHUNK)
        assert torch.equal(got, t.argmax(dim=-1)) and torch.equal(greedy_token(t), t.argmax(dim=-1))
        picks.append(got)
    assert greedy_token(x)[0, 0] == 100
    # a verify hands its logits on in the head's dtype (bf16 on a GPU): the same picks as on their float32 values
    wide = torch.compile(greedy_token, backend=dt.EagerAndRecordGraphs(), fullgraph=True)(x.bfloat16().float())
    assert torch.equal(picks[1], wide) and torch.equal(greedy_token(x.bfloat16()), greedy_token(x.bfloat16().float()))
