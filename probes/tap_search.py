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
target's next token, what acceptance sees) beside it. Why not rank by agreement alone: it moves little
between neighbouring states and need not favour the trained one. In the recorded search on
SmolLM2-135M with its shipped drafter (``benchmarks/results/cpu_2026-12-03/check_wiring_search/off.json``,
392 scored tokens), slot 2's runner-up hs[26] agrees more often than the trained hs[27] (65.1% against
64.3%), while the loss, which counts every token's whole distribution, is lowest at exactly the trained
taps hs[2, 15, 27] in every slot (2.318 nats; runners-up hs[1] 2.358, hs[14] 2.347, hs[26] 2.395).

The search starts from the config's taps and, slot by slot, tries every tappable state (the
embedding output ``hs[0]`` included) with the other slots held, keeping the best; passes repeat
until one changes nothing, so each slot's scores come from the final taps and give the margin to
the runner-up. ``fc`` is linear, so ``fc(cat(a, b, c)) = W_0 a + W_1 b + W_2 c``: each (slot,
state) projection is computed once and candidates differ by one cached term.

Score texts the target wrote itself (a drafter is trained on the target's own responses): with the
target in memory :func:`target_texts` generates them; a streamed target scores the texts given.

A verdict is only as good as the texts. Two taps are *separated* when the loss difference holds across
texts: the per-text mean losses of the two taps, paired, give a t statistic (mean difference over its
standard error across texts; tokens of one text are not independent, texts are). The search says
"ok" only when every slot's config tap beats every other candidate with t >= 3 over at least 6 texts,
"mismatch" only when the best taps found beat the config's by more than 0.01 nats with t >= 6 (a higher
bar: the best is selected among all candidates, see ``T_WRONG``), and "inconclusive" otherwise, with
the reason. On SmolLM2-135M with the shipped drafter, 8 default prompts x 48 response tokens (392
scored tokens) separate every slot (weakest: slot 1, hs[15] against hs[14], t = 4.5) and call the
off-by-one config hs[3, 16, 28] wrong (loss 2.667 against 2.318); 2 prompts x 12 tokens decide nothing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import torch

from eaglelab.engine.formats.conventions import hf_indices_to_ids, tappable_hf_range
from eaglelab.engine.model.eagle3 import Eagle3Network
from eaglelab.probes.wiring import EXIT_CODES

VERDICT_EXIT: dict[str, int] = {v: EXIT_CODES[v] for v in ("ok", "mismatch", "inconclusive")}
MIN_TEXTS = 6  # fewer texts with scored tokens than this: no confident verdict either way
T_SEPARATED = 3.0  # paired t over texts at which the config's tap beats another candidate ("ok")
# "mismatch": the best found beats the config's taps by this t. Twice T_SEPARATED, because the best is the
# minimum over every candidate of every slot: selecting the minimum of many noisy scores inflates its t even when
# no tap is truly better than another, so a t that separates two given taps is not enough against a selected one.
T_WRONG = 6.0


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
        self.rows = torch.arange(len(valid))[:, None].expand_as(valid)[valid].to(self.device)  # [N]: text of each scored token
        self.counts = torch.bincount(self.rows, minlength=len(valid)).float()  # [B]
        self.target_p = tp.draft_logprobs[:, 1:].to(self.device)[self.valid].exp()  # [N, V_draft]
        self._proj: dict[tuple[int, int], torch.Tensor] = {}
        self._scores: dict[tuple[int, ...], TapScore] = {}
        self._per_text: dict[tuple[int, ...], torch.Tensor] = {}
        self._map = drafter.token_map()

    @property
    def tokens_scored(self) -> int:
        return int(self.valid.sum())

    @property
    def texts_scored(self) -> int:
        """Texts with at least one scored token."""
        return int((self.counts > 0).sum())

    def per_text(self, taps: tuple[int, ...]) -> torch.Tensor:
        """Mean loss of each text with scored tokens under ``taps``: [texts_scored]."""
        self(taps)
        return self._per_text[taps]

    def _projection(self, slot: int, state: int) -> torch.Tensor:
        """fc's slot block applied to hs[state] (EAGLE-3.1's ``fc_norm``: the slot's norm first): [B, T-1, H_draft]."""
        key = (slot, state)
        if key not in self._proj:
            w = self.drafter.fc.weight[:, slot * self.width:(slot + 1) * self.width]  # [H_d, H_t]
            h = self.tp.hidden_states[state][:, :-1].to(self.device, self.dtype)  # [B, T-1, H_t]
            if self.drafter.fc_norm is not None:
                h = self.drafter.fc_norm[slot](h)
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
            token_loss = -(self.target_p * logq).sum(-1)  # [N]
            hits = self._map[logq.argmax(-1)] == self.want[self.valid]
            self._scores[taps] = TapScore(float(token_loss.mean()), float(hits.float().mean()))
            sums = torch.zeros_like(self.counts).index_add_(0, self.rows, token_loss)
            self._per_text[taps] = (sums / self.counts.clamp(min=1))[self.counts > 0].cpu()
        return self._scores[taps]


