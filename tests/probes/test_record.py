"""Run record: the writer flushes every line; the reader survives anything; follow tails a file."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglelab.engine.errors import EagleLabError
from eaglelab.probes import events as ev
from eaglelab.probes.record import RecordWriter, follow_record, read_record, schema_major

EVENTS: list[ev.Event] = [
    ev.RunStarted("m", "d", "cpu", "float32", 1, {"algorithm": "eagle3"}, {"n": 1}, {"torch": "2"}, t=1.0),
    ev.Step(0, "prefill", {"prefill": 40.0}, accept_len=(1,), t=2.0),
    ev.Step(1, "spec", {"draft": 3.0, "verify": 29.5}, accept_len=(3,), accepted_positions=((1, 2),),
            num_draft_tokens=4, verify_tokens=4, graph={"verify": "replay"}, active_rows=1, t=3.0),
    ev.WarningEvent("graphs", "eager", t=4.0),
    ev.RunFinished(5, 4, 0.08, 1, 3.0, ("eos",), t=5.0),
]


def _write(path: Path, events: list[ev.Event] = EVENTS) -> None:
    with RecordWriter(path) as w:
        for e in events:
            w.write(e)


def test_round_trip_with_header(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _write(path)
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["type"] == "header" and header["schema_version"] == 1
    assert header["format"] == "eaglelab-record"
    assert len(lines) == 1 + len(EVENTS)
    res = read_record(path)
    assert res.events == EVENTS
    assert res.skipped_lines == 0 and res.schema_version == 1 and res.notes == ()


def test_every_line_is_on_disk_before_close(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    w = RecordWriter(path)
    for i, e in enumerate(EVENTS, start=1):
        w(e)
        assert len(read_record(path).events) == i
    w.close()
    w.close()


def test_truncated_last_line_garbage_and_unknowns_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _write(path, EVENTS[:3])
    with open(path, "ab") as f:
        f.write(b"not json at all\n")
        f.write(b"\xff\xfe\x00binary\n")
        f.write(b'{"type": "kv_evicted", "blocks": 3}\n')
        f.write(b'{"type": "warning", "source": "a", "message": "b", "t": 1, "new_field": 1}\n')
        f.write(b'{"type": "step", "index": "x", "kind": "spec", "phase_ms": {}}\n')
        f.write(b"[1, 2]\n")
        f.write(b'{"type": "step", "index": 9, "kind": "spec", "pha')  # crash mid-line
    res = read_record(path)
    assert res.events == EVENTS[:3] + [ev.WarningEvent("a", "b", 1.0)]
    assert res.skipped_lines == 6
    assert res.unknown_types == {"kv_evicted": 1}
    assert any("kv_evicted" in n for n in res.notes)


def test_appending_after_a_crash_starts_a_fresh_line(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    _write(path, EVENTS[:2])
    with open(path, "ab") as f:
        f.write(b'{"type": "step", "ind')
    _write(path, EVENTS[2:])
    res = read_record(path)
    assert res.events == EVENTS
    assert res.skipped_lines == 1
    assert path.read_text().count('"type":"header"') == 1


@pytest.mark.parametrize(("version", "newer"), [("1.3", False), (2, True), ("2.0", True)])
def test_later_schema_versions_are_read_and_noted(tmp_path: Path, version: object, newer: bool) -> None:
    path = tmp_path / "run.jsonl"
    lines = [
        json.dumps({"type": "header", "format": "eaglelab-record", "schema_version": version}),
        json.dumps({**ev.to_json(EVENTS[1]), "gpu_temp_c": 61}),
        json.dumps({"type": "step_v2", "index": 1}),
    ]
    path.write_text("\n".join(lines) + "\n")
    res = read_record(path)
    assert res.events == [EVENTS[1]]
    assert res.skipped_lines == 1
    assert res.schema_version == version
    assert res.newer_than_reader is newer
    assert any("schema version" in n for n in res.notes) is newer


def test_schema_major() -> None:
    assert [schema_major(v) for v in (1, "1", "1.7", "x", None)] == [1, 1, 1, None, None]


def test_missing_file_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(EagleLabError) as info:
        read_record(tmp_path / "nope.jsonl")
    assert "nope.jsonl" in str(info.value)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(junk=st.lists(st.binary(max_size=40), max_size=8), cut=st.integers(0, 200))
def test_reader_never_crashes_and_keeps_every_intact_event(tmp_path: Path, junk: list[bytes], cut: int) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.unlink(missing_ok=True)
    _write(path, EVENTS[:2])
    tail = json.dumps(ev.to_json(EVENTS[2])).encode()
    with open(path, "ab") as f:
        for j in junk:
            f.write(j.replace(b"\n", b" ").replace(b"\r", b" ") + b"\n")
        f.write(tail[:cut])
    res = read_record(path)
    assert res.events[:2] == EVENTS[:2]
    intact = cut >= len(tail)
    assert (EVENTS[2] in res.events) is intact
    assert res.skipped_lines <= len(junk) + 1


def test_follow_reads_lines_only_once_complete(tmp_path: Path) -> None:
    path = tmp_path / "live.jsonl"
    lines = [json.dumps(ev.to_json(e)) + "\n" for e in EVENTS]
    blob = "".join(lines)
    pieces = [blob[i : i + 37] for i in range(0, len(blob), 37)]  # cuts lines in the middle

    def feed(_: float) -> None:
        if pieces:
            with open(path, "a") as f:
                f.write(pieces.pop(0))

    got = list(follow_record(path, sleep=feed, idle_timeout_s=5.0, until_finished=True))
    assert got == EVENTS


def test_follow_waits_for_the_file_and_stops_when_idle(tmp_path: Path) -> None:
    path = tmp_path / "later.jsonl"
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] == 3.0:  # the file appears after 3 polls
            _write(path, EVENTS[:2])

    got = list(follow_record(path, poll_s=1.0, sleep=sleep, idle_timeout_s=5.0, clock=lambda: now[0]))
    assert got == EVENTS[:2]
    assert now[0] == pytest.approx(3.0 + 5.0)  # quit 5 s after the last news


def test_follow_from_the_end_skips_what_was_there(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    _write(path, EVENTS[:2])
    calls = [0]

    def sleep(_: float) -> None:
        calls[0] += 1
        if calls[0] == 1:
            with RecordWriter(path) as w:
                w.write(EVENTS[3])

    got = list(follow_record(path, from_start=False, sleep=sleep, stop=lambda: calls[0] >= 3))
    assert got == [EVENTS[3]]


def test_follow_in_a_thread_with_a_real_writer(tmp_path: Path) -> None:
    path = tmp_path / "thread.jsonl"
    got: list[ev.Event] = []
    done = threading.Event()

    def tail() -> None:
        got.extend(follow_record(path, poll_s=0.01, until_finished=True, stop=done.is_set))

    reader = threading.Thread(target=tail)
    reader.start()
    _write(path)
    reader.join(timeout=10)
    done.set()
    reader.join(timeout=1)
    assert got == EVENTS
