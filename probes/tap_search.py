"""Which target layers was a drafter trained on? Found from the drafter's own behaviour, without its data.

An EAGLE-3 drafter fed the states it was trained on predicts the target's next token better than
one fed other layers. So: run the target once over a set of texts (every HF hidden state
``hs[0..L]``, and at every position its next-token distribution), then score candidate taps by the
drafter's teacher-forced step-1 prediction::

    at position t: feats = fc(cat(hs[c_0][t], ..., hs[c_n-1][t])), token = x[t+1]
    q_t = drafter(token, feats)                  # over the draft vocabulary; predicts x[t+2]
    p_t = target's distribution after x[t+1]     # restricted to the draft vocabulary
    loss      = mean_t  -sum_v p_t(v) log q_t(v)  # the drafter's own training loss (step 1)
    agreement = mean_t  [ d2t(argmax q_t) == argmax target logits after x[t+1] ]

The search ranks taps by ``loss`` and reports ``agreement`` (how often the drafter's top-1 is the
target's next token, what acceptance sees) beside it. Why not rank by agreement alone: on the
shipped SmolLM2 drafter over 392 response tokens, top-1 agreement does not separate the middle
slot's neighbours (hs[16] 41.8%, hs[13] 41.6%, the trained hs[15] 41.1%: one token in 150), while
the loss, which counts every token's whole distribution, is lowest at exactly the trained taps
(3.718 nats; 3.733 with hs[16], 3.758 with hs[3] in slot 0, 3.891 with hs[26] in slot 2).

The search starts from the config's taps and, slot by slot, tries every tappable state (the
embedding output ``hs[0]`` included) with the other slots held, keeping the best; passes repeat
until one changes nothing, so each slot's scores come from the final taps and give the margin to
the runner-up. ``fc`` is linear, so ``fc(cat(a, b, c)) = W_0 a + W_1 b + W_2 c``: each (slot,
state) projection is computed once and candidates differ by one cached term.

Score texts the target wrote itself (a drafter is trained on the target's own responses): with the
target in memory :func:`target_texts` generates them; a streamed target scores the texts given.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import torch

from eaglelab.engine.formats.conventions import hf_indices_to_ids, tappable_hf_range
from eaglelab.engine.model.eagle3 import Eagle3Network

VERDICT_EXIT: dict[str, int] = {"ok": 0, "mismatch": 1}


@dataclass(frozen=True)
class TargetPass:
    """One target pass over the prompts: all it takes to score any taps."""

    hidden_states: list[torch.Tensor]  # L+1 x [B, T, H]
    input_ids: torch.Tensor  # [B, T] (right-padded)
    lengths: torch.Tensor  # [B]
    next_tokens: torch.Tensor  # [B, T]: the target's argmax at each position
    draft_logprobs: torch.Tensor  # [B, T, V_draft]: the target's log-probs over the draft vocabulary
    starts: torch.Tensor | None = None  # [B]: first position scored (the response); None = all

    @property
    def num_layers(self) -> int:
        return len(self.hidden_states) - 1


def pad_prompts(prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids [B, T] (pad 0) and lengths [B]."""
    lengths = torch.tensor([len(p) for p in prompts])
    ids = torch.zeros(len(prompts), int(lengths.max()), dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, : len(p)] = torch.tensor(list(p))
    return ids, lengths


def restricted_logprobs(logits: torch.Tensor, vocab_ids: torch.Tensor) -> torch.Tensor:
    """Log-softmax of logits [..., V] over the target ids ``vocab_ids`` [V_draft] only."""
    return logits[..., vocab_ids.to(logits.device)].float().log_softmax(-1)


@torch.inference_mode()
def in_memory_pass(model: Any, ids: torch.Tensor, lengths: torch.Tensor, vocab_ids: torch.Tensor,
                   starts: torch.Tensor | None = None) -> TargetPass:
    """A :class:`TargetPass` from an in-memory :class:`Transformer` (causal, right padding harmless);
    ``vocab_ids`` [V_draft] are the draft vocabulary's target ids (the drafter's ``token_map()``)."""
    dev = next(model.parameters()).device
    hs = model.all_hidden_states(ids.to(dev))
    top1, logp = [], []
    for h in hs[-1].split(1):  # a row at a time: [1, T, V] logits
        logits = model.logits(h)
        top1.append(logits.argmax(-1).cpu())
        logp.append(restricted_logprobs(logits, vocab_ids).cpu())
    return TargetPass([h.cpu() for h in hs], ids, lengths, torch.cat(top1), torch.cat(logp), starts)


