"""Training prompts written by the target itself: its own user turns.

An instruct model given only the chat template's text *before* a user's message (the system turn and
the opening of a user turn, nothing after it) continues it with a request of the kinds it was tuned on,
and closes it with its end-of-turn token. Sampled at temperature ~1 this yields varied, natural requests
in the model's own distribution (the "Magpie" method: Xu et al. 2024, *Magpie: Alignment Data Synthesis
from Scratch by Prompting Aligned LLMs with Nothing*). For a drafter that is the point: the requests a
target expects are the ones its users send, and the answers come later from the same target
(``eaglelab distill``), so prompts and answers are both the target's.

Each generated turn is kept only when it is whole and plausible (:func:`screen`): it ended on the
end-of-turn token (not cut by ``max_new_tokens``), has at least ``min_words`` words, holds no chat-
template markup and is mostly text. Kept turns are deduplicated on :func:`normalise` and screened
against the evaluation sets (:class:`OverlapIndex`) exactly like ``eaglelab prompts``, and written in
its format (``prompts.jsonl.gz`` + ``manifest.json``, source ``target``), so ``distill`` reads them.

Batches are drawn with a generator seeded by (``seed``, batch number): the same settings on the same
device give the same prompts. With several system messages (``systems``: e.g. "You help people with
their writing", "... with mathematics") batch ``b`` is conditioned on message ``b mod n``: the target
then writes the requests it expects in each kind of conversation, a wider spread of tasks than its
default system turn alone draws, and the manifest counts what each message kept. With ``asks`` (e.g.
:data:`ASKS`' code and maths requests) batch ``b`` is instead a user turn asking for a question of that kind, and
the target's answer is the prompt: questions the target itself writes, screened like the rest. The answers
(``distill``) are given under the template's default system turn, as at inference.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from eaglelab.engine.errors import ConfigError, EagleLabError
from eaglelab.engine.training.distill import batch_engine, free_device_memory
from eaglelab.engine.training.prompt_corpus import Corpus, CorpusPrompt, OverlapIndex, normalise

SOURCE = "target"
SENTINEL = "\u2063EAGLELAB-USER-MESSAGE\u2063"  # never in a real template; marks where the user's text goes
REJECTS = ("cut", "short", "markup", "not_text", "duplicate", "overlap")
_MARKUP = re.compile(r"<\|[^|>]{1,40}\|>|<\/?s>|\[/?INST\]|^(user|assistant|system)\s*$", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class SynthSettings:
    """How user turns are sampled and screened."""

    count: int  # prompts to keep
    temperature: float = 1.0
    top_p: float = 0.95
    max_new_tokens: int = 128  # a turn longer than this is cut, and dropped
    batch_size: int = 512  # turns sampled together (one graph of this many rows)
    min_words: int = 4
    seed: int = 0
    time_limit: float | None = None  # seconds for the sampling loop; stop before a batch would overrun it
    max_empty_batches: int = 3  # batches in a row that keep nothing: the target does not write user turns
    cuda_graphs: bool = True
    system: str | None = None  # a system message (default: the chat template's own)
    systems: tuple[str, ...] = ()  # several system messages, one per batch in turn (instead of ``system``)
    asks: tuple[str, ...] = ()  # requests for a question (e.g. ASKS["code"]): the target's answer is the prompt

    def __post_init__(self) -> None:
        self._check()
        if self.asks and (self.systems or self.system is not None):
            raise EagleLabError("asks condition the assistant's turn: give them without system messages",
                                field="asks", found=len(self.asks), hint="drop --system / --systems-file with --ask")
        if any(not a.strip() for a in self.asks):
            raise EagleLabError("an empty request in the asks", field="asks", hint="one request per line")

    def _check(self) -> None:
        for name in ("count", "max_new_tokens", "batch_size", "min_words", "max_empty_batches"):
            if getattr(self, name) < 1:
                raise EagleLabError(f"{name} must be >= 1", field=name, found=getattr(self, name))
        if not self.temperature > 0:
            raise EagleLabError("sampling needs a temperature > 0 (greedy would write one prompt)",
                                field="temperature", found=self.temperature, expected="> 0, e.g. 1.0")
        if not 0 < self.top_p <= 1:
            raise EagleLabError("top_p must be in (0, 1]", field="top_p", found=self.top_p)
        if self.systems and self.system is not None:
            raise EagleLabError("give one system message or a list of them, not both", field="system",
                                found=self.system, hint="put it in the list of system messages")
        if any(not m.strip() for m in self.systems):
            raise EagleLabError("an empty system message in the list", field="systems",
                                hint="leave the list out for the template's own system turn")

    @property
    def conditions(self) -> tuple[str | None, ...]:
        """The system message (or, with ``asks``, the request) of each batch in turn (None: the template's own)."""
        return self.asks or self.systems or (self.system,)


# Requests for questions of a kind the shipped data lacks: the target writes the question (as its answer), never
# taken from an evaluation set; what it writes is screened against MT-bench and HumanEval like every prompt.
ASKS = {
    "code": (
        "Write one question a programmer might ask an assistant about Python. Reply with the question only.",
        "Write a short programming task for a Python function, as a user would ask it. Reply with the task only.",
        "Write one question someone might ask about fixing a bug in their code. Reply with the question only.",
        "Write one request for a small script or program, as a user would ask it. Reply with the request only.",
        "Write one question about a data structure or an algorithm. Reply with the question only.",
    ),
    "maths": (
        "Write one maths word problem a student might ask for help with. Reply with the problem only.",
        "Write one algebra question a user might ask. Reply with the question only.",
        "Write one question about probability or statistics. Reply with the question only.",
        "Write one arithmetic or percentage problem from everyday life. Reply with the problem only.",
        "Write one geometry question a student might ask. Reply with the question only.",
    ),
}


def user_turn_prefix(tokenizer, system: str | None = None) -> list[int]:
    """Token ids of the chat template up to where a user's message starts (with ``system`` as its
    system turn, else the template's own)."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": SENTINEL}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=False)
    if not tokenizer.chat_template or SENTINEL not in text:
        raise ConfigError("the target has no chat template with a user turn", field="chat_template",
                          hint="synthesis samples the user's turn of the chat template; use `eaglelab prompts`")
    ids = tokenizer.encode(text.split(SENTINEL)[0])
    if not ids:
        raise ConfigError("the chat template puts nothing before the user's message", field="chat_template",
                          hint="synthesis needs the template's opening of a user turn to condition on")
    return ids


def screen(text: str, ended: bool, min_words: int) -> str | None:
    """Why a sampled turn is dropped (one of :data:`REJECTS` but the last two), or None to keep it."""
    if not ended:
        return "cut"
    if len(text.split()) < min_words:
        return "short"
    if _MARKUP.search(text):
        return "markup"
    letters = sum(c.isalpha() for c in text)
    if letters < 0.5 * len(text.replace(" ", "").replace("\n", "")):
        return "not_text"
    return None


@dataclass
class SynthResult:
    """What a run kept and why the rest went."""

    prompts: list[str] = field(default_factory=list)
    sampled: int = 0
    batches: int = 0
    dropped: Counter = field(default_factory=Counter)  # reason -> count
    tokens: int = 0  # sampled tokens (kept or not)
    kept_by_condition: Counter = field(default_factory=Counter)  # index into SynthSettings.conditions -> kept
    seconds: float = 0.0
    stopped_by_time: bool = False

    def corpus(self, seed: int) -> Corpus:
        """The kept prompts as a :class:`Corpus` (``write_corpus`` writes it)."""
        kept = [CorpusPrompt(p, SOURCE, f"{SOURCE}:user_turn") for p in self.prompts]
        return Corpus(kept, {SOURCE: len(kept)}, {f"{SOURCE}:user_turn": len(kept)},
                      self.dropped["duplicate"], {SOURCE: self.dropped["overlap"]}, seed)


@dataclass(frozen=True)
class BatchReport:
    """One sampled batch (for a progress display)."""

    sampled: int
    kept: int
    total_kept: int
    seconds: float


class Synthesizer:
    """Samples the target's user turns in batches and screens them."""

    def __init__(self, model, tokenizer, settings: SynthSettings, *, clock: Callable[[], float] = time.perf_counter):
        self.model, self.tokenizer, self.settings, self.clock = model, tokenizer, settings, clock
        self.prefixes = ([tokenizer.chat_ids(a) for a in settings.asks] if settings.asks  # the assistant's turn
                         else [user_turn_prefix(tokenizer, m) for m in settings.conditions])  # one per system message
        self._engine = None

    @property
    def engine(self):
        """One engine, its decode graph of ``batch_size`` rows captured on first use."""
        if self._engine is None:
            s = self.settings
            self._engine = batch_engine(self.model, self.tokenizer.eos_token_ids, s.batch_size,
                                        max(map(len, self.prefixes)) + s.max_new_tokens + 1, s.cuda_graphs)
        return self._engine

    def release(self) -> None:
        """Give the engine's graph and static cache back."""
        self._engine = None
        free_device_memory()

    def sample_batch(self, number: int) -> tuple[list[str], list[bool], int]:
        """Batch ``number`` (conditioned on system message ``number mod n``): (texts, ended on the
        end-of-turn token, tokens sampled)."""
        from eaglelab.engine.runtime.sampling import SamplingParams

        s = self.settings
        device = next(self.model.parameters()).device
        gen = torch.Generator(device=device).manual_seed(s.seed * 1_000_003 + number)
        prefix = self.prefixes[number % len(self.prefixes)]
        res = self.engine.generate([prefix] * s.batch_size, s.max_new_tokens,
                                   SamplingParams(temperature=s.temperature, top_p=s.top_p), generator=gen)
        texts = [self.tokenizer.decode(t).strip() for t in res.tokens]
        return texts, [r == "eos" for r in res.stop_reasons], sum(len(t) for t in res.tokens)

    def run(self, overlap: OverlapIndex, progress: Callable[[BatchReport], None] | None = None) -> SynthResult:
        """Sample until ``count`` prompts are kept, the time limit, or ``max_empty_batches`` barren batches."""
        s, out = self.settings, SynthResult()
        seen: set[str] = set()
        t0, last, empty = self.clock(), 0.0, 0
        while len(out.prompts) < s.count:
            if s.time_limit is not None and self.clock() - t0 + last > s.time_limit:
                out.stopped_by_time = True
                break
            b0 = self.clock()
            texts, ended, tokens = self.sample_batch(out.batches)
            kept = 0
            for text, done in zip(texts, ended):
                key = normalise(text)
                why = (screen(text, done, s.min_words) or ("duplicate" if key in seen else None)
                       or ("overlap" if overlap.hits(text) else None))
                if why is not None:
                    out.dropped[why] += 1
                elif len(out.prompts) < s.count:
                    seen.add(key)
                    out.prompts.append(text)
                    kept += 1
            out.kept_by_condition[out.batches % len(self.prefixes)] += kept
            out.batches, out.sampled, out.tokens = out.batches + 1, out.sampled + len(texts), out.tokens + tokens
            last = self.clock() - b0
            if progress:
                progress(BatchReport(len(texts), kept, len(out.prompts), last))
            empty = empty + 1 if kept == 0 else 0
            if empty >= s.max_empty_batches:
                reasons = ", ".join(f"{k} {v}" for k, v in out.dropped.most_common())
                raise EagleLabError(
                    f"{empty} batches in a row kept no prompt ({reasons})", field="the target's user turns",
                    hint="the target may not be an instruct model with a chat template, or --max-new-tokens is "
                         "too small for its turns (most were cut); try --max-new-tokens 256 or `eaglelab prompts`")
        out.seconds = self.clock() - t0
        return out


def synthesis_manifest(result: SynthResult, settings: SynthSettings, prefix_text: str, extra: dict[str, Any]) -> dict:
    """The ``synthesis`` section of the manifest: settings, what was sampled, kept and dropped, and why."""
    return {
        "method": "the target's own user turns, sampled from the chat template's text before a user message",
        "settings": asdict(settings), "prefix": prefix_text, "batches": result.batches, "sampled": result.sampled,
        "kept": len(result.prompts), "kept_share": round(len(result.prompts) / max(result.sampled, 1), 4),
        "dropped": {r: result.dropped.get(r, 0) for r in REJECTS}, "sampled_tokens": result.tokens,
        "seconds": round(result.seconds, 2), "stopped_by_time": result.stopped_by_time,
        "kept_by_system": [{"ask" if settings.asks else "system": m, "kept": result.kept_by_condition.get(i, 0)}
                           for i, m in enumerate(settings.conditions)], **extra,
    }
