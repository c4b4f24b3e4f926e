"""Hostile records and files, second sweep (issue #39): the JSONL guard (numbers past what a run can
hold, nesting deeper than the parser's stack), FIFOs and devices where a file is expected, a full
disk or a closed pipe under ``report``, a full disk under the record writer, a cache path that is not
UTF-8, and a TUI that crashed. Each case failed (an internal error, a hang, a wrong figure, an
unclear message, a traceback) before its fix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eaglelab.engine.errors import EagleLabError
from tests.cli.hostile_inputs import assert_handled, flat, make_record, run_cli
from tests.cli.test_hostile_properties import bounded

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def record(tmp_path_factory) -> Path:
    return make_record(tmp_path_factory.mktemp("hostile_records") / "run.jsonl")


# ---- the record guard -------------------------------------------------------------------------------------


@pytest.mark.parametrize("line", [
    '{"type":"step","index":9,"kind":"spec","phase_ms":{"verify":1e400},"accept_len":[2]}',
    '{"type":"step","index":9,"kind":"spec","phase_ms":{"verify":-1e400},"accept_len":[2]}',
    '{"type":"step","index":9,"kind":"spec","phase_ms":{"verify":1e300},"accept_len":[2]}',
    '{"type":"step","index":9,"kind":"spec","t":1e400,"phase_ms":{"verify":2.0},"accept_len":[2]}',
    DEEP,
    '{"type":"step","a":' * 50_000 + "1" + "}" * 50_000,
], ids=["1e400", "-1e400", "1e300", "t-1e400", "deep-list", "deep-dict"])
def test_numbers_past_any_run_and_deep_nesting_are_skipped_lines(record, tmp_path, capsys, line) -> None:
    """``1e400`` parsed as infinity and passed the guard ("verify costs infx a decode"); deep nesting
    raised RecursionError out of the reader (exit 3)."""
    from eaglelab.probes.record import read_record

    path = tmp_path / "run.jsonl"
    path.write_text(record.read_text() + line + "\n")
    assert read_record(path).skipped_lines == 1
    argv = ["report", str(path), "--json"]
    outcome = run_cli(argv, capsys)
    assert_handled(outcome, argv)
    assert outcome.rc == 0 and "inf" not in outcome.out.lower() and "e+" not in outcome.out


@pytest.mark.parametrize("argv_of", [lambda p: ["report", p, "--json"], lambda p: ["tui", p]], ids=["report", "tui"])
def test_a_file_of_deep_nesting_is_refused_not_a_crash(tmp_path, capsys, argv_of) -> None:
    from eaglelab.probes.record import is_record_file

    path = tmp_path / "deep.jsonl"
    path.write_text(DEEP + "\n")
    assert is_record_file(path) is False
    argv = argv_of(str(path))
    outcome = run_cli(argv, capsys)
    assert_handled(outcome, argv)
    assert outcome.rc == 2 and str(path) in flat(outcome.err)


# ---- FIFOs and devices where a file is expected -------------------------------------------------------------


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "pipe.jsonl"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("argv_of", [
    lambda p: ["report", p],
    lambda p: ["tui", p],
    lambda p: ["tui", p, "--follow"],
    lambda p: ["tui", "--log", p],
    lambda p: ["tui", "--log", p, "--follow"],
    lambda p: ["wait-ready", "http://127.0.0.1:9", "--log", p, "--timeout", "0.5"],
], ids=["report", "tui", "tui-follow", "tui-log", "tui-log-follow", "wait-ready-log"])
def test_a_fifo_is_named_as_one_and_never_opened(fifo, capsys, argv_of) -> None:
    """It was "no such file" / "missing" (the file is right there), ``--follow`` waited for ever on a
    size that never grows, and wait-ready ignored the log it was given."""
    argv = argv_of(str(fifo))
    with bounded(30):
        outcome = run_cli(argv, capsys)
    assert_handled(outcome, argv)
    assert outcome.rc == 2 and "FIFO" in flat(outcome.err) and str(fifo) in flat(outcome.err)


def test_a_device_is_named_as_one(capsys) -> None:
    outcome = run_cli(["report", "/dev/null"], capsys)
    assert outcome.rc == 2 and "a character device" in flat(outcome.err)


# ---- where output goes: a full disk, a closed pipe ---------------------------------------------------------


def _report(record: Path, stdout, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eaglelab", "report", str(record), *extra], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, timeout=120)


@pytest.mark.parametrize("extra", [(), ("--json",)])
def test_report_into_a_full_disk_is_exit_2_naming_standard_output(record, extra) -> None:
    with open("/dev/full", "w") as full:
        done = _report(record, full, *extra)
    assert done.returncode == 2, done.stderr
    assert "standard output" in flat(done.stderr) and "No space left on device" in done.stderr
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr


@pytest.mark.parametrize("extra", [(), ("--json",)])
def test_report_into_a_closed_pipe_ends_quietly(record, extra) -> None:
    """``report --json | true``: a BrokenPipeError traceback, or "error: Broken pipe" and exit 2."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will read: every write gets EPIPE
    try:
        done = _report(record, write_end, *extra)
    finally:
        os.close(write_end)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_the_record_writer_on_a_full_disk_names_the_record(tmp_path) -> None:
    """A file-size limit plays a full disk: the write fails with EFBIG as it would with ENOSPC."""
    script = f"""
import resource, signal
from eaglelab.probes.events import RunFinished
from eaglelab.probes.record import RecordWriter
from eaglelab.engine.errors import EagleLabError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
try:
    with RecordWriter({str(tmp_path / 'run.jsonl')!r}, mode="new") as w:
        for i in range(1000):
            w(RunFinished(8, 13, 0.2, 7, None))
except EagleLabError as exc:
    print("user error:", exc)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "user error: " in done.stdout and "run.jsonl" in done.stdout and "File too large" in done.stdout, done.stderr


# ---- the cache path ------------------------------------------------------------------------------------------


def test_a_cache_path_that_is_not_utf8_is_refused_by_name(monkeypatch) -> None:
    from eaglelab.engine.formats.assets import cache_dir

    monkeypatch.setenv("EAGLELAB_CACHE", "/tmp/caf\udce9")
    with pytest.raises(EagleLabError, match="EAGLELAB_CACHE") as err:
        cache_dir()
    assert "UTF-8" in str(err.value)


def test_a_cache_path_that_is_a_file_is_refused_by_name(monkeypatch, tmp_path) -> None:
    from eaglelab.engine.formats.assets import cache_dir

    taken = tmp_path / "cache"
    taken.write_text("my notes")
    monkeypatch.setenv("EAGLELAB_CACHE", str(taken))
    with pytest.raises(EagleLabError, match="EAGLELAB_CACHE.*not a directory"):
        cache_dir()
    assert taken.read_text() == "my notes"


# ---- a TUI that crashed --------------------------------------------------------------------------------------


def test_a_tui_that_crashed_does_not_exit_0(tmp_path) -> None:
    """Textual prints the traceback of a crashed app and returns; the command said 0 (success)."""
    import asyncio

    from eaglelab.cmd_tui import exit_code
    from eaglelab.errors import INTERNAL_ERROR_EXIT
    from eaglelab.tui.server_app import ServerApp
    from eaglelab.tui.server_feeds import LogFollower

    class Broken(ServerApp):
        def _tick_now(self) -> None:
            raise ZeroDivisionError("boom")

    async def drive(app: ServerApp) -> None:
        async with app.run_test(size=(100, 30)) as pilot:
            await pilot.pause(0.3)

    log = tmp_path / "server.log"
    log.write_text("")
    app = Broken(feed=LogFollower(log, follow=False))
    with bounded(60):
        try:
            asyncio.run(drive(app))
        except ZeroDivisionError:
            pass
    assert exit_code(app) == INTERNAL_ERROR_EXIT
    fine = ServerApp(feed=LogFollower(log, follow=False))
    with bounded(60):
        asyncio.run(drive(fine))
    assert exit_code(fine) == 0
