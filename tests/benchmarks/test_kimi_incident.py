"""``benchmarks/kimi_incident.py --small`` end to end on CPU, on ``benchmarks/kimi_target.py --small``'s target
deepened to 8 layers (its 3 layers cannot hold three distinct default taps; 8 is the GPU target's depth): the MLA
drafter is trained by ``eaglelab train --online --layout mla``, served four ways, each served config checked
three ways. Pinned: the taps each serving reads (8 layers: SGLang ids [1, 3, 4] = hs[2, 4, 5]), figures for every
config, the healthy drafter lossless, check-wiring's exit codes the documented ones and the ``--data`` verdicts
(the data match depends on the target alone, so it is exact even for a drafter trained 4 steps), the JSON whole.
Whether broken configs accept less than the healthy one is the GPU run's figure, not asserted here."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import kimi_target  # noqa: E402

from benchmarks.kimi_incident import MODES, main  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TAPS = {"healthy": [2, 4, 5], "embedding tap added": [0, 2, 4], "off by one": [3, 5, 6], "read by vLLM": [1, 3, 4]}
DATA_EXIT = {"healthy": 0, "embedding tap added": 1, "off by one": 1, "read by vLLM": 1}
LABEL_EXIT = {"WIRING OK": 0, "WIRING WRONG": 1, "WIRING INCONCLUSIVE": 4, "WIRING NOT CHECKED": 4}


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
            label = r["verdict_line"].split(" — ")[0]
            assert LABEL_EXIT[label] == r["exit_code"], (c["label"], mode, r["verdict_line"])
        assert runs["static"]["exit_code"] in (1, 4), "static checks alone never read OK"
        assert runs["data"]["exit_code"] == DATA_EXIT[c["label"]], (c["label"], runs["data"]["verdict_line"])
        assert runs["search"]["exit_code"] in (0, 1, 4)
        found = c["search_found_hf"]
        assert len(found) == 3 and all(0 <= i < 8 for i in found) and len(c["search_found_sglang_ids"]) == 3
    by = {c["label"]: c["check_wiring"] for c in result["configs"]}
    assert by["embedding tap added"]["static"]["exit_code"] == 1  # id -1 is the embedding: wrong without running it
    assert by["healthy"]["data"]["fix"] is None
    for name in ("embedding tap added", "off by one"):
        assert by[name]["data"]["fix"].endswith("→ [1, 3, 4]  (sglang reads this field first and counts ids in the "
                                                "sglang convention)")
    assert "→ [2, 4, 5]" in by["read by vLLM"]["data"]["fix"]  # the same layers in vLLM's ids


def test_the_json_is_complete_and_the_table_has_a_row_per_config(replay):
    result, written, table = replay
    assert written == json.loads(json.dumps(result))
    assert {"target", "drafter", "settings", "plain", "configs", "seconds", "command"} <= written.keys()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "config" not in line]
    assert len(rows) == 4 and all(row.count("|") == 10 for row in rows)
    assert rows[1].startswith("| embedding tap added | [-1, 1, 3] (sglang) | [-1, 1, 3] / hs[0, 2, 4] |")
