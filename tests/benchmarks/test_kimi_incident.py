"""``benchmarks/kimi_incident.py --small`` end to end on CPU, on ``benchmarks/kimi_target.py --small``'s target
deepened to 8 layers (its 3 layers cannot hold three distinct default taps; 8 is the GPU target's depth): the MLA
drafter is trained by ``eaglelab train --online --layout mla``, served four ways, each served config checked
three ways. Pinned: the taps each serving reads (8 layers: SGLang ids [1, 3, 4] = hs[2, 4, 5]), figures for every
config, the healthy drafter lossless, check-wiring's exit codes the documented ones and the ``--data`` verdicts
(the data match depends on the target alone, so it is exact even for a drafter trained 4 steps), the JSON whole.
Whether broken configs accept less than the healthy one is the GPU run's figure, not asserted here.

``read_check`` alone (no training): check-wiring's real ``--json`` output on the CLI tests' tiny target and
drafter, through the script's own ``cli``, read into the record's fields."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import kimi_target  # noqa: E402

from benchmarks.kimi_incident import MODES, cli, main, read_check  # noqa: E402
from examples.incident_wiring import IDS_FIELD, config_copy  # noqa: E402

from eaglelab.probes.wiring import EXIT_CODES  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TAPS = {"healthy": [2, 4, 5], "embedding tap added": [0, 2, 4], "off by one": [3, 5, 6], "read by vLLM": [1, 3, 4]}
DATA_EXIT = {"healthy": 0, "embedding tap added": 1, "off by one": 1, "read by vLLM": 1}


@pytest.fixture(scope="module")
def replay(tmp_path_factory):
    """(the returned record, incident2.json as written, the markdown printed)."""
    work = tmp_path_factory.mktemp("kimi_incident")
    mp = pytest.MonkeyPatch()
    mp.setattr(kimi_target, "SMALL", replace(kimi_target.SMALL, layers=8))
    try:
        assert kimi_target.main(["--out", str(work), "--small", "--device", "cpu", "--train-s", "3"]) == 0
    finally:
        mp.undo()
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out):
        result = main(["--work", str(work), "--small", "--device", "cpu", "--prompts", "6"])
    return result, json.loads((work / "incident2.json").read_text()), out.getvalue()


def test_the_drafter_is_trained_in_the_mla_layout_at_sglangs_default_taps(replay):
    result, _, _ = replay
    d = result["drafter"]
    assert d["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and d["sglang_ids"] == [1, 3, 4]
    assert d["training"]["steps"] == 4 and d["training"]["online"]
    assert result["target"]["num_layers"] == 8 and result["target"]["architecture"] == "DeepseekV3ForCausalLM"


def test_every_config_is_served_with_its_taps_and_has_figures(replay):
    result, _, _ = replay
    assert [c["label"] for c in result["configs"]] == list(TAPS)
    for c in result["configs"]:
        assert c["hf_indices"] == TAPS[c["label"]], c["label"]
        assert c["accept_len"] >= 1.0 and 0.0 <= c["accept_rate"] <= 1.0
        assert c["tokens_per_s"] > 0 and c["speedup"] == pytest.approx(c["tokens_per_s"] / c["plain_tokens_per_s"])
    assert result["configs"][0]["identical_to_plain"] and result["configs"][0]["output_difference"] is None
    assert result["settings"]["prompts"] == 6 and result["plain"]["tokens_per_s"] > 0


def test_check_wiring_exit_codes_verdicts_and_fixes(replay):
    result, _, _ = replay
    for c in result["configs"]:
        runs = c["check_wiring"]
        assert list(runs) == list(MODES)
        for mode, r in runs.items():
            assert EXIT_CODES[r["verdict"]] == r["exit_code"], (c["label"], mode, r["conclusion"])
        assert runs["static"]["exit_code"] in (1, 4), "static checks alone never read OK"
        assert runs["data"]["exit_code"] == DATA_EXIT[c["label"]], (c["label"], runs["data"]["conclusion"])
        assert runs["search"]["exit_code"] in (0, 1, 4)
        found = c["search_found_hf"]
        assert len(found) == 3 and all(0 <= i < 8 for i in found) and len(c["search_found_sglang_ids"]) == 3
    by = {c["label"]: c["check_wiring"] for c in result["configs"]}
    assert by["embedding tap added"]["static"]["exit_code"] == 1  # id -1 is the embedding: wrong without running it
    assert by["healthy"]["data"]["fix"] is None
    for name in ("embedding tap added", "off by one"):
        assert by[name]["data"]["fix"]["new"] == [1, 3, 4], by[name]["data"]["fix"]
    assert by["read by vLLM"]["data"]["fix"]["new"] == [2, 4, 5]  # the same layers in vLLM's ids


def test_the_json_is_complete_and_the_table_has_a_row_per_config(replay):
    result, written, table = replay
    assert written == json.loads(json.dumps(result))
    assert {"target", "drafter", "settings", "plain", "configs", "seconds", "command"} <= written.keys()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "config" not in line]
    assert len(rows) == 4 and all(row.count("|") == 10 for row in rows)
    assert rows[1].startswith("| embedding tap added | [-1, 1, 3] (sglang) | [-1, 1, 3] / hs[0, 2, 4] |")


# ---- read_check on check-wiring's own JSON -----------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The CLI tests' 4-layer target (with a word tokenizer), random drafter at SGLang ids [0, 1, 2], and data
    captured at those ids; plus the drafter served off by one ([1, 2, 3])."""
    from tests.cli.hostile_inputs import AUX_IDS, make_inputs
    from tests.conftest import add_word_tokenizer, tiny_config

    root = tmp_path_factory.mktemp("kimi_read_check")
    inputs = make_inputs(root)
    add_word_tokenizer(inputs.target, vocab=tiny_config()["vocab_size"])
    config = json.loads((inputs.drafter / "config.json").read_text())
    config["eagle_config"][IDS_FIELD] = [i + 1 for i in AUX_IDS]
    return inputs, config_copy(inputs.drafter, root / "off_by_one", config), list(AUX_IDS)