def paired_t(better: torch.Tensor, worse: torch.Tensor) -> float:
    """t of the per-text loss differences ``worse - better`` [B]: their mean over its standard error.
    0 for fewer than 2 texts; inf when every text differs by the same positive amount.

    Example: differences (0.05, 0.03, 0.04, 0.04): mean 0.04, sd 0.0082, se 0.0041 -> t = 9.8.
    """
    d = (worse - better).double()
    if d.numel() < 2:
        return 0.0
    mean, sd = float(d.mean()), float(d.std())
    if sd == 0.0:
        return float("inf") if mean > 0 else 0.0
    return mean / (sd / d.numel() ** 0.5)


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
    contender_hf_index: int | None = None  # the candidate least separated from the best (lowest t)
    contender_t: float | None = None  # its paired t over texts (>= T_SEPARATED: separated)

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
    """The verdict without training data. ``verdict``: "ok" | "mismatch" | "inconclusive" (the texts
    do not separate the candidates; ``conclusion`` says which and why)."""

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
    min_texts: int = MIN_TEXTS
    t_separated: float = T_SEPARATED
    t_wrong: float = T_WRONG

    @property
    def exit_code(self) -> int:
        return VERDICT_EXIT[self.verdict]

    def to_json(self) -> dict[str, Any]:
        """JSON-ready; an infinite t (every text differs by the same amount) reads null."""
        d = asdict(self)
        d["exit_code"] = self.exit_code
        for s, slot in zip(d["slots"], self.slots):
            s["margin"] = slot.margin
            if s["contender_t"] is not None and s["contender_t"] == float("inf"):
                s["contender_t"] = None
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
    min_texts: int = MIN_TEXTS, t_separated: float = T_SEPARATED, t_wrong: float = T_WRONG, progress: Callable[[int, int], None] | None = None,
) -> TapSearchReport:
    """Search from the config's taps and judge them. Wrong when the engine taps a different number of
    states than the drafter takes, or when the best taps' loss is more than ``min_gain`` nats lower,
    consistently across texts (paired t >= ``t_wrong`` over >= ``min_texts`` texts). Right when the
    config's taps are the best and each slot's tap beats every other candidate with t >= ``t_separated``.
    Inconclusive otherwise, with the reason."""
    L, n = scorer.tp.num_layers, scorer.n
    result = search_taps(scorer, start_taps(config_hf, n, L), list(tappable_hf_range(L)), progress=progress)
    config_score = scorer(tuple(config_hf)) if len(config_hf) == n else None
    slots = tuple(_slot_result(scorer, s, scores, result.best, config_hf) for s, scores in enumerate(result.slot_scores))
    conv = "sglang" if serving == "sglang" else "vllm"
    expected = {"sglang": list(hf_indices_to_ids(sorted(result.best), "sglang")),
                "vllm": list(hf_indices_to_ids(sorted(result.best), "vllm"))}
    verdict, why = _judge(scorer, tuple(config_hf), config_score, result, slots, min_gain, min_texts, t_separated, t_wrong)
    fix = {"file": fix_file, "field": fix_field, "current": fix_current, "new": expected[conv]} if verdict == "mismatch" else None
    text = _conclusion(verdict, why, config_hf, config_score, result, expected, n)
    return TapSearchReport(verdict, text, serving, config_ids, tuple(config_hf), config_score, result.best, result.score,
                           slots, expected, fix, texts, scorer.tokens_scored, result.passes, result.evaluations,
                           min_texts, t_separated, t_wrong)


