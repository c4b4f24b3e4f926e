"""engine.acceptance: greedy acceptance and lossless tree rejection sampling."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.runtime.verification import Acceptance, greedy_accept, rejection_accept, path_ranks
from eaglelab.engine.runtime.sampling import SamplingParams, probs_from_logits, sample
from eaglelab.engine.runtime.tree import DraftTree, TreeBuilder, chain_tree, make_tree, tree_attention_mask

# Upper 0.1% points of the chi-square distribution (scipy.stats.chi2.ppf(0.999, df)).
CHI2_CRIT_0_001 = {4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322, 24: 51.179, 35: 66.619, 48: 84.037, 63: 103.442}


def _random_tree(rng: np.random.Generator, batch: int, nodes: int, vocab: int) -> DraftTree:
    """Random trees (parents[i] < i) with tokens from a tiny vocabulary, so matches are frequent."""
    parents = np.full((batch, nodes), -1)
    for i in range(1, nodes):
        parents[:, i] = rng.integers(0, i, size=batch)
    tokens = rng.integers(0, vocab, size=(batch, nodes))
    return make_tree(torch.from_numpy(tokens), torch.from_numpy(parents))


def _reference_greedy(tokens: list[int], parents: list[int], pred: list[int], max_depth: int):
    """Slow reference for one row: (accept_len, path, committed tokens, bonus)."""
    accepted, depth = [True], [0]
    for i in range(1, len(tokens)):
        p = parents[i]
        accepted.append(accepted[p] and tokens[i] == pred[p])
        depth.append(depth[p] + 1)
    best = max(range(len(tokens)), key=lambda i: (accepted[i], depth[i], -i))
    path, j = [], best
    while j >= 0:
        path.append(j)
        j = parents[j]
    path.reverse()
    committed = [tokens[i] for i in path[1:]] + [pred[best]]
    pad = max_depth + 1
    return len(path), path + [-1] * (pad - len(path)), committed + [-1] * (pad - len(committed)), pred[best]


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), batch=st.integers(1, 5), nodes=st.integers(1, 10), vocab=st.integers(2, 4))
def test_greedy_accept_matches_reference(seed: int, batch: int, nodes: int, vocab: int) -> None:
    rng = np.random.default_rng(seed)
    tree = _random_tree(rng, batch, nodes, vocab)
    logits = torch.from_numpy(rng.normal(size=(batch, nodes, vocab)).astype(np.float32))
    acc = greedy_accept(tree, logits)
    width = tree.max_depth + 1
    assert acc.path.shape == acc.tokens.shape == (batch, width)
    assert bool(((acc.accept_len >= 1) & (acc.accept_len <= width)).all())
    pred = logits.argmax(-1)
    for b in range(batch):
        ref = _reference_greedy(tree.tokens[b].tolist(), tree.parents[b].tolist(), pred[b].tolist(), tree.max_depth)
        got = (int(acc.accept_len[b]), acc.path[b].tolist(), acc.tokens[b].tolist(), int(acc.bonus[b]))
        assert got == ref
        assert int(acc.last_node[b]) == ref[1][ref[0] - 1]


def test_greedy_worked_example() -> None:
    """tokens [9, 4, 7, 5], parents [-1, 0, 0, 1], argmax [4, 5, 1, 8]: path [0, 1, 3], tokens [4, 5, 8]."""
    tree = make_tree(torch.tensor([[9, 4, 7, 5]]), torch.tensor([[-1, 0, 0, 1]]), max_depth=2)
    logits = torch.nn.functional.one_hot(torch.tensor([[4, 5, 1, 8]]), 10).float()
    acc = greedy_accept(tree, logits)
    assert acc.accept_len.tolist() == [3]
    assert acc.path.tolist() == [[0, 1, 3]]
    assert acc.tokens.tolist() == [[4, 5, 8]]
    assert acc.bonus.tolist() == [8]
    assert acc.num_accepted_drafts.tolist() == [2]


def test_greedy_duplicate_children_take_the_first() -> None:
    """Two children with the target's token and no grandchildren: the first (node 1) is taken."""
    tree = make_tree(torch.tensor([[0, 3, 3]]), torch.tensor([[-1, 0, 0]]))
    logits = torch.nn.functional.one_hot(torch.tensor([[3, 1, 2]]), 5).float()
    acc = greedy_accept(tree, logits)
    assert acc.path.tolist() == [[0, 1, -1]] and acc.tokens.tolist() == [[3, 1, -1]]


def _toy_target_logits(table: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """Target whose next token after t is table[t] (a fixed lookup), as logits [B, N, V]."""
    return torch.nn.functional.one_hot(table[tree.tokens], table.numel()).float() * 5.0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), topk=st.integers(1, 3), steps=st.integers(1, 4), hit=st.floats(0.0, 1.0))
