"""The data-free tap search through the CLI (the default with --target and no --data): its JSON, its exit
codes, its user errors; and static checks that never read OK."""

from __future__ import annotations

import json
import shutil
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
def test_two_short_texts_give_no_confident_verdict(default_target, monkeypatch, capsys):
    """--json on 2 prompts x 12 response tokens: the whole command runs (three slots with margins, the
    best taps in both conventions) and says inconclusive, exit 4, naming the texts as the reason."""
    import eaglelab.engine.formats.loader as loader

    monkeypatch.setattr(loader, "load_target", lambda *a, **k: default_target)
    rc = main(["check-wiring", SHIPPED, "--target", "default", "--search", "--samples", "2", "--new-tokens", "12", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == out["exit_code"] == 4 and out["verdict"] == "inconclusive" and out["checked"] == "search"
    assert "only 2 text(s)" in out["conclusion"] and out["fix"] is None
    assert out["config_hf_indices"] == [2, 15, 27] and len(out["best_hf_indices"]) == 3
    assert set(out["expected_ids"]) == {"sglang", "vllm"}
    assert [s["slot"] for s in out["slots"]] == [0, 1, 2] and all(s["margin"] >= 0 for s in out["slots"])
    assert 0 <= out["best_score"]["agreement"] <= 1 and out["tokens"] > 0


@pytest.mark.slow
def test_off_by_one_is_caught_by_default_with_a_target(default_target, monkeypatch, capsys, tmp_path):
    """The shipped drafter with its SGLang ids shifted by one ([2, 15, 27] = hs[3, 16, 28]) and only
    --target default: the search runs without being asked (8 prompts x 48 response tokens, ~25 s on 2 CPU
    cores), exit 1, the fix [1, 14, 26]; the static checks ride along in the JSON."""
    import eaglelab.engine.formats.loader as loader

    monkeypatch.setattr(loader, "load_target", lambda *a, **k: default_target)
    d = tmp_path / "off-by-one"
    shutil.copytree(SHIPPED, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [2, 15, 27]
    (d / "config.json").write_text(json.dumps(cfg))
    rc = main(["check-wiring", str(d), "--target", "default", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1 and out["verdict"] == "mismatch" and out["checked"] == "search", out["conclusion"]
    assert out["config_hf_indices"] == [3, 16, 28] and out["best_hf_indices"] == [2, 15, 27]
    assert out["fix"]["new"] == [1, 14, 26] and out["fix"]["field"] == "eagle_config.eagle_aux_hidden_state_layer_ids"
    assert out["texts"] == 8 and out["static"]["verdict"] == "inconclusive"


def test_no_search_never_reads_ok(capsys, monkeypatch):
    """--no-search with a target: static checks only; exit 4 and the words say so, not WIRING OK. The
    target's weights are never loaded."""
    import eaglelab.engine.formats.loader as loader

    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(loader, "load_target", lambda *a, **k: pytest.fail("--no-search must not load the target"))
    assert main(["check-wiring", SHIPPED, "--target", "default", "--no-search"]) == 4
    out = " ".join(capsys.readouterr().out.split())
    assert "WIRING OK" not in out and "WIRING NOT CHECKED" in out
    assert "static checks passed; wiring NOT checked numerically (--no-search)" in out and "(exit 4)" in out


def test_no_target_no_data_says_static_only(capsys):
    """Neither --target nor --data: exit 4, the report says it is static only and how to check numerically."""
    rc = main(["check-wiring", SHIPPED, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 4 and out["verdict"] == "inconclusive" and out["checked"] == "static" and out["exit_code"] == 4
    assert "NOT checked numerically (no --target and no --data" in out["conclusion"] and "--target default" in out["conclusion"]
    assert main(["check-wiring", SHIPPED]) == 4
    assert "WIRING OK" not in capsys.readouterr().out
