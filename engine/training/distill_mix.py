"""A mix of self-distilled data in one ``distill --out``: several prompt sets, each with its own answer length, and
second turns (the target's first answer kept in the conversation, then a follow-up request, answered again).

The mix spec is a JSON file::

    {"seed": 0, "parts": [
      {"name": "chat", "prompts": "/tmp/s", "limit": 60000, "max_new_tokens": 160},
      {"name": "long", "prompts": "/tmp/long", "max_new_tokens": 512},
      {"name": "turn2", "second_turn_of": "chat", "limit": 20000, "max_new_tokens": 160, "max_prompt_tokens": 768}
    ]}

Each part owns a fixed range of prompt indices, in the order given (``chat`` 0..59999, ``long`` next, ...), so
every part's shards share ``OUT/shards`` and a stopped run resumes part by part. A second-turn part follows the first
``limit`` prompts of an earlier first-turn part, one for one (a first answer cut by ``max_new_tokens`` is left out:
no second turn there), and renders ``[user: prompt, assistant: answer, user: follow-up]`` with the chat template: the answer as
text, as a chat client sends it back. The follow-up is one of :data:`FOLLOW_UPS` (generic requests we wrote), drawn
per prompt from ``seed``. A second turn whose first answer is not distilled yet waits for a later run.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eaglelab.engine.errors import ConfigError

FOLLOW_UPS = (
    "Can you explain that in more detail?", "Give me a concrete example.", "Can you make it shorter?",
    "Summarize your answer in three bullet points.", "Now explain it to a ten-year-old.", "Why is that?",
    "What are the most common mistakes people make here?", "Can you rewrite that in a more formal tone?",
    "What would you do differently if you had less time?", "Are there any exceptions to this?",
    "Can you turn that into a step-by-step plan?", "What are the pros and cons?", "Thanks! What should I do next?",
    "Could you give me a few alternatives?", "How would you explain this to a beginner?",
    "Can you write that as a short email?", "What is the most important point, in one sentence?",
    "Can you add some numbers or an estimate?", "Please continue.", "How do I check that this is right?",
)
PART_KEYS = {"name", "prompts", "second_turn_of", "limit", "max_new_tokens", "max_prompt_tokens"}


@dataclass(frozen=True)
class MixPart:
    """One part of a mix: first turns from ``prompts``, or second turns of the part ``second_turn_of``."""

    name: str
    prompts: str | None = None
    second_turn_of: str | None = None
    limit: int | None = None
    max_new_tokens: int = 256
    max_prompt_tokens: int = 512


@dataclass(frozen=True)
class MixSpec:
    parts: tuple[MixPart, ...]
    seed: int = 0


def read_mix(path: str | Path) -> MixSpec:
    """The mix spec at ``path``, checked: each error names the file, the part and the field."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"cannot read the mix spec ({type(exc).__name__}: {exc})", file=path,
                          expected='JSON: {"parts": [{"name": ..., "prompts": DIR, "max_new_tokens": N}, ...]}') from None
    parts = raw.get("parts") if isinstance(raw, dict) else None
    if not isinstance(parts, list) or not parts:
        raise ConfigError("no parts", file=path, field="parts", found=type(parts).__name__,
                          expected="a non-empty list of parts")
    out: list[MixPart] = []
    for k, p in enumerate(parts):
        out.append(_part(path, k, p, out))
    seed = raw.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError("must be an integer", file=path, field="seed", found=seed)
    return MixSpec(tuple(out), seed)


