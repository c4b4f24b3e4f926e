"""Drafters behind one interface (:class:`~eaglelab.engine.runtime.contracts.Drafter`): EAGLE-3 and
n-gram (prompt lookup).

A drafter has three calls, driven by :class:`eaglelab.engine.runtime.generate.Engine`, each given a
read-only :class:`~eaglelab.engine.runtime.contracts.DraftView` of the batch:

- ``begin(view, prompt_ids, aux, runner)`` after the target's prefill (EAGLE-3: draft-extend
  over the prompt with the target's aux features);
- ``propose(view, runner) -> DraftTree`` the draft steps;
- ``commit(view, acceptance, verify_aux, runner)`` after acceptance (EAGLE-3: draft-extend over
  the accepted tokens).

``target_taps`` lists the HF ``output_hidden_states`` indices the target must return as aux
features (empty for drafters that need none); ``net`` is the network the runner's ``draft`` runs.
"""

from __future__ import annotations

import torch

from eaglelab.engine.runtime.verification import Acceptance
from eaglelab.engine.runtime.contracts import DraftView, Runner
from eaglelab.engine.model.eagle3 import Eagle3Network
from eaglelab.engine.model.layers import EAGER_KERNELS, prefix_mask
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.engine.runtime.lookup import MAX_NGRAM, MIN_NGRAM, branch_or_tree, graft_chain, lookup_chain, record
from eaglelab.engine.runtime.tree import DraftTree, TreeBuilder, chain_tree