def test_greedy_commits_the_true_continuation(seed: int, topk: int, steps: int, hit: float) -> None:
    """A drafter that ranks the true next token first with probability ``hit``: the committed
    tokens are the target's own greedy continuation, as many as the tree holds plus the bonus."""
    vocab, batch = 12, 6
    gen = torch.Generator().manual_seed(seed)
    table = torch.randperm(vocab, generator=gen)  # next token = table[previous token]
    root = torch.randint(0, vocab, (batch,), generator=gen)
    builder, frontier_tokens = TreeBuilder(root, topk), root[:, None]
    for _ in range(steps):
        logits = torch.randn(batch, frontier_tokens.shape[1], vocab, generator=gen)
        lucky = torch.rand(batch, frontier_tokens.shape[1], generator=gen) < hit
        logits.scatter_add_(2, table[frontier_tokens][..., None], (lucky.float() * 10.0)[..., None])
        frontier_tokens = builder.step(torch.log_softmax(logits, -1)).tokens
    tree = builder.finish(min(1 + topk + (steps - 1) * topk * topk, 6))
    acc = greedy_accept(tree, _toy_target_logits(table, tree))
    for b in range(batch):
        truth, tok = [], int(root[b])
        for _ in range(steps + 1):
            tok = int(table[tok])
            truth.append(tok)
        n = int(acc.accept_len[b])
        assert acc.tokens[b, :n].tolist() == truth[:n]
        present = {tuple(p) for p in _paths(tree, b)}
        longest = max(len(p) for p in present if p == tuple(truth[: len(p)]))
        assert n == longest + 1


def _paths(tree: DraftTree, row: int) -> list[list[int]]:
    parents, tokens, out = tree.parents[row].tolist(), tree.tokens[row].tolist(), []
    for i, p in enumerate(parents):
        out.append([] if p < 0 else out[p] + [tokens[i]])
    return out


def test_speculative_greedy_loop_equals_plain_greedy() -> None:
    """A toy loop (random chain drafts, greedy_accept, commit) reproduces plain greedy decoding."""
    vocab = 9
    gen = torch.Generator().manual_seed(7)
    table = torch.randint(0, vocab, (vocab,), generator=gen)
    plain, tok = [], 2
    for _ in range(40):
        tok = int(table[tok])
        plain.append(tok)
    out = [2]
    while len(out) < 41:
        drafts = torch.randint(0, vocab, (1, 3), generator=gen)
        good = torch.rand(1, 3, generator=gen) < 0.7
        cur, true = out[-1], []
        for _ in range(3):
            cur = int(table[cur])
            true.append(cur)
        drafts = torch.where(good, torch.tensor([true]), drafts)
        tree = chain_tree(torch.cat([torch.tensor([[out[-1]]]), drafts], dim=1))
        acc = greedy_accept(tree, _toy_target_logits(table, tree))
        out += acc.tokens[0, : int(acc.accept_len[0])].tolist()
    assert out[1:41] == plain


