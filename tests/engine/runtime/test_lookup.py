"""The prompt-lookup branch (engine/runtime/lookup.py): the lookup against a plain-Python search, the grafted tree's
invariants, greedy acceptance over it against the slow reference walk, and the history a drafter keeps."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.core.kv_cache import KVCache
from eaglelab.engine.errors import ConfigError
from eaglelab.engine.runtime.lookup import branch_or_tree, graft_chain, lookup_chain, record
from eaglelab.engine.runtime.spec_config import MAX_LOOKUP_TOKENS, SpecConfig
from eaglelab.engine.runtime.tree import TreeBuilder, make_tree
from eaglelab.engine.runtime.verification import greedy_accept
from tests.engine.runtime.test_verification import _reference_greedy


def reference_lookup(context: list[int], k: int, max_ngram: int = 4, min_ngram: int = 1) -> list[int]:
    """The longest tail (max_ngram down to min_ngram) that occurred before, its latest occurrence; what followed,
    read on around the repeat (``a b c a b c`` continues ``a b c``); none: the last token again."""
    last = len(context) - 1
    for n in range(min(max_ngram, len(context)), min_ngram - 1, -1):
        tail = context[len(context) - n:]
        for end in range(last - 1, n - 2, -1):  # the occurrence ends at `end` < last
            if context[end - n + 1: end + 1] == tail:
                period = last - end
                return [context[end + 1 + i % period] for i in range(k)]
    return [context[-1]] * k


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=24), min_size=1, max_size=4),
       st.integers(1, 9), st.integers(1, 4), st.integers(0, 6))
def test_lookup_matches_the_plain_python_search(contexts, k, max_ngram, junk):
    """Contexts of a 4-token vocabulary (matches everywhere), padded with junk positions the lookup must ignore."""
    S = max(map(len, contexts)) + junk
    history = torch.full((len(contexts), S), 7)  # 7: never a context token, so reading junk would show
    for b, c in enumerate(contexts):
        history[b, :len(c)] = torch.tensor(c)
    got = lookup_chain(history, torch.tensor([len(c) for c in contexts]), k, max_ngram=max_ngram)
    assert got.tolist() == [reference_lookup(c, k, max_ngram) for c in contexts]
    chain, matched = lookup_chain(history, torch.tensor([len(c) for c in contexts]), k, max_ngram=max_ngram,
                                  with_match=True)
    assert chain.tolist() == got.tolist()
    assert matched.tolist() == [reference_match(c, max_ngram) for c in contexts]


def reference_match(context: list[int], max_ngram: int = 4) -> int:
    """The longest tail of at most ``max_ngram`` tokens that occurred earlier (0: the last token is new)."""
    last = len(context) - 1
    return max((n for n in range(1, min(max_ngram, len(context)) + 1)
                for end in range(n - 1, last) if context[end - n + 1: end + 1] == context[last - n + 1:]), default=0)


def test_lookup_worked_examples():
    history = torch.tensor([[5, 7, 9, 4, 5, 7, 0, 0], [1, 2, 3, 1, 2, 3, 0, 0], [1, 2, 3, 4, 5, 6, 0, 0]])
    got = lookup_chain(history, torch.tensor([6, 6, 6]), 5, max_ngram=2)
    assert got.tolist() == [[9, 4, 5, 7, 9], [1, 2, 3, 1, 2], [6, 6, 6, 6, 6]]


def _expansion(seed: int, batch: int, topk: int, steps: int, vocab: int) -> tuple[TreeBuilder, torch.Generator]:
    """A drafter's expansion over random logits (its builder, and the generator to draw more from)."""
    g = torch.Generator().manual_seed(seed)
    builder = TreeBuilder(torch.randint(0, vocab, (batch,), generator=g), topk)
    builder.step(torch.randn(batch, vocab, generator=g))
    for _ in range(steps - 1):
        builder.step(torch.randn(batch, topk, vocab, generator=g))
    return builder, g


def _drafted_tree(seed: int, batch: int, topk: int, steps: int, nodes: int, vocab: int):
    """A tree as the drafter builds it (random logits), its five tensors."""
    t = _expansion(seed, batch, topk, steps, vocab)[0].finish(nodes)
    return t.tokens, t.parents, t.depth, t.mask, t.rank


@settings(max_examples=120, deadline=None)
@given(seed=st.integers(0, 10**6), batch=st.integers(1, 4), shape=st.sampled_from([(1, 3, 4), (2, 3, 6), (4, 5, 24)]),
       k=st.integers(1, 9), vocab=st.integers(4, 6))
