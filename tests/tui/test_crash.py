"""An error that ends the TUI is reported as every command reports one, not as Textual's wall of frames: a
user's mistake as a clear message (exit 2), a bug of ours as one line naming the file holding the traceback."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual.app import App

from eaglelab.cli import main
from eaglelab.engine.errors import EagleLabError
from eaglelab.tui.app import EagleLabApp
from tests.cli.hostile_inputs import make_record


@pytest.fixture
def headless(monkeypatch):
    """The command's ``app.run()`` without a terminal (what a user sees is what it prints after)."""
    real = App.run
    monkeypatch.setattr(App, "run", lambda self, **kw: real(self, headless=True, **kw))


def _tui(record: Path, capfd) -> tuple[int, str]:
    capfd.readouterr()
    rc = main(["tui", str(record)])
    out, err = capfd.readouterr()
    return rc, out + err


def test_a_users_mistake_inside_the_tui_is_a_clear_message(headless, monkeypatch, tmp_path, capfd):
    def bad(self, message):
        raise EagleLabError("not a run record", file=self.record, field="type", found="x", expected="run_started")

    monkeypatch.setattr(EagleLabApp, "on_record_loaded", bad)
    rc, text = _tui(make_record(tmp_path / "run.jsonl"), capfd)
    assert rc == 2, text
    assert "not a run record" in text and "run.jsonl" in text
    assert "Traceback" not in text and "locals" not in text.lower(), text


def test_a_bug_inside_the_tui_is_one_line_and_a_traceback_file(headless, monkeypatch, tmp_path, capfd):
    def bug(self, message):
        raise ZeroDivisionError("a bug of ours")

    monkeypatch.setattr(EagleLabApp, "on_record_loaded", bug)
    rc, text = _tui(make_record(tmp_path / "run.jsonl"), capfd)
    assert rc == 3, text
    assert "Traceback" not in text and "╭" not in text, text  # neither Python's nor Textual's frames
    found = re.search(r"full traceback in (\S+eaglelab-tui-crash-\S+\.txt)", " ".join(text.split()))
    assert found, text
    saved = Path(found.group(1)).read_text()
    assert "ZeroDivisionError: a bug of ours" in saved and "in bug" in saved
    Path(found.group(1)).unlink()


def test_a_clean_quit_is_still_0(headless, monkeypatch, tmp_path, capfd):
    monkeypatch.setattr(EagleLabApp, "on_record_loaded", lambda self, message: self.exit(0))
    rc, text = _tui(make_record(tmp_path / "run.jsonl"), capfd)
    assert rc == 0 and "Traceback" not in text, text