def _judge(scorer: AgreementScorer, config_hf: tuple[int, ...], config_score: TapScore | None, r: SearchResult,
           slots: tuple[SlotResult, ...], min_gain: float, min_texts: int, t_separated: float,
           t_wrong: float) -> tuple[str, str]:
    """(verdict, why): why is empty for a confident verdict, else the reason it is inconclusive."""
    if config_score is None:  # the engine feeds the wrong number of states: no texts needed to say so
        return "mismatch", ""
    k = scorer.texts_scored
    few = (f"only {k} text(s) with scored tokens ({scorer.tokens_scored} tokens); at least {min_texts} are "
           f"needed to tell taps apart: pass more --samples / --new-tokens, or --texts") if k < min_texts else ""
    if config_hf != r.best:
        gain = config_score.loss - r.score.loss
        if gain <= min_gain:
            return "inconclusive", (f"the config's taps are within {min_gain} nats of the best found ({gain:.4f}): "
                                    f"not distinguishable on these texts; pass more texts")
        t = paired_t(scorer.per_text(r.best), scorer.per_text(config_hf))
        if few:
            return "inconclusive", few
        if t < t_wrong:
            return "inconclusive", (f"the best taps found beat the config's by {gain:.3f} nats on average, not "
                                    f"consistently enough across texts to call it wrong (paired t {t:.1f} over {k} "
                                    f"texts, {t_wrong:g} needed); pass more texts")
        return "mismatch", ""
    if few:
        return "inconclusive", few
    weak = [s for s in slots if s.contender_t is not None and s.contender_t < t_separated]
    if weak:
        return "inconclusive", "; ".join(
            f"slot {s.slot}: hs[{s.best_hf_index}] is not separated from hs[{s.contender_hf_index}] "
            f"(paired t {s.contender_t:.1f} over {k} texts, {t_separated:g} needed)" for s in weak) + "; pass more texts"
    return "ok", ""


def _slot_result(scorer: AgreementScorer, slot: int, scores: dict[int, TapScore], best: tuple[int, ...],
                 config_hf: Sequence[int]) -> SlotResult:
    b = best[slot]
    others = sorted((v.loss, c) for c, v in scores.items() if c != b)
    ru = others[0][1] if others else None
    base = scorer.per_text(best)
    ts = {c: paired_t(base, scorer.per_text(best[:slot] + (c,) + best[slot + 1:])) for _, c in others}
    contender = min(ts, key=lambda c: ts[c]) if ts else None
    return SlotResult(slot, b, scores[b].loss, scores[b].agreement, ru,
                      scores[ru].loss if ru is not None else None, scores[ru].agreement if ru is not None else None,
                      config_hf[slot] if slot < len(config_hf) else None, contender,
                      ts[contender] if contender is not None else None)


def _conclusion(verdict: str, why: str, config_hf: Sequence[int], config_score: TapScore | None, r: SearchResult,
                expected: dict[str, list[int]], n: int) -> str:
    best = (f"hs{list(r.best)} (loss {r.score.loss:.3f}, agreement {r.score.agreement:.1%}; SGLang ids "
            f"{expected['sglang']}, vLLM ids {expected['vllm']})")
    if config_score is None:
        return (f"the engine taps {len(config_hf)} states (hs{list(config_hf)}) but the drafter's fc takes {n}: "
                f"the drafter behaves as trained on {best}")
    cfg = f"hs{list(config_hf)} (loss {config_score.loss:.3f}, agreement {config_score.agreement:.1%})"
    if verdict == "ok":
        return f"wiring right: the config's taps are the best the drafter's behaviour finds, {best}"
    if verdict == "mismatch":
        return f"wiring wrong: the config's taps {cfg}; the drafter behaves as trained on {best}"
    found = "the config's taps score best" if tuple(config_hf) == r.best else f"the config's taps {cfg}; best found {best}"
    return f"inconclusive: {why} ({found})"


# ======================================================================================================
# the check, end to end
# ======================================================================================================


def drafter_for_search(draft_dir: str | Any, embed: Any, target_hidden: int) -> tuple[Any, Eagle3Network]:
    """The checkpoint and its drafter network on the target's embedding, whatever its config's ids say
    (a config naming the wrong number of ids is what the search judges, so it must still load)."""
    from eaglelab.engine.errors import CheckpointError
    from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint
    from eaglelab.engine.formats.drafter_loader import build_drafter

    ck = read_draft_checkpoint(draft_dir)
    if not ck.has_weights:
        raise CheckpointError("no weights (*.safetensors) in the drafter directory", file=ck.path,
                              hint="the search runs the drafter: it needs its weights")
    net = build_drafter(ck, embed, target_hidden)  # either layout (Llama or MLA), EAGLE-3.1 flags included
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