def test_a_grafted_tree_is_a_tree_and_greedy_acceptance_walks_it_as_the_reference(seed, batch, shape, k, vocab):
    topk, steps, nodes = shape
    tokens, parents, depth, mask, rank = _drafted_tree(seed, batch, topk, steps, nodes, vocab)
    chain = torch.randint(0, vocab, (batch, k), generator=torch.Generator().manual_seed(seed + 1))
    t, p, d, m, r = graft_chain(tokens, parents, depth, mask, rank, chain, topk)
    N = nodes + k
    assert t.shape == p.shape == d.shape == r.shape == (batch, N) and m.shape == (batch, N, N)
    assert t[:, :nodes].tolist() == tokens.tolist() and t[:, nodes:].tolist() == chain.tolist()
    assert (r[:, nodes:] == topk).all() and (r[:, :nodes] == rank).all()
    # the same tree as make_tree derives from the parents alone: depth and the ancestor-or-self mask agree
    ref = make_tree(t, p)
    assert (ref.depth == d).all() and (ref.mask == m).all()
    assert (p[:, 1:] < torch.arange(1, N)).all(), "parents come before their children"
    logits = torch.randn(batch, N, vocab, generator=torch.Generator().manual_seed(seed + 2))
    pred = logits.argmax(-1)
    # the chain's tokens the target's picks, a coin's toss each: long accepted chains happen
    agree = torch.rand(batch, k, generator=torch.Generator().manual_seed(seed + 3)) < 0.7
    chain_parents = p[:, nodes:]
    t[:, nodes:] = torch.where(agree, pred.gather(1, chain_parents), t[:, nodes:])
    max_depth = max(steps, k)
    acc = greedy_accept(make_tree(t, p, max_depth=max_depth), logits)
    for b in range(batch):
        want = _reference_greedy(t[b].tolist(), p[b].tolist(), pred[b].tolist(), max_depth)
        assert (acc.accept_len[b].item(), acc.path[b].tolist(), acc.tokens[b].tolist(), acc.bonus[b].item()) == want


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), matched=st.lists(st.integers(0, 4), min_size=1, max_size=4),
       k=st.integers(1, 9), vocab=st.integers(4, 6))
def test_a_row_whose_lookup_found_nothing_verifies_the_drafters_wider_tree(seed, matched, k, vocab):
    """lookup_spill: per row, the tree and its branch where the lookup matched, else the drafter's best 24 + k
    nodes of the same expansion (:meth:`TreeBuilder.finish`), in the same rows; either is a tree, and greedy
    acceptance walks it as the reference."""
    batch, topk, steps, nodes = len(matched), 4, 5, 24
    builder, g = _expansion(seed, batch, topk, steps, vocab)
    t = builder.finish(nodes)
    chain = torch.randint(0, vocab, (batch, k), generator=g)
    grafted = graft_chain(t.tokens, t.parents, t.depth, t.mask, t.rank, chain, topk)
    w = builder.finish(nodes + k)
    wide = (w.tokens, w.parents, w.depth, w.mask, w.rank)
    got = branch_or_tree(grafted, wide, torch.tensor(matched))
    for b, m in enumerate(matched):
        want = grafted if m else wide
        assert all(torch.equal(x[b], y[b]) for x, y in zip(got, want))
    tokens, parents, depth, mask, _ = got
    ref = make_tree(tokens, parents)
    assert (ref.depth == depth).all() and (ref.mask == mask).all()
    logits = torch.randn(batch, nodes + k, vocab, generator=g)
    max_depth = max(steps, k)
    acc = greedy_accept(make_tree(tokens, parents, max_depth=max_depth), logits)
    for b in range(batch):
        want = _reference_greedy(tokens[b].tolist(), parents[b].tolist(), logits[b].argmax(-1).tolist(), max_depth)
        assert (acc.accept_len[b].item(), acc.path[b].tolist(), acc.tokens[b].tolist(), acc.bonus[b].item()) == want


def test_record_writes_only_the_kept_positions_and_copy_row_moves_the_history():
    cache = KVCache(1, 3, 1, 10, 2, dtype=torch.float32, device="cpu", history=True)
    record(cache.tokens, torch.tensor([[0, 1, 2], [4, 5, 6]]), torch.tensor([[7, 8, 9], [1, 2, 3]]),
           torch.tensor([[True, True, False], [True, False, True]]))
    assert cache.tokens[0, :3].tolist() == [7, 8, 0] and cache.tokens[1, 4:7].tolist() == [1, 0, 3]
    cache.copy_row(1, 2)
    assert cache.tokens[2].tolist() == cache.tokens[1].tolist()
    assert KVCache(1, 1, 1, 4, 2, dtype=torch.float32, device="cpu").tokens is None