def wiring(argv: list[str]):
    """check-wiring --json through the script's own ``cli``, read as the script reads it; and the raw object."""
    rc, text = cli(argv, capture=True)
    return read_check("x", argv, rc, text), json.loads(text.splitlines()[-1])


def test_read_check_takes_the_data_checks_verdict_and_fix(tiny):
    """--data: off by one is exit 1 with the fix back to the ids the data came from ([0, 1, 2]); the healthy
    drafter exit 0, no fix; neither is a search, so no taps found."""
    inputs, off, ids = tiny
    base = ["--target", str(inputs.target), "--serving", "sglang", "--json", "--data", str(inputs.data)]
    run, raw = wiring(["check-wiring", str(off), *base])
    assert (run.exit_code, run.verdict) == (1, "mismatch") and run.conclusion == raw["conclusion"] != ""
    assert run.fix == {"file": str(off / "config.json"), "field": f"eagle_config.{IDS_FIELD}",
                       "current": [1, 2, 3], "new": ids}, run.fix
    assert run.found_hf is None and run.found_sglang_ids is None
    ok, _ = wiring(["check-wiring", str(inputs.drafter), *base])
    assert (ok.exit_code, ok.verdict, ok.fix) == (0, "ok", None)


def test_read_check_takes_the_searchs_best_taps(tiny):
    """The search: the best taps it names (hs indices) and the same in SGLang ids (hs[i] is SGLang id i - 1);
    the verdict's exit code the documented one."""
    inputs, _, _ = tiny
    run, raw = wiring(["check-wiring", str(inputs.drafter), "--target", str(inputs.target), "--json", "--search",
                       "--new-tokens", "8"])
    assert raw["checked"] == "search" and run.verdict == raw["verdict"] and EXIT_CODES[run.verdict] == run.exit_code
    assert run.found_hf == raw["best_hf_indices"] and len(run.found_hf) == 3
    assert run.found_sglang_ids == [i - 1 for i in run.found_hf]
    if raw["fix"] is None:
        assert run.fix is None
    else:
        assert run.fix["new"] == raw["fix"]["new"] == run.found_sglang_ids


def test_read_check_keeps_an_error_and_output_that_is_not_json(tmp_path):
    """A drafter directory that does not exist: exit 2, verdict "error", the message naming the path. Output
    that is not check-wiring's object (an internal error's exit) is kept as "no JSON" with its last line."""
    run, _ = wiring(["check-wiring", str(tmp_path / "nowhere"), "--json"])
    assert (run.exit_code, run.verdict) == (2, "error") and "nowhere" in run.conclusion
    odd = read_check("static", ["check-wiring"], 3, "loading\ninternal error: boom\n")
    assert (odd.verdict, odd.conclusion, odd.fix, odd.found_hf) == ("no JSON", "internal error: boom", None, None)
