"""Batch chat rendering: a prompt placed between the template's two halves equals the full render, and a
template that transforms the message (here: trims and upper-cases it) is rendered per prompt instead."""

from __future__ import annotations

import json

import pytest

from eaglelab.engine.formats.tokenizer import Tokenizer
from tests.conftest import add_word_tokenizer

PROMPTS = ["w1 w2", "  w3  ", "w4\nw5", ""]


@pytest.mark.parametrize("transform", ["", " | trim | upper"])
def test_batch_rendering_equals_one_by_one(tmp_path, transform):
    add_word_tokenizer(tmp_path, 64)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = cfg["chat_template"].replace("{{ m['content'] }}", "{{ m['content']" + transform + " }}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = Tokenizer(tmp_path)
    for system in (None, "w9"):
        want = [tok.chat_ids(p, system=system) for p in PROMPTS]
        assert tok.chat_ids_many(PROMPTS, system=system) == want
    texts = [tok._chat_text(p, None) for p in PROMPTS]
    assert ("W1" in texts[0]) == bool(transform)  # the transform really applies