def test_the_spec_sizes_the_tree_and_refuses_a_lookup_it_cannot_run():
    spec = SpecConfig("eagle3", num_steps=5, topk=4, num_draft_tokens=24, lookup_tokens=8)
    assert (spec.tree_nodes, spec.max_depth, spec.draft_tokens) == (32, 8, 24)
    assert "lookup 8" in spec.tree_label and spec.plain().lookup_tokens == 0
    assert SpecConfig("eagle3", num_steps=5, topk=4, num_draft_tokens=24, lookup_tokens=3).max_depth == 5
    with pytest.raises(ConfigError, match="--lookup-tokens") as err:
        SpecConfig("eagle3", lookup_tokens=MAX_LOOKUP_TOKENS + 1)
    assert err.value.hint and err.value.expected == f"0 (none) .. {MAX_LOOKUP_TOKENS}"
    with pytest.raises(ConfigError, match="--lookup-tokens"):
        SpecConfig("eagle3", lookup_tokens=-1)
    with pytest.raises(ConfigError, match="EAGLE-3"):
        SpecConfig("ngram", num_steps=4, lookup_tokens=4)
    # spilling the branch's rows into the tree needs that many candidates: 5 steps of topk 4 hold 68 (and the root)
    assert SpecConfig("eagle3", num_steps=5, topk=4, num_draft_tokens=24, lookup_tokens=32, lookup_spill=True)
    with pytest.raises(ConfigError, match="--lookup-spill") as err:
        SpecConfig("eagle3", num_steps=2, topk=4, num_draft_tokens=16, lookup_tokens=8, lookup_spill=True)
    assert err.value.expected.startswith("at most 21") and err.value.hint
    with pytest.raises(ConfigError, match="--lookup-spill"):  # a chain has no candidates to spare
        SpecConfig("eagle3", num_steps=3, topk=1, lookup_tokens=4, lookup_spill=True)


def test_the_branch_spills_by_default_wherever_the_expansion_holds_its_rows():
    """lookup_spill None (the default): on where the drafter's expansion holds draft + lookup candidates, off where
    it does not (a chain, a small tree: no error, as an explicit True gives) and without a branch; False never; the
    report's settings say what ran."""
    def spec(steps, topk, n, k, **kw):
        return SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=n, lookup_tokens=k, **kw)

    assert spec(5, 4, 24, 16).spills and spec(4, 4, 12, 8).spills  # the H200 profile's batch-1 and batch-8 trees
    assert spec(4, 4, 24, 29).spills and not spec(4, 4, 24, 30).spills  # 52 and the root hold 24 + 29, not 24 + 30
    assert not spec(2, 4, 16, 8).spills and not spec(3, 1, 4, 4).spills  # too few candidates: the branch alone
    assert not spec(5, 4, 24, 0).spills and not spec(5, 4, 24, 16, lookup_spill=False).spills
    assert spec(5, 4, 24, 16, lookup_spill=True).spills and not spec(5, 4, 24, 0, lookup_spill=True).spills
    assert spec(5, 4, 24, 16).tree_label == "5 steps, topk 4, 24 draft tokens, lookup 16, spilling"
    assert spec(2, 4, 16, 8).tree_label == "2 steps, topk 4, 16 draft tokens, lookup 8"
    assert spec(5, 4, 24, 16).to_dict()["lookup_spill"] is True
    assert spec(2, 4, 16, 8).to_dict()["lookup_spill"] is False
    assert not SpecConfig("ngram", num_steps=4).spills


def test_lookup_finds_long_repeats_in_wide_histories():
    """A row of 1,000 positions whose context ends by repeating a 50-token passage: the chain is its continuation."""
    rng = np.random.default_rng(0)
    passage = rng.integers(100, 200, size=60).tolist()
    context = rng.integers(0, 100, size=500).tolist() + passage + rng.integers(0, 100, size=300).tolist() + passage[:50]
    history = torch.zeros(1, 1000, dtype=torch.long)
    history[0, :len(context)] = torch.tensor(context)
    assert lookup_chain(history, torch.tensor([len(context)]), 8).tolist() == [passage[50:58]]


def test_the_ngram_drafter_proposes_what_the_lookup_finds_on_each_rows_context():
    """The n-gram drafter runs the same search on its host history (prompt, then the tokens emitted so far):
    chains as the plain-Python reference gives, a loop continued around its repeat."""
    from eaglelab.engine.runtime.contracts import DraftView
    from eaglelab.engine.runtime.drafters import NgramDrafter

    prompts = [[5, 6, 7, 5, 6], [1, 2, 3]]
    drafter = NgramDrafter(SpecConfig("ngram", num_steps=4))
    out = torch.tensor([[7, 5, 0], [9, 0, 0]])

    def view(n_out):
        rows = range(len(prompts))
        root = torch.tensor([out[b, n_out[b] - 1].item() for b in rows])
        return DraftView(root, torch.tensor([len(p) + n for p, n in zip(prompts, n_out)]), out,
                         torch.tensor(n_out), prompts, 16)

    first = view([1, 1])
    drafter.begin(first, None, None, None)
    assert drafter.propose(first, None).tokens.tolist() == [
        [7] + reference_lookup(prompts[0] + [7], 4), [9] + reference_lookup(prompts[1] + [9], 4)]
    later = view([2, 1])  # row 0 emitted one more token, row 1 none
    assert drafter.propose(later, None).tokens[0].tolist() == [5] + reference_lookup(prompts[0] + [7, 5], 4)
    assert reference_lookup(prompts[0] + [7], 4) == [5, 6, 7, 5]  # around the repeat, not the last token again