def target_texts(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Prompt + the target's own greedy response for each prompt: ids [B, T] (right-padded),
    lengths [B], and where each response starts [B] (scoring starts there)."""
    from eaglelab.engine.runtime.generate import Engine

    out = Engine(model).generate([list(p) for p in prompts], max_new_tokens).tokens
    ids, lengths = pad_prompts([list(p) + o for p, o in zip(prompts, out)])
    return ids, lengths, torch.tensor([len(p) for p in prompts])


@dataclass(frozen=True)
class TapScore:
    """How a drafter does with one set of taps (lower ``loss`` is better)."""

    loss: float  # mean cross-entropy of the drafter against the target (nats)
    agreement: float  # share of positions where the drafter's top-1 is the target's next token


class AgreementScorer:
    """Teacher-forced top-1 agreement of ``drafter`` with the target, for any taps (memoised)."""

    def __init__(self, drafter: Eagle3Network, tp: TargetPass) -> None:
        self.drafter, self.tp = drafter, tp
        self.n = drafter.config.num_aux
        self.width = drafter.config.target_hidden_size
        p = next(drafter.parameters())
        self.device, self.dtype = p.device, p.dtype
        T = tp.input_ids.shape[1]
        self.tokens = tp.input_ids[:, 1:].to(self.device)  # [B, T-1]: x_{t+1}
        self.positions = torch.arange(T - 1, device=self.device).expand_as(self.tokens)
        self.want = tp.next_tokens[:, 1:].to(self.device)  # [B, T-1]: the target's choice after x_{t+1}
        t = torch.arange(T - 1)[None, :]
        valid = t + 1 < tp.lengths[:, None]  # [B, T-1]: the target's choice after x_{t+1} is known
        if tp.starts is not None:  # and the predicted token x_{t+2} lies in the scored part
            valid &= t + 2 >= tp.starts[:, None]
        self.valid = valid.to(self.device)
        self.target_p = tp.draft_logprobs[:, 1:].to(self.device)[self.valid].exp()  # [N, V_draft]
        self._proj: dict[tuple[int, int], torch.Tensor] = {}
        self._scores: dict[tuple[int, ...], TapScore] = {}
        self._map = drafter.token_map()

    @property
    def tokens_scored(self) -> int:
        return int(self.valid.sum())

    def _projection(self, slot: int, state: int) -> torch.Tensor:
        """fc's slot block applied to hs[state]: [B, T-1, H_draft]."""
        key = (slot, state)
        if key not in self._proj:
            w = self.drafter.fc.weight[:, slot * self.width:(slot + 1) * self.width]  # [H_d, H_t]
            h = self.tp.hidden_states[state][:, :-1].to(self.device, self.dtype)  # [B, T-1, H_t]
            self._proj[key] = torch.nn.functional.linear(h, w)
        return self._proj[key]

    @torch.inference_mode()
    def __call__(self, taps: tuple[int, ...]) -> TapScore:
        assert len(taps) == self.n, f"{len(taps)} taps for a drafter of {self.n} aux slots"
        if taps not in self._scores:
            feats = sum(self._projection(s, c) for s, c in enumerate(taps))  # [B, T-1, H_d]
            net = self.drafter
            embeds = net.embed(self.tokens).to(feats.dtype)  # [B, T-1, H_d]
            cos, sin = net.rotary(self.positions, feats.dtype)
            hidden = net.midlayer(embeds, feats, cos, sin, None, None, None)[self.valid]  # [N, H_d]: scored rows only
            logq = net.lm_head(net.norm(hidden)).float().log_softmax(-1)  # [N, V_draft]
            loss = -(self.target_p * logq).sum(-1).mean()
            hits = self._map[logq.argmax(-1)] == self.want[self.valid]
            self._scores[taps] = TapScore(float(loss), float(hits.float().mean()))
        return self._scores[taps]


@dataclass(frozen=True)
class SlotResult:
    """One aux slot after the search: its best state, the runner-up, and what the config taps."""

    slot: int
    best_hf_index: int
    loss: float
    agreement: float
    runner_up_hf_index: int | None
    runner_up_loss: float | None
    runner_up_agreement: float | None
    config_hf_index: int | None

    @property
    def margin(self) -> float | None:
        """The runner-up's loss minus the best's (nats, > 0)."""
        return None if self.runner_up_loss is None else self.runner_up_loss - self.loss


@dataclass(frozen=True)
class SearchResult:
    """Best taps found from the start taps, each slot's scores in the final pass, the cost."""

    start: tuple[int, ...]
    best: tuple[int, ...]
    score: TapScore
    slot_scores: tuple[dict[int, TapScore], ...]
    passes: int
    evaluations: int


def search_taps(score: Callable[[tuple[int, ...]], TapScore], start: Sequence[int], candidates: Sequence[int],
                max_passes: int = 4, progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Coordinate descent on the loss over slots from ``start``: each slot tries every candidate with
    the others held. A candidate replaces the current state only when its loss is strictly lower, so
    ties keep the start. Stops after a pass that changes nothing (or ``max_passes``).

    Example: start (3, 16, 28), trained (2, 15, 27): pass 1 moves slot 0 to 2, slot 1 to 15, slot 2
    to 27; pass 2 changes nothing -> best (2, 15, 27), 2 passes. ``progress(pass, slot)`` is called
    after each slot.
    """
    taps = list(start)
    seen: set[tuple[int, ...]] = set()
    per_slot: list[dict[int, TapScore]] = []
    passes = 0
    for passes in range(1, max_passes + 1):
        changed, per_slot = False, []
        for s in range(len(taps)):
            scores = {}
            for c in candidates:
                trial = tuple(taps[:s] + [c] + taps[s + 1:])
                scores[c] = score(trial)
                seen.add(trial)
            best = min(scores, key=lambda c: scores[c].loss)
            if scores[best].loss < scores[taps[s]].loss:
                taps[s], changed = best, True
            per_slot.append(scores)
            if progress is not None:
                progress(passes, s)
        if not changed:
            break
    final = tuple(taps)
    return SearchResult(tuple(start), final, score(final), tuple(per_slot), passes, len(seen))


@dataclass(frozen=True)
class TapSearchReport:
    """The verdict without training data. ``verdict``: "ok" | "mismatch"."""

    verdict: str
    conclusion: str
    serving: str
    config_ids: tuple[int, ...] | None
    config_hf_indices: tuple[int, ...]  # what the serving engine taps with the config
    config_score: TapScore | None  # None when the config's tap count does not fit the drafter
    best_hf_indices: tuple[int, ...]
    best_score: TapScore
    slots: tuple[SlotResult, ...]
    expected_ids: dict[str, list[int]]  # the best taps (in layer order) in each convention
    fix: dict[str, Any] | None  # {"file", "field", "current", "new"}: the serving engine's field
    texts: int
    tokens: int
    passes: int
    evaluations: int

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["exit_code"] = self.exit_code
        for s, slot in zip(d["slots"], self.slots):
            s["margin"] = slot.margin
        return d


def start_taps(config_hf: Sequence[int], n: int, num_layers: int) -> tuple[int, ...]:
    """Where the search starts: the config's taps when they are ``n``; else the first ``n`` of them,
    filled up from the engines' defaults (2, L//2, L-3) when there are fewer."""
    from eaglelab.engine.formats.conventions import default_hf_indices

    taps = [i for i in config_hf if i in tappable_hf_range(num_layers)][:n]
    for d in default_hf_indices(num_layers):
        if len(taps) >= n:
            break
        taps.append(d)
    return tuple(taps[:n])


def verdict_from_search(
    scorer: AgreementScorer, *, serving: str, config_ids: tuple[int, ...] | None, config_hf: tuple[int, ...],
    fix_file: str, fix_field: str, fix_current: Any, texts: int, min_gain: float = 0.01,
    progress: Callable[[int, int], None] | None = None,
) -> TapSearchReport:
    """Search from the config's taps and judge them: wrong when the engine taps a different number of
    states than the drafter takes, or when the best taps' loss is more than ``min_gain`` nats lower."""
    L, n = scorer.tp.num_layers, scorer.n
    result = search_taps(scorer, start_taps(config_hf, n, L), list(tappable_hf_range(L)), progress=progress)
    config_score = scorer(tuple(config_hf)) if len(config_hf) == n else None
    slots = tuple(_slot_result(s, scores, result.best[s], config_hf) for s, scores in enumerate(result.slot_scores))
    conv = "sglang" if serving == "sglang" else "vllm"
    expected = {"sglang": list(hf_indices_to_ids(sorted(result.best), "sglang")),
                "vllm": list(hf_indices_to_ids(sorted(result.best), "vllm"))}
    wrong = config_score is None or (tuple(config_hf) != result.best and config_score.loss - result.score.loss > min_gain)
    fix = {"file": fix_file, "field": fix_field, "current": fix_current, "new": expected[conv]} if wrong else None
    text = _conclusion(wrong, config_hf, config_score, result, expected, n, min_gain)
    return TapSearchReport("mismatch" if wrong else "ok", text, serving, config_ids, tuple(config_hf), config_score,
                           result.best, result.score, slots, expected, fix, texts, scorer.tokens_scored,
                           result.passes, result.evaluations)


def _slot_result(slot: int, scores: dict[int, TapScore], best: int, config_hf: Sequence[int]) -> SlotResult:
    others = sorted((v.loss, c) for c, v in scores.items() if c != best)
    ru = others[0][1] if others else None
    return SlotResult(slot, best, scores[best].loss, scores[best].agreement, ru,
                      scores[ru].loss if ru is not None else None, scores[ru].agreement if ru is not None else None,
                      config_hf[slot] if slot < len(config_hf) else None)


def _conclusion(wrong: bool, config_hf: Sequence[int], config_score: TapScore | None, r: SearchResult,
                expected: dict[str, list[int]], n: int, min_gain: float) -> str:
    best = (f"hs{list(r.best)} (loss {r.score.loss:.3f}, agreement {r.score.agreement:.1%}; SGLang ids "
            f"{expected['sglang']}, vLLM ids {expected['vllm']})")
    if config_score is None:
        return (f"the engine taps {len(config_hf)} states (hs{list(config_hf)}) but the drafter's fc takes {n}: "
                f"the drafter behaves as trained on {best}")
    cfg = f"hs{list(config_hf)} (loss {config_score.loss:.3f}, agreement {config_score.agreement:.1%})"
    if not wrong:
        if tuple(config_hf) == r.best:
            return f"wiring right: the config's taps are the best the drafter's behaviour finds, {best}"
        return f"the config's taps {cfg} are within {min_gain} nats of the best found, {best}: not distinguishable on these texts"
    return f"wiring wrong: the config's taps {cfg}; the drafter behaves as trained on {best}"


# ======================================================================================================
# the check, end to end
# ======================================================================================================


def drafter_for_search(draft_dir: str | Any, embed: Any, target_hidden: int) -> tuple[Any, Eagle3Network]:
    """The checkpoint and its drafter network on the target's embedding, whatever its config's ids say
    (a config naming the wrong number of ids is what the search judges, so it must still load)."""
    from eaglelab.engine.errors import CheckpointError
    from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint
    from eaglelab.engine.formats.drafter_loader import config_from_checkpoint, load_drafter_weights

    ck = read_draft_checkpoint(draft_dir)
    if not ck.has_weights:
        raise CheckpointError("no weights (*.safetensors) in the drafter directory", file=ck.path,
                              hint="the search runs the drafter: it needs its weights")
    net = Eagle3Network(config_from_checkpoint(ck, target_hidden), embed).float()
    load_drafter_weights(net, ck)
    net = net.to(device=embed.weight.device, dtype=embed.weight.dtype).eval()
    net.d2t = net.d2t.long()
    net.reset_buffers()
    return ck, net


def config_taps(ck: Any, serving: str, num_layers: int, family: str) -> tuple[tuple[int, ...] | None, tuple[int, ...], str, Any]:
    """(ids the engine reads, the HF indices it taps with them, the field to fix, its current value)."""
    from eaglelab.engine.formats.conventions import IDS_FIELD_TOP, IDS_FIELDS_READ, engine_taps, ids_for_engine

    ids, _ = ids_for_engine(dict(ck.raw_config), serving)  # type: ignore[arg-type]
    taps = engine_taps(serving, ids, num_layers, family=family)  # type: ignore[arg-type]
    field = IDS_FIELDS_READ[serving][0]  # the field the engine reads first decides alone
    raw = dict(ck.raw_config)
    current = raw.get(IDS_FIELD_TOP) if field == IDS_FIELD_TOP else (raw.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    return ids, tuple(taps.hf_indices), field, current


def default_texts(tokenizer: Any, count: int) -> list[list[int]]:
    """``count`` built-in prompts (topic x template requests, spread over the pool), chat-formatted."""
    from eaglelab.engine.training.train_prompts import self_instruct_prompts

    pool = self_instruct_prompts()
    step = max(1, len(pool) // count)
    return [tokenizer.chat_ids(p) for p in pool[::step][:count]]
