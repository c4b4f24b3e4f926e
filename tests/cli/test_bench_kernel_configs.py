"""``eaglelab bench`` running the Triton kernels' configurations (``*-gemv``, ``*-gemv-attn``) to the end, on CPU
and without Triton.

A ``*-gemv`` row records whether the GEMV stayed on (``BenchRow.gemv``), a ``*-attn`` row the decode attention
too (``BenchRow.decode_attn``). The ``*-gemv`` line of ``run_config`` once died with an UnboundLocalError on the
H200 (a later function-local import shadowed the module-level name it uses). On a CPU these configurations are
skipped (graphs, and no Triton), so these tests let them run: the CUDA-graphs skip is lifted (the graph runner
then runs eagerly, saying why), torch.compile is left out (this checks the plumbing, not inductor on a CPU),
and the kernels report themselves available. Neither kernel is launched: every call here is on a CPU, which
both refuse (``refusal``: not CUDA), so the layers take ``F.linear`` and SDPA. A float32 model, whose calls
neither kernel takes, is skipped with the reason.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from eaglelab.bench import harness
from eaglelab.cli import main
from eaglelab.engine.model import decode_attention as A
from eaglelab.engine.model import gemv as G
from eaglelab.engine.runtime.reasons import EAGER_NO_CUDA

pytestmark = pytest.mark.usefixtures("one_thread")
GEMV, ATTN = "plain-graphs-gemv", "plain-compile-gemv-attn"


@pytest.fixture()
def questions(tmp_path):
    path = tmp_path / "question.jsonl"
    turns = ["Write a haiku about the sea.", "What is 12 times 12?"]
    path.write_text("".join(json.dumps({"question_id": i, "turns": [t]}) + "\n" for i, t in enumerate(turns)))
    return path


@pytest.fixture()
def kernels_run_on_cpu(monkeypatch):
    """Every skip reason but the CUDA-graphs one, no compile, and kernels that find Triton."""
    real_skip = harness._skip_reason
    monkeypatch.setattr(harness, "_skip_reason", lambda cfg, ctx: real_skip(dataclasses.replace(cfg, graphs=False), ctx))
    monkeypatch.setitem(harness.CONFIGS, ATTN, dataclasses.replace(harness.CONFIGS[ATTN], compile=False))
    monkeypatch.setattr(G, "triton_unavailable", lambda: None)
    monkeypatch.setattr(A, "triton_unavailable", lambda: None)


def _bench(tmp_path, questions, dtype: str, config: str):
    out = tmp_path / f"bench_{dtype}.json"
    rc = main([
        "bench", "--scale-model", "tiny", "--device", "cpu", "--dtype", dtype, "--questions", str(questions),
        "--configs", f"plain-eager,{config}", "--batch-sizes", "1", "--prompts", "2",
        "--max-new-tokens", "4", "--repeats", "1", "--no-micro", "--json", str(out),
    ])
    return rc, out


def test_a_gemv_config_runs_to_the_end_and_records_the_gemv(tmp_path, questions, capsys, kernels_run_on_cpu):
    rc, out = _bench(tmp_path, questions, "bfloat16", GEMV)
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "internal error" not in printed.err and "Traceback" not in printed.err
    rows = {r["config"]: r for r in json.loads(out.read_text())["rows"]}
    gemv = rows[GEMV]
    assert gemv["skipped"] is None and gemv["gemv"] == "on"
    assert gemv["tokens"] == 2 * 4 and gemv["tok_per_s"] > 0  # both prompts, 4 tokens each
    assert gemv["graph"] == {"decode": EAGER_NO_CUDA}  # the graph runner ran eagerly and said why
    assert gemv["same_tokens_as_plain_eager"] == 1.0  # F.linear under the GEMV's refusal: the same tokens
    assert rows["plain-eager"]["gemv"] is None  # not a *-gemv configuration


def test_a_gemv_config_on_a_float32_model_is_skipped_with_the_reason(tmp_path, questions, capsys, kernels_run_on_cpu):
    """Every call of a float32 model is refused: the row would measure plain-graphs again, reading "gemv on"."""
    rc, out = _bench(tmp_path, questions, "float32", GEMV)
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    rows = {r["config"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows[GEMV]["skipped"] == "float32 weights (the GEMV takes bfloat16 or float16)"
    assert rows["plain-eager"]["skipped"] is None


def test_an_attn_config_runs_to_the_end_and_records_both_kernels(tmp_path, questions, capsys, kernels_run_on_cpu):
    rc, out = _bench(tmp_path, questions, "bfloat16", ATTN)
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "internal error" not in printed.err and "Traceback" not in printed.err
    report = json.loads(out.read_text())
    rows = {r["config"]: r for r in report["rows"]}
    row = rows[ATTN]
    assert row["skipped"] is None and row["gemv"] == "on" and row["decode_attn"] == "on"
    assert row["tokens"] == 2 * 4 and row["tok_per_s"] > 0  # both prompts
    assert row["graph"] == {"decode": EAGER_NO_CUDA}
    assert row["same_tokens_as_plain_eager"] == 1.0  # SDPA and F.linear under the kernels' refusals
    assert rows["plain-eager"]["decode_attn"] is None
    assert report["decode_attention"]["reason"] is None and report["decode_attention"]["checked"] == []


def test_an_attn_config_on_a_float32_model_is_skipped_with_the_reason(tmp_path, questions, capsys, kernels_run_on_cpu,
                                                                      monkeypatch):
    """With the GEMV's own dtype refusal out of the way, the decode attention's is the reason."""
    monkeypatch.setattr(G, "dtype_refusal", lambda dtype: None)
    rc, out = _bench(tmp_path, questions, "float32", ATTN)
    assert rc == 0, capsys.readouterr().err
    rows = {r["config"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows[ATTN]["skipped"] == "float32 weights (the decode attention takes bfloat16 or float16)"
