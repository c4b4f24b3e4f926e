"""``eaglelab check-wiring --search`` through the CLI: its JSON, its exit codes, its user errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglelab.cli import main

SHIPPED = str(Path(__file__).resolve().parents[2] / "eaglelab" / "drafters" / "smollm2-135m-eagle3")


def test_search_without_target_is_a_user_error(capsys):
    """No --target: exit 2, a message naming --target, no traceback."""
    assert main(["check-wiring", SHIPPED, "--search"]) == 2
    err = capsys.readouterr()
    text = err.out + err.err
    assert "--target" in text and "Traceback" not in text


def test_search_with_bad_texts_file_is_a_user_error(tmp_path, capsys, default_target, monkeypatch):
    """A JSONL line without prompt/response/text: exit 2 naming the file and the line."""
    import eaglelab.engine.formats.loader as loader

    monkeypatch.setattr(loader, "load_target", lambda *a, **k: default_target)
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"prompt": "hi", "response": "hello there, friend"}\n{"question": "x"}\n')
    assert main(["check-wiring", SHIPPED, "--target", "default", "--search", "--texts", str(bad)]) == 2
    out = capsys.readouterr()
    text = " ".join((out.out + out.err).split())
    assert "t.jsonl" in text and "line 2" in text and "Traceback" not in text


@pytest.mark.slow
def test_search_json_on_the_default_model(default_target, monkeypatch, capsys):
    """--json: verdict, exit code, three slots with margins, the best taps in both conventions; the
    exit status is the JSON's. (2 prompts, 12 response tokens: a smoke run of the whole command.)"""
    import eaglelab.engine.formats.loader as loader

    monkeypatch.setattr(loader, "load_target", lambda *a, **k: default_target)
    rc = main(["check-wiring", SHIPPED, "--target", "default", "--search", "--samples", "2", "--new-tokens", "12", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == out["exit_code"] and out["verdict"] in ("ok", "mismatch")
    assert out["config_hf_indices"] == [2, 15, 27] and len(out["best_hf_indices"]) == 3
    assert set(out["expected_ids"]) == {"sglang", "vllm"}
    assert [s["slot"] for s in out["slots"]] == [0, 1, 2] and all(s["margin"] >= 0 for s in out["slots"])
    assert 0 <= out["best_score"]["agreement"] <= 1 and out["tokens"] > 0