# ---------------------------------------------------------------- rejection sampling


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson statistic and degrees of freedom over the cells with positive expected count;
    a count in a cell of probability 0 makes the statistic infinite."""
    expected = probs * counts.sum()
    if (counts[probs == 0] > 0).any():
        return math.inf, int((probs > 0).sum()) - 1
    live = probs > 0
    assert expected[live].min() >= 5, "too few trials per cell for the chi-square approximation"
    stat = float(((counts[live] - expected[live]) ** 2 / expected[live]).sum())
    return stat, int(live.sum()) - 1


def _dirichlet_rows(rng: np.random.Generator, rows: int, vocab: int, floor: float = 0.03) -> np.ndarray:
    """Random distributions with every probability >= floor."""
    raw = rng.dirichlet(np.ones(vocab), size=rows)
    return (floor + (1 - floor * vocab) * raw).astype(np.float32)


def _batch_tree(tokens: list[int], parents: list[int], trials: int) -> DraftTree:
    return make_tree(torch.tensor([tokens]).expand(trials, -1), torch.tensor([parents]).expand(trials, -1))


def _first_token_chi2(vocab: int, children: list[int], seed: int, trials: int = 20_000) -> tuple[float, int, Acceptance]:
    rng = np.random.default_rng(seed)
    probs = _dirichlet_rows(rng, 1 + len(children), vocab)
    tree = _batch_tree([0] + children, [-1] + [0] * len(children), trials)
    target = torch.from_numpy(probs)[None].expand(trials, -1, -1)
    acc = rejection_accept(tree, target, torch.Generator().manual_seed(seed))
    counts = np.bincount(acc.tokens[:, 0].numpy(), minlength=vocab)
    stat, df = _chi_square(counts, probs[0].astype(np.float64) / probs[0].sum())
    return stat, df, acc


def test_rejection_first_token_follows_target_depth1() -> None:
    """Depth-1 trees with 2-3 children (one case with a duplicate child), V = 5..8, 20000 trials:
    the first committed token is distributed as target_probs at the root (chi-square, alpha 0.001)."""
    cases = [(5, [1, 3]), (6, [0, 2, 5]), (7, [4, 4, 1]), (8, [7, 6])]
    for seed, (vocab, children) in enumerate(cases):
        stat, df, acc = _first_token_chi2(vocab, children, seed)
        assert stat < CHI2_CRIT_0_001[df], (vocab, children, stat)
        accepted = acc.accept_len == 2
        assert 0.1 < float(accepted.float().mean()) < 0.95  # both branches of the sampler ran
        assert bool((acc.path[accepted, 1] >= 1).all()) and bool((acc.path[~accepted, 1] == -1).all())


def test_rejection_respects_zero_target_probability() -> None:
    """Target with top-k 2: a child outside the top 2 is never accepted, no token outside is drawn."""
    logits = torch.tensor([0.0, 2.0, 1.0, 3.0, -1.0])
    target = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2))  # tokens 3, 1
    tree = _batch_tree([0, 2, 3], [-1, 0, 0], 5000)
    acc = rejection_accept(tree, target.expand(5000, 3, 5), torch.Generator().manual_seed(0))
    first = acc.tokens[:, 0]
    assert bool(((first == 1) | (first == 3)).all())
    assert not bool((acc.path[:, 1] == 1).any())  # node 1 holds token 2, probability 0


def _naive_depth1(tree: DraftTree, target: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A classic bug: accept child c with probability p(c) WITHOUT renormalising after a rejection,
    and draw the bonus from the untouched target distribution. Returns the first token [B]."""
    p = target[:, 0]
    first = sample(p, gen)
    taken = torch.zeros_like(first, dtype=torch.bool)
    for i in range(1, tree.num_nodes):
        tok = tree.tokens[:, i]
        hit = ~taken & (torch.rand(p.shape[0], generator=gen) < p.gather(1, tok[:, None]).squeeze(1))
        first = torch.where(hit, tok, first)
        taken |= hit
    return first


def test_chi_square_detects_a_biased_sampler() -> None:
    """The same harness rejects the naive sampler above (so the tests above can fail)."""
    rng = np.random.default_rng(3)
    probs = _dirichlet_rows(rng, 3, 6)
    tree = _batch_tree([0, 2, 4], [-1, 0, 0], 20_000)
    first = _naive_depth1(tree, torch.from_numpy(probs)[None].expand(20_000, -1, -1), torch.Generator().manual_seed(1))
    stat, df = _chi_square(np.bincount(first.numpy(), minlength=6), probs[0] / probs[0].sum())
    assert stat > CHI2_CRIT_0_001[df]


def _joint_two_tokens(tokens: list[int], parents: list[int], q: np.ndarray, seed: int, trials: int = 20_000) -> np.ndarray:
    """Counts [V, V] of the first two tokens of a sequence generated with one rejection_accept cycle
    on the tree, continued (when only one token was committed) by sampling the target directly.

    The target is a Markov chain: the token after t is distributed as q[t]. So target_probs at a
    node is q[node token], and the true joint law of the first two tokens after the root r is
    q[r, x] * q[x, y].
    """
    vocab = q.shape[0]
    tree = _batch_tree(tokens, parents, trials)
    qt = torch.from_numpy(q)
    gen = torch.Generator().manual_seed(seed)
    acc = rejection_accept(tree, qt[tree.tokens], gen)  # target_probs [B, N, V]
    first = acc.tokens[:, 0]
    continued = sample(qt[first], gen)  # a plain decode step after a 1-token cycle
    second = torch.where(acc.accept_len >= 2, acc.tokens[:, 1], continued)
    return np.bincount((first * vocab + second).numpy(), minlength=vocab * vocab)


def test_rejection_joint_of_two_tokens_depth2_chain() -> None:
    """Chain root 0 -> 1 -> 2 over V = 5 with q[0, 1] and q[1, 2] likely, 20000 trials: the joint
    law of the first two committed tokens is q[0, x] q[x, y] (chi-square over 25 cells)."""
    rng = np.random.default_rng(11)
    q = _dirichlet_rows(rng, 5, 5).astype(np.float64)
    q[0, 1] += 1.0
    q[1, 2] += 1.0
    q /= q.sum(1, keepdims=True)
    counts = _joint_two_tokens([0, 1, 2], [-1, 0, 1], q.astype(np.float32), seed=5)
    stat, df = _chi_square(counts, (q[0][:, None] * q).reshape(-1))
    assert stat < CHI2_CRIT_0_001[df], stat


