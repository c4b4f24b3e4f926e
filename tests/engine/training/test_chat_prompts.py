"""The ``chat`` prompt source: every kind, every slot filled, seeded, enough distinct prompts for a
150k corpus, its share in the corpus, and the overlap check applies to it like to the others."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.training import chat_prompts as cp
from eaglelab.engine.training import prompt_corpus as pc


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31))
def test_every_kind_in_turn_and_every_slot_filled(seed):
    gen = cp.chat_prompts(random.Random(seed))
    drawn = [next(gen) for _ in range(3 * len(cp.KINDS))]
    assert [k for k, _ in drawn] == list(cp.KINDS) * 3
    for _, text in drawn:
        assert "{" not in text and "}" not in text and text.strip() == text and len(text) > 20


def test_seeded_and_enough_distinct_prompts_for_a_150k_corpus():
    a, b = cp.chat_prompts(random.Random(7)), cp.chat_prompts(random.Random(7))
    first = [next(a) for _ in range(50)]
    assert first == [next(b) for _ in range(50)]
    gen = cp.chat_prompts(random.Random(0))
    # a 150k corpus asks 0.65 x 150k = 97.5k chat prompts and draws 3x that many
    distinct = {pc.normalise(next(gen)[1]) for _ in range(3 * 97_500)}
    assert len(distinct) > 97_500


def test_chat_takes_its_share_with_every_kind(few_modules, evaluation):
    corpus = pc.build_corpus(4000, evaluation, seed=3)
    assert corpus.counts["chat"] == int(4000 * pc.DEFAULT_SHARE["chat"] / sum(pc.DEFAULT_SHARE.values()))
    assert {k.split(":")[1] for k in corpus.kinds if k.startswith("chat:")} == set(cp.KINDS)


def test_a_benchmark_question_planted_in_chat_is_dropped(few_modules, evaluation, monkeypatch):
    q = pc.evaluation_texts()["mt_bench"][40]

    def planted(rng):
        yield pc.CorpusPrompt(q, "chat", "x")
        yield from pc.chat(rng)

    monkeypatch.setitem(pc.GENERATORS, "chat", planted)
    corpus = pc.build_corpus(300, evaluation, seed=0)
    assert corpus.overlaps["chat"] == 1 and q not in [p.text for p in corpus.prompts]
