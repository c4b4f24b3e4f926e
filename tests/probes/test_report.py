"""eaglelab report: records and SGLang logs, auto-detected; JSON keys; user errors exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eaglelab.cli import main
from eaglelab.engine.errors import EagleLabError
from eaglelab.probes import events as ev
from eaglelab.probes.record import RecordWriter
from eaglelab.probes.report import detect_source, summarise

SPEC = {"algorithm": "eagle3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4, "attention_mode": "prefill"}
EAGER = "eager: attention mode prefill"


def _record(path: Path, *, baseline: bool = True, accepts: tuple[int, ...] = (3, 2, 3, 2)) -> Path:
    events: list[ev.Event] = [
        ev.RunStarted("tiny", "d1", "cpu", "float32", 1, SPEC, {}, {"torch": "2"}),
        ev.Step(0, "prefill", {"prefill": 40.0}, accept_len=(1,)),
    ]
    if baseline:
        events += [ev.Step(i, "decode", {"decode": 12.0}, accept_len=(1,), graph={"decode": "replay"}) for i in range(1, 5)]
    events += [
        ev.Step(10 + i, "spec", {"draft": 3.0, "verify": 29.5, "accept": 0.5, "draft_extend": 2.0},
                accept_len=(a,), num_draft_tokens=4, verify_tokens=4, graph={"verify": EAGER, "draft": "replay"})
        for i, a in enumerate(accepts)
    ]
    events.append(ev.RunFinished(8, 1 + 4 * baseline + sum(accepts), 0.2, 8, None))
    with RecordWriter(path) as w:
        for e in events:
            w(e)
    return path


SGLANG_LOG = "\n".join([
    "[2025-06-01 09:59:40 TP0] Capture cuda graph end. Time elapsed: 12.34 s. mem usage=1.20 GB.",
    "[2025-06-01 09:59:41 TP0] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, token usage: 0.00, "
    "#running-req: 0, #queue-req: 0, cuda graph: False, ",
    "[2025-06-01 09:59:42] The server is fired up and ready to roll!",
    "[2025-06-01 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 512, #cached-token: 0, token usage: 0.01, "
    "#running-req: 0, #queue-req: 0, ",
    "[2025-06-01 10:00:05 TP0] Decode batch, #running-req: 1, #token: 600, token usage: 0.01, accept len: 1.60, "
    "accept rate: 0.20, cuda graph: True, gen throughput (token/s): 50.00, #queue-req: 0, ",
    "[2025-06-01 10:00:06 TP0] Decode batch, #running-req: 1, #token: 640, token usage: 0.01, accept len: 1.80, "
    "accept rate: 0.27, cuda graph: True, gen throughput (token/s): 54.00, #queue-req: 0, ",
]) + "\n"


def test_record_with_baseline_gets_the_economics_verdict(tmp_path: Path) -> None:
    r = summarise(_record(tmp_path / "run.jsonl"))
    assert r.source == "eaglelab-record"
    assert r.accept_len_mean == pytest.approx(2.5)
    assert r.accept_rate_mean == pytest.approx(6 / 12)
    assert r.gen_throughput_mean == pytest.approx(15 / 0.2)
    assert r.cuda_graph_fraction == pytest.approx(0.5)  # decode steps replay, verify eager
    assert (r.decode_lines, r.prefill_lines) == (8, 1)
    assert r.details["decode_ms"] == pytest.approx(12.0)
    assert r.verdicts[0].startswith("speculation is slower than plain decoding (0.86x predicted)")
    assert "verify costs 2.5x a decode and runs eagerly (attention mode prefill)" in r.verdicts[0]
    assert "verify ran eagerly in 4 of 8 steps: attention mode prefill" in r.verdicts


def test_record_without_baseline_says_speedup_unknown_and_flags_low_acceptance(tmp_path: Path) -> None:
    r = summarise(_record(tmp_path / "run.jsonl", baseline=False, accepts=(1, 2, 1, 1)))
    assert r.accept_len_mean == pytest.approx(1.25)
    assert any(v.startswith("acceptance too low: mean accepted length 1.25") for v in r.verdicts)
    assert any(v.startswith("speedup unknown") for v in r.verdicts)
    r2 = summarise(tmp_path / "run.jsonl", decode_ms=12.0)
    # acceptance 2.0 would give 24/35 = 0.69x, verify at a decode's cost 15/17.5 = 0.86x: verify dominates
    assert r2.verdicts[0].startswith("speculation is slower than plain decoding (0.43x predicted): verify costs")
    assert r2.verdicts[1].startswith("also acceptance too low: mean accepted length 1.25")


def test_sglang_log_summary_and_absent_figures(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text(SGLANG_LOG)
    assert detect_source(path) == "sglang-log"
    r = summarise(path, expected_accept_len=2.5)
    assert r.source == "sglang-log"
    assert r.accept_len_mean == pytest.approx(1.7)
    assert r.gen_throughput_mean == pytest.approx(52.0)
    assert r.cuda_graph_fraction == 1.0
    assert (r.decode_lines, r.prefill_lines) == (2, 2)
    assert r.verdicts[0].startswith("acceptance too low: mean accepted length 1.70 (expected >= 2.5")
    assert any("health-check prefill" in v for v in r.verdicts)
    old = tmp_path / "old.log"
    old.write_text("[2024-11-02 09:00:05 TP0] Decode batch. #running-req: 1, #token: 40, token usage: 0.00, "
                   "gen throughput (token/s): 31.54, #queue-req: 0\n")
    r_old = summarise(old)
    assert r_old.accept_len_mean is None and r_old.cuda_graph_fraction is None and r_old.prefill_lines == 0


def test_cli_json_has_the_promised_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "server.log"
    path.write_text("[2024-11-02 09:00:05 TP0] Decode batch. #running-req: 1, #token: 40, token usage: 0.00, "
                    "gen throughput (token/s): 31.54, #queue-req: 0\n")
    assert main(["report", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("accept_len_mean", "gen_throughput_mean", "cuda_graph_fraction", "decode_lines",
                "prefill_lines", "source", "verdicts"):
        assert key in out
    assert out["source"] == "sglang-log" and out["accept_len_mean"] is None
    assert out["cuda_graph_fraction"] is None and out["gen_throughput_mean"] == pytest.approx(31.54)
    assert out["decode_lines"] == 1 and out["prefill_lines"] == 0 and isinstance(out["verdicts"], list)


def test_cli_table_for_a_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _record(tmp_path / "run.jsonl")
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "mean accepted length" in out and "2.50" in out and "75.0 tok/s" in out
    assert "try --attention-mode decode" in out.replace("\n", " ") or "attention-mode" in out


def test_record_detection_survives_a_damaged_first_line(tmp_path: Path) -> None:
    path = _record(tmp_path / "run.jsonl")
    path.write_bytes(b"\x00garbage\n" + path.read_bytes())
    assert detect_source(path) == "eaglelab-record"
    r = summarise(path)
    assert r.accept_len_mean == pytest.approx(2.5)
    assert any("skipped" in n for n in r.notes)


@pytest.mark.parametrize("content", [None, "", "hello\nworld\n", "dir"])
def test_unusable_files_exit_2(tmp_path: Path, content: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "input.txt"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    with pytest.raises(EagleLabError):
        summarise(path)
    assert main(["report", str(path)]) == 2
    assert "error" in capsys.readouterr().err
