"""The chat template and encoding: our Jinja rendering + tokenizers equals HF transformers'
``apply_chat_template`` on the real default model's tokenizer, one prompt at a time and in a batch."""

from __future__ import annotations

import pytest

from eaglelab.engine.formats.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

PROMPTS = ["Give me three tips for writing clear technical documentation.",
           "Here is an email I wrote:\n\nThank you for your patience.\n\nNow rewrite it as a limerick.",
           "Solve the equation 3x - 7 = 2x + 18. Show your work.", "  leading and trailing spaces  ", "é ü 漢字 🙂"]


@pytest.fixture(scope="module")
def tokenizers():
    from eaglelab.engine.formats.loader import resolve_model_dir

    path = resolve_model_dir("default")
    return Tokenizer(path), transformers.AutoTokenizer.from_pretrained(str(path))


def _hf(hf, prompt: str, system: str | None) -> list[int]:
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    out = hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if isinstance(out, dict) or hasattr(out, "keys") else out)


@pytest.mark.parametrize("system", [None, "You answer in one sentence."])
def test_chat_ids_one_by_one_and_in_a_batch_equal_transformers(tokenizers, system):
    ours, hf = tokenizers
    want = [_hf(hf, p, system) for p in PROMPTS]
    assert [ours.chat_ids(p, system=system) for p in PROMPTS] == want
    assert ours.chat_ids_many(PROMPTS, system=system) == want
    assert ours.chat_ids_many([], system=system) == []
