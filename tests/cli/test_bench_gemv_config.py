"""``eaglelab bench`` running a ``*-gemv`` configuration to the end, on CPU and without Triton.

A ``*-gemv`` row records whether the GEMV stayed on (``BenchRow.gemv``). That line of ``run_config``
once died with an UnboundLocalError on the H200 (a later function-local import shadowed the
module-level name it uses). On a CPU the configuration is skipped (graphs, and no Triton), so this
test lets it run: the CUDA-graphs skip is lifted (the graph runner then runs eagerly, saying why)
and the GEMV reports itself available. Its kernel is never launched: every call here is bfloat16
on a CPU, which the GEMV refuses (``gemv.refusal``: not CUDA), so the projections take ``F.linear``.
A float32 model, whose calls the GEMV never takes, is skipped with the reason.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from eaglelab.bench import harness
from eaglelab.cli import main
from eaglelab.engine.model import gemv as G
from eaglelab.engine.runtime.reasons import EAGER_NO_CUDA

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture()
def questions(tmp_path):
    path = tmp_path / "question.jsonl"
    turns = ["Write a haiku about the sea.", "What is 12 times 12?"]
    path.write_text("".join(json.dumps({"question_id": i, "turns": [t]}) + "\n" for i, t in enumerate(turns)))
    return path


@pytest.fixture()
def gemv_runs_on_cpu(monkeypatch):
    """Every skip reason but the CUDA-graphs one, and a GEMV that finds Triton."""
    real_skip = harness._skip_reason
    monkeypatch.setattr(harness, "_skip_reason", lambda cfg, ctx: real_skip(dataclasses.replace(cfg, graphs=False), ctx))
    monkeypatch.setattr(G, "triton_unavailable", lambda: None)


def _bench(tmp_path, questions, dtype: str):
    out = tmp_path / f"bench_{dtype}.json"
    rc = main([
        "bench", "--scale-model", "tiny", "--device", "cpu", "--dtype", dtype, "--questions", str(questions),
        "--configs", "plain-eager,plain-graphs-gemv", "--batch-sizes", "1", "--prompts", "2",
        "--max-new-tokens", "4", "--repeats", "1", "--no-micro", "--json", str(out),
    ])
    return rc, out


def test_a_gemv_config_runs_to_the_end_and_records_the_gemv(tmp_path, questions, capsys, gemv_runs_on_cpu):
    rc, out = _bench(tmp_path, questions, "bfloat16")
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "internal error" not in printed.err and "Traceback" not in printed.err
    rows = {r["config"]: r for r in json.loads(out.read_text())["rows"]}
    gemv = rows["plain-graphs-gemv"]
    assert gemv["skipped"] is None and gemv["gemv"] == "on"
    assert gemv["tokens"] == 4 and gemv["tok_per_s"] > 0
    assert gemv["graph"] == {"decode": EAGER_NO_CUDA}  # the graph runner ran eagerly and said why
    assert gemv["same_tokens_as_plain_eager"] == 1.0  # F.linear under the GEMV's refusal: the same tokens
    assert rows["plain-eager"]["gemv"] is None  # not a *-gemv configuration


def test_a_gemv_config_on_a_float32_model_is_skipped_with_the_reason(tmp_path, questions, capsys, gemv_runs_on_cpu):
    """Every call of a float32 model is refused: the row would measure plain-graphs again, reading "gemv on"."""
    rc, out = _bench(tmp_path, questions, "float32")
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    rows = {r["config"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["plain-graphs-gemv"]["skipped"] == "float32 weights (the GEMV takes bfloat16 or float16)"
    assert rows["plain-eager"]["skipped"] is None
