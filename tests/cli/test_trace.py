"""`eaglelab trace` writes a profiler trace holding one range per phase, with distributedInfo."""

from __future__ import annotations

import json

import pytest


@pytest.mark.slow
def test_trace_has_phase_ranges(tmp_path, default_target):
    from eaglelab.cli import main

    rc = main(["trace", "--logdir", str(tmp_path), "--max-new-tokens", "5", "--draft", "ngram", "Count: 1 2 3 1 2 3"])
    assert rc == 0
    (trace_file,) = list(tmp_path.glob("*.pt.trace.json"))
    trace = json.loads(trace_file.read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"prefill", "draft", "verify", "accept", "draft_extend"} <= names
    assert trace["distributedInfo"]["rank"] == 0