def _part(path: Path, k: int, p: Any, before: list[MixPart]) -> MixPart:
    where, earlier = f"parts[{k}]", [q.name for q in before if q.prompts is not None]
    if not isinstance(p, dict):
        raise ConfigError("must be an object", file=path, field=where, found=type(p).__name__)
    unknown = set(p) - PART_KEYS
    if unknown:
        raise ConfigError("unknown field", file=path, field=f"{where}.{sorted(unknown)[0]}",
                          expected=", ".join(sorted(PART_KEYS)))
    name = p.get("name")
    if not isinstance(name, str) or not name or name in [q.name for q in before]:
        raise ConfigError("needs a name of its own", file=path, field=f"{where}.name", found=name,
                          expected="a string no earlier part uses")
    if ("prompts" in p) == ("second_turn_of" in p):
        raise ConfigError("give exactly one of prompts (first turns) and second_turn_of (an earlier part)",
                          file=path, field=where, found=", ".join(sorted(set(p) & {"prompts", "second_turn_of"})) or "neither")
    if "second_turn_of" in p and p["second_turn_of"] not in earlier:
        raise ConfigError("names no earlier part of first turns", file=path, field=f"{where}.second_turn_of",
                          found=p["second_turn_of"], expected=", ".join(earlier) or "a part with prompts listed before this one")
    for f in ("limit", "max_new_tokens", "max_prompt_tokens"):
        v = p.get(f)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ConfigError("must be an integer >= 1", file=path, field=f"{where}.{f}", found=v)
    return MixPart(name, p.get("prompts"), p.get("second_turn_of"), p.get("limit"),
                   p.get("max_new_tokens", 256), p.get("max_prompt_tokens", 512))


def first_turn_texts(spec: MixSpec) -> dict[str, list[str]]:
    """Each first-turn part's prompts (its ``limit`` first ones)."""
    from eaglelab.engine.training.prompt_corpus import read_corpus

    return {p.name: [r["prompt"] for r in read_corpus(p.prompts)][: p.limit]
            for p in spec.parts if p.prompts is not None}


def part_ranges(spec: MixSpec, texts: dict[str, list[str]]) -> dict[str, range]:
    """The prompt indices each part owns, in the order of the spec (a second turn: as many as its source, capped
    at its limit)."""
    out: dict[str, range] = {}
    at = 0
    for p in spec.parts:
        n = len(texts[p.name]) if p.prompts is not None else len(out[p.second_turn_of])
        n = min(n, p.limit) if p.limit else n
        out[p.name], at = range(at, at + n), at + n
    return out


def follow_up(seed: int, index: int) -> str:
    """The generic follow-up of the second turn at prompt ``index`` (the same for the same seed)."""
    return FOLLOW_UPS[random.Random(seed * 1_000_003 + index).randrange(len(FOLLOW_UPS))]


def first_answers(out: str | Path, indices: range, tokenizer) -> dict[int, str]:
    """Prompt index -> the target's answer as text, for the rows of ``out``'s shards in ``indices`` whose answer
    ended on the end-of-turn token."""
    from eaglelab.engine.training.distill import read_shard, shard_paths

    eos = set(tokenizer.eos_token_ids)
    found: dict[int, str] = {}
    for path in shard_paths(out):
        t = read_shard(path)
        off, plens = t["offsets"].tolist(), t["prompt_lens"].tolist()
        ended = t["hit_eos"].tolist() if "hit_eos" in t else [0] * len(plens)
        for r, i in enumerate(t["indices"].tolist()):
            if i in indices and ended[r]:
                ids = t["tokens"][off[r]: off[r + 1]].tolist()
                found[i] = tokenizer.decode([x for x in ids[plens[r]:] if x not in eos]).strip()
    return found


def second_turn_ids(prompt: str, answer: str, follow: str, tokenizer, system: str | None = None) -> list[int]:
    """The chat template over (prompt, answer, follow-up), ending in the assistant's turn."""
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}, {"role": "assistant", "content": answer},
        {"role": "user", "content": follow}]
    return tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def mix_prompt_ids(spec: MixSpec, texts: dict[str, list[str]], ranges: dict[str, range], part: MixPart, out,
                   tokenizer, system: str | None, into: list[list[int] | None]) -> None:
    """Fill ``into`` (one slot per prompt index of the mix) for ``part``: its first turns through the chat
    template, or its second turns from the answers its source part has in ``out`` so far (None: not yet)."""
    r = ranges[part.name]
    if part.prompts is not None:
        for i, ids in zip(r, tokenizer.chat_ids_many(texts[part.name][: len(r)], system=system)):
            into[i] = ids
        return
    src = ranges[part.second_turn_of]
    answers = first_answers(out, src, tokenizer)
    for i, j, prompt in zip(r, src, texts[part.second_turn_of]):  # second turn i follows first turn j
        if j in answers:
            into[i] = second_turn_ids(prompt, answers[j], follow_up(spec.seed, i), tokenizer, system)