def test_rejection_joint_of_two_tokens_branching_tree() -> None:
    """Tree 0 -> {1 -> {2, 3}, 4 -> {2}} (V = 5): same joint law q[0, x] q[x, y]."""
    rng = np.random.default_rng(12)
    q = _dirichlet_rows(rng, 5, 5).astype(np.float64)
    q /= q.sum(1, keepdims=True)
    counts = _joint_two_tokens([0, 1, 4, 2, 3, 2], [-1, 0, 0, 1, 1, 2], q.astype(np.float32), seed=6)
    stat, df = _chi_square(counts, (q[0][:, None] * q).reshape(-1))
    assert stat < CHI2_CRIT_0_001[df], stat


def test_rejection_with_one_hot_target_is_greedy() -> None:
    """With the greedy (one-hot) target distribution and distinct sibling tokens (as TreeBuilder
    makes them), rejection sampling commits exactly what greedy acceptance does."""
    gen = torch.Generator().manual_seed(4)
    builder = TreeBuilder(torch.randint(0, 4, (256,), generator=gen), topk=2)
    width = 1
    for _ in range(3):
        builder.step(torch.log_softmax(torch.randn(256, width, 4, generator=gen), -1))
        width = 2
    tree = builder.finish(7)
    logits = torch.randn(256, 7, 4, generator=gen)
    greedy = greedy_accept(tree, logits)
    sampled = rejection_accept(tree, probs_from_logits(logits, SamplingParams()), gen)
    for name in ("accept_len", "path", "tokens", "bonus"):
        assert torch.equal(getattr(greedy, name), getattr(sampled, name)), name
    assert 0.0 < float((greedy.accept_len > 1).float().mean()) < 1.0


# ---------------------------------------------------------------- CUDA: no host sync, graph capture


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tree_and_acceptance_are_sync_free_and_capturable() -> None:
    """Build a tree, its verify mask, and both acceptances on CUDA with host syncs turned into
    errors; then capture the same work in a CUDA graph and check a replay equals the eager run."""
    dev, batch, vocab, topk, steps, nodes, kv_len = torch.device("cuda"), 4, 1000, 4, 3, 8, 64
    gen = torch.Generator(device=dev).manual_seed(0)
    root = torch.randint(0, vocab, (batch,), device=dev, generator=gen)
    prefix = torch.randint(0, kv_len - nodes, (batch,), device=dev, generator=gen)
    draft_lp = [torch.log_softmax(torch.randn(batch, 1 if s == 0 else topk, vocab, device=dev, generator=gen), -1)
                for s in range(steps)]
    target_logits = torch.randn(batch, nodes, vocab, device=dev, generator=gen)
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.9)

    def work(generator: torch.Generator | None):
        builder = TreeBuilder(root, topk)
        for lp in draft_lp:
            builder.step(lp)
        tree = builder.finish(nodes)
        probs = probs_from_logits(target_logits, params)
        return (tree.tokens, tree.parents, tree_attention_mask(prefix, tree, kv_len), tree.positions(prefix),
                greedy_accept(tree, target_logits), rejection_accept(tree, probs, generator), sample(probs, generator))

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = work(gen)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        work(None)  # warm-up outside capture, as CUDA graphs require
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = work(None)  # the default generator is graph-safe
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(eager[:4], captured[:4]):
        assert torch.equal(a, b)
    for name in ("accept_len", "path", "tokens", "bonus"):
        assert torch.equal(getattr(eager[4], name), getattr(captured[4], name)), name
    accept_len = captured[5].accept_len
    assert bool(((accept_len >= 1) & (accept_len <= steps + 1)).all())


def test_path_ranks_give_sibling_ranks_and_whether_the_path_could_go_deeper() -> None:
    """Tree 9 -> 4 (rank 1) -> 5 (rank 1), 9 -> 7 (rank 2). Target argmax per node decides the path:
    [4, 5, 1, 8] accepts 4, 5 (ranks 1, 1; node 5 has no children: closed); [7, ...] accepts 7
    (rank 2, closed); [3, ...] accepts nothing (the root had children: open)."""
    tree = make_tree(torch.tensor([[9, 4, 7, 5]] * 3), torch.tensor([[-1, 0, 0, 1]] * 3), max_depth=2,
                     rank=torch.tensor([[0, 0, 1, 0]] * 3))
    pred = torch.tensor([[4, 5, 1, 8], [7, 0, 0, 0], [3, 0, 0, 0]])
    acc = greedy_accept(tree, torch.nn.functional.one_hot(pred, 10).float())
    ranks, opened = path_ranks(tree, acc)
    assert ranks.tolist() == [[1, 1], [2, 0], [0, 0]]
    assert opened.tolist() == [False, False, True]