class NgramDrafter:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens
    (n = max_ngram down to min_ngram) and propose the tokens that followed it (:func:`.lookup.lookup_chain`, the
    search an EAGLE-3 tree's lookup branch runs on the device). Needs no training. Keeps each row's history on the
    host (one device->host copy of the new tokens per cycle).
    """

    target_taps: tuple[int, ...] = ()
    net = None  # drafts on the host: no network for the runner

    def __init__(self, spec: SpecConfig, max_ngram: int = MAX_NGRAM, min_ngram: int = MIN_NGRAM) -> None:
        assert spec.topk == 1, "the n-gram drafter drafts chains (topk 1)"
        self.spec, self.max_ngram, self.min_ngram = spec, max_ngram, min_ngram
        self._history: list[list[int]] = []

    def begin(self, st: DraftView, prompt_ids, aux, runner: Runner) -> None:
        self._history = [list(p) for p in st.prompts]
        self._seen = [0] * len(st.prompts)

    def propose(self, st: DraftView, runner: Runner) -> DraftTree:
        n_out = st.n_out.tolist()
        for b, hist in enumerate(self._history):
            if n_out[b] > self._seen[b]:
                hist.extend(st.out[b, self._seen[b]: n_out[b]].tolist())
                self._seen[b] = n_out[b]
        lengths = [len(h) for h in self._history]
        history = torch.zeros(len(lengths), max(lengths), dtype=torch.long)  # [B, S], each row's context
        for b, hist in enumerate(self._history):
            history[b, :lengths[b]] = torch.tensor(hist)
        tokens = lookup_chain(history, torch.tensor(lengths), self.spec.num_steps, self.max_ngram, self.min_ngram)
        return chain_tree(torch.cat([st.root[:, None], tokens.to(st.root.device)], dim=1))  # [B, steps + 1]

    def refill(self, st: DraftView, prompt_ids, aux, runner: Runner, eager: str | None = None) -> None:
        """Rows 0..k-1 hold new requests (k = ``len(prompt_ids)``): each one's history is its prompt."""
        for r in range(prompt_ids.shape[0]):
            self._history[r] = list(st.prompts[r])
            self._seen[r] = 0

    def move_row(self, src: int, dst: int) -> None:
        self._history[dst], self._seen[dst] = list(self._history[src]), self._seen[src]

    def keep_rows(self, k: int) -> None:
        del self._history[k:], self._seen[k:]

    def commit(self, st: DraftView, acc: Acceptance, aux, runner: Runner) -> None:
        pass


class Eagle3Drafter:
    """Drives an :class:`Eagle3Network`: its KV cache, the draft tree, the draft-extend."""

    def __init__(self, net: Eagle3Network, spec: SpecConfig, target_taps: tuple[int, ...]) -> None:
        assert len(target_taps) == net.config.num_aux, (
            f"{len(target_taps)} taps for an fc expecting {net.config.num_aux} aux states"
        )
        self.net, self.spec, self.target_taps = net, spec, tuple(target_taps)
        self._map = net.token_map()
        self.cache = None  # the drafter's KV cache (the runner's static one under CUDA graphs), from begin()
        self.kernels = EAGER_KERNELS

    # after prefill: extend over the prompt (features of x_p paired with the token x_{p+1})
    def begin(self, st: DraftView, prompt_ids: torch.Tensor, aux: torch.Tensor, runner: Runner) -> None:
        """The draft-extend over the prompt: one phase, captured per batch bucket and prompt width (compiled only
        with ``spec.compile_prefill``), as the target's prefill (the engine pads prompts to the runner's widths)."""
        B = prompt_ids.shape[0]
        cfg = self.net.config
        S = st.cache_len + self.spec.draft_slots  # as the graph runner's static one (draft_cache_len)
        self.cache = runner.make_draft_cache(B, S, cfg.num_kv_heads, cfg.head_dim, self.net.fc.weight.dtype,
                                             history=self.spec.lookup_tokens > 0)
        self.kernels = runner.kernels  # the phases below run with the runner's (maybe compiled) kernels
        self.next_hidden, self.next_logits = self._prompt_phase(prompt_ids, aux, st.lengths, st.root, runner)

    def _prompt_phase(self, prompt_ids, aux, lengths, root, runner: Runner, eager: str | None = None):
        """:meth:`_begin` as the runner's phase for these rows (the first ``len(prompt_ids)`` of the cache)."""
        B, T = prompt_ids.shape
        width, why = runner.prefill_width(B, T, self.cache)
        ins = {"ids": prompt_ids, "aux": aux, "lengths": lengths, "root": root}
        return runner.phase(
            "draft_extend", self._begin, ins, (self.cache,), ("begin", id(self)),
            eager=eager or why or (None if width == T else f"eager: prompt width {T} is not a prefill bucket"),
            compile=self.spec.compile_prefill)

    def refill(self, st: DraftView, prompt_ids: torch.Tensor, aux: torch.Tensor, runner: Runner,
               eager: str | None = None) -> None:
        """The draft-extend over the new prompts of rows 0..k-1 (k = ``len(prompt_ids)``; their cache rows rewritten
        from slot 0), their roots' hidden states and logits written into those rows of the ones the next draft
        reads (in place: they may be runner state a captured cycle binds)."""
        k = prompt_ids.shape[0]
        hidden, logits = self._prompt_phase(prompt_ids, aux, st.lengths[:k], st.root[:k], runner, eager)
        self.next_hidden[:k].copy_(hidden)
        self.next_logits[:k].copy_(logits)

    def move_row(self, src: int, dst: int) -> None:
        """Row ``src``'s drafter cache row and next-root state onto row ``dst``."""
        self.cache.copy_row(src, dst)
        self.next_hidden[dst].copy_(self.next_hidden[src])
        self.next_logits[dst].copy_(self.next_logits[src])

    def keep_rows(self, k: int) -> None:
        """The next root's state of the first ``k`` rows alone (views: a one-graph cycle's runner state stays bound)."""
        self.next_hidden, self.next_logits = self.next_hidden[:k], self.next_logits[:k]

    def _begin(self, ids, aux, lengths, root):
        """Prompt ids [B, T], target aux [B, T, nH], lengths/root [B] -> the root's hidden [B, H], logits."""
        B, T = ids.shape
        nxt = torch.cat([ids[:, 1:], ids[:, :1]], dim=1)  # [B, T]: x_{p+1} beside the features of x_p
        rows = torch.arange(B, device=ids.device)
        nxt[rows, lengths - 1] = root  # the last prompt position pairs with the first new token
        positions = torch.arange(T, device=ids.device).expand(B, T)
        if self.spec.lookup_tokens:  # the prompt is the lookup's first history (its root: the next draft's)
            record(self.cache.tokens, positions, ids, positions < lengths[:, None])
        hidden = self.net.hidden(nxt, self.net.fuse(aux), positions, self.cache, positions,
                                 prefix_mask(positions, self.cache.max_len), self.kernels)  # [B, T, H]
        last = hidden[rows, lengths - 1]  # [B, H]
        return last, self.net.head(last, self.kernels, float32=False)  # [B, H], [B, V_draft] (the draft normalises)

    def propose(self, st: DraftView, runner: Runner) -> DraftTree:
        """Every draft step, top-k and the tree: one phase (one graph per batch bucket)."""
        ins = {"root": st.root, "lengths": st.lengths, "hidden": self.next_hidden, "logits": self.next_logits}
        tokens, parents, depth, mask, rank = runner.phase("draft", self._draft, ins, (self.cache,), (id(self), self.spec))
        return DraftTree(tokens, parents, depth, mask, max_depth=self.spec.max_depth, rank=rank)

    def _draft(self, root, lengths, hidden, logits):
        """root/lengths [B], hidden [B, H] and logits [B, V_draft] at the root -> the tree's tensors."""
        builder = TreeBuilder(root, self.spec.topk, token_map=self._map)
        frontier = builder.step(logits)
        hidden = hidden[:, None]  # [B, 1, H]; the root's features
        K, dev = self.spec.topk, root.device
        B, S = root.shape[0], self.cache.max_len
        for depth in range(1, self.spec.num_steps):
            feats = hidden.gather(1, frontier.parent_slot[..., None].expand(-1, -1, hidden.shape[-1]))
            positions = (lengths + depth - 1)[:, None].expand(B, K)  # [B, K]
            slots = lengths[:, None] + (depth - 1) * K + torch.arange(K, device=dev)  # [B, K]
            mask = _draft_mask(lengths, frontier.mask, S)  # [B, K, S]
            hidden, logits = self.net(frontier.tokens, feats, positions, self.cache, slots, mask, self.kernels,
                                      float32=False)  # the expansion reads them in float32
            frontier = builder.step(logits)  # normalised there, in the top-k's own passes
        tree = builder.finish(self.spec.draft_tokens)
        if not self.spec.lookup_tokens:
            return tree.tokens, tree.parents, tree.depth, tree.mask, tree.rank
        history = self.cache.tokens[:B]
        history[torch.arange(B, device=dev), lengths] = root  # the root joins the history at its position
        chain, matched = lookup_chain(history, lengths + 1, self.spec.lookup_tokens, with_match=True)  # [B, k], [B]
        grafted = graft_chain(tree.tokens, tree.parents, tree.depth, tree.mask, tree.rank, chain, K)
        if not self.spec.spills:
            return grafted
        wide = builder.finish(self.spec.tree_nodes)  # the same rows, all the drafter's
        return branch_or_tree(grafted, (wide.tokens, wide.parents, wide.depth, wide.mask, wide.rank), matched)

    def cycle_parts(self) -> dict:
        """The draft and draft-extend functions, for an engine running a whole cycle as one phase."""
        return {"draft": self._draft, "draft_extend": self._extend}

    def carry(self, runner: Runner, cache) -> dict[str, torch.Tensor]:
        """The next root's hidden state and draft logits (from :meth:`begin`) in ``runner`` state on the
        run's ``cache``: a one-graph cycle writes them in place, and :meth:`propose` reads them there too."""
        state = runner.make_state({"draft_hidden": self.next_hidden, "draft_logits": self.next_logits}, cache)
        self.next_hidden, self.next_logits = state["draft_hidden"], state["draft_logits"]
        return state

    # after acceptance: extend over root, d1..dk (features) paired with d1..dk, bonus (tokens)
    def commit(self, st: DraftView, acc: Acceptance, aux: torch.Tensor, runner: Runner) -> None:
        """The draft-extend over the accepted tokens: one phase (one graph per batch bucket)."""
        ins = {"tokens": acc.tokens, "path": acc.path, "aux": aux, "lengths": st.lengths, "accept_len": acc.accept_len}
        self.next_hidden, self.next_logits = runner.phase("draft_extend", self._extend, ins, (self.cache,), id(self))

    def _extend(self, tokens, path, aux, lengths, accept_len):
        """Accepted tokens/path [B, D+1], verify aux [B, N, nH] -> the next root's hidden [B, H], logits."""
        D1 = path.shape[1]
        feats = self.net.fuse(aux.gather(1, path.clamp(min=0)[..., None].expand(-1, -1, aux.shape[-1])))  # [B, D+1, H]
        positions = lengths[:, None] + torch.arange(D1, device=aux.device)  # [B, D+1]
        if self.spec.lookup_tokens:  # the committed tokens (d1 .. dk, the bonus) follow the root in the history
            record(self.cache.tokens, positions + 1, tokens, positions < (lengths + accept_len)[:, None])
        hidden = self.net.hidden(tokens.clamp(min=0), feats, positions, self.cache, positions,
                                 prefix_mask(positions, self.cache.max_len), self.kernels)  # [B, D+1, H]
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        last = hidden[rows, accept_len - 1]  # [B, H]: only the next root's logits are needed
        return last, self.net.head(last, self.kernels, float32=False)  # [B, H], [B, V_draft]


def _draft_mask(prefix_len: torch.Tensor, frontier_mask: torch.Tensor, kv_len: int) -> torch.Tensor:
    """Drafter attention [B, K, S]: committed slots < prefix_len, plus the frontier's ancestors,
    which sit at slots prefix_len + j for j < frontier_mask.shape[2] (frontier-major order).
    """
    B, K, M = frontier_mask.shape
    slots = torch.arange(kv_len, device=prefix_len.device)
    rel = slots[None, :] - prefix_len[:, None]  # [B, S]
    in_tree = (rel >= 0) & (rel < M)
    vis = frontier_mask.gather(2, rel.clamp(0, M - 1)[:, None, :].expand(B, K, kv_len))
    return (rel < 0)[:, None, :] | (in_tree[:, None, :] & vis)
