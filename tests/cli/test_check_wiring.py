"""`eaglelab check-wiring`: exit codes 0/1/2/4, one JSON object with --json, a readable report, no
traceback for user mistakes. Data and drafters are built from the real default target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from eaglelab.cli import main
from eaglelab.engine.formats.draft_checkpoint import expected_tensor_shapes
from eaglelab.engine.formats.draft_export import save_draft_checkpoint, sglang_config
from eaglelab.engine.formats.specforge_data import Sample, list_samples, write_sample
from tests.cli.hostile_inputs import flat

TEXTS = [
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "Paris is the capital of France; Berlin is the capital of Germany.",
    "To make bread you need flour, water, salt and yeast, then time and patience.",
    "In 1969 astronauts landed on the Moon, watched by millions on television.",
    "The mitochondria is the powerhouse of the cell, producing ATP for the body.",
    "Write a short poem about the sea, the wind, and a small boat sailing home.",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY name ASC LIMIT 10;",
]


@pytest.fixture(scope="module")
def lm():
    from eaglelab.engine.formats.loader import load_target

    return load_target("default", device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def data_dir(lm, tmp_path_factory) -> Path:
    """8 samples (<= 32 tokens) with aux slots hs[2], hs[15], hs[27] in bf16, as SpecForge writes them."""
    root = tmp_path_factory.mktemp("cli_wiring") / "data"
    seqs = [lm.tokenizer.encode(t)[:32] for t in TEXTS]
    ids = torch.zeros(len(seqs), max(map(len, seqs)), dtype=torch.long)
    for b, s in enumerate(seqs):
        ids[b, : len(s)] = torch.tensor(s)
    with torch.inference_mode():
        hs = lm.model.all_hidden_states(ids)
    for b, s in enumerate(seqs):
        t = len(s)
        aux = torch.cat([hs[i][b : b + 1, :t] for i in (2, 15, 27)], -1).bfloat16()
        write_sample(root, b, Sample(ids[b, :t].clone(), torch.ones(t, dtype=torch.long), hs[-1][b : b + 1, :t].bfloat16(), aux))
    return root


def drafter(path: Path, ids, *, weights: bool = True) -> Path:
    cfg = sglang_config(hidden_size=64, vocab_size=49152, draft_vocab_size=256, aux_layer_ids=ids, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=128, target_hidden_size=576)
    shapes = expected_tensor_shapes(hidden_size=64, aux_hidden_size=576, num_aux=3, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16, intermediate_size=128, vocab_size=49152,
                                    draft_vocab_size=256)
    tensors = {k: torch.randn(s) for k, s in shapes.items() if k not in ("d2t", "t2d")}
    tensors["d2t"] = torch.zeros(256, dtype=torch.long)
    tensors["t2d"] = torch.arange(49152) < 256
    return save_draft_checkpoint(path, cfg, tensors if weights else {})


@pytest.fixture
def cached_target(lm, monkeypatch):
    """The CLI loads the target lazily through loader.load_target: hand it the module's copy."""
    import eaglelab.engine.formats.loader as loader

    monkeypatch.setattr(loader, "load_target", lambda *a, **k: lm)
    return lm


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")


def run_json(capsys, argv) -> tuple[int, dict]:
    rc = main(["check-wiring", *argv, "--json"])
    out = capsys.readouterr().out
    return rc, json.loads(out)


@pytest.mark.slow
def test_end_to_end_right_wiring_subprocess(data_dir, tmp_path):
    """The real command: loads the default target, 8 samples, exit 0, one JSON object on stdout."""
    d = drafter(tmp_path / "d", [1, 14, 26])
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "eaglelab", "check-wiring", str(d), "--data", str(data_dir), "--json"],
                          capture_output=True, text=True, env=dict(os.environ), timeout=300)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = json.loads(proc.stdout)
    assert out["verdict"] == "ok" and [s["matched_hf_index"] for s in out["slots"]] == [2, 15, 27]
    assert all(s["similarity"] > 0.9999 for s in out["slots"])
    assert out["expected_ids"] == {"sglang": [1, 14, 26], "vllm": [2, 15, 27]}
    print(f"check-wiring end to end: {elapsed:.1f} s")


@pytest.mark.slow
def test_off_by_one_exit_1_json(cached_target, data_dir, tmp_path, capsys):
    rc, out = run_json(capsys, [str(drafter(tmp_path / "d", [1, 14, 26])), "--data", str(data_dir), "--serving", "vllm"])
    assert rc == 1 and out["verdict"] == "mismatch" and out["exit_code"] == 1
    assert [s["matched_hf_index"] for s in out["slots"]] == [2, 15, 27]
    assert [s["config_hf_index"] for s in out["slots"]] == [1, 14, 26]
    assert out["expected_ids"]["vllm"] == [2, 15, 27]
    assert out["fixes"][0]["field"] == "eagle_aux_hidden_state_layer_ids" and out["fixes"][0]["new"] == [2, 15, 27]


@pytest.mark.slow
def test_embedding_capture_rich_report(cached_target, data_dir, tmp_path, capsys):
    rc = main(["check-wiring", str(drafter(tmp_path / "d", [-1, 1, 14, 26])), "--data", str(data_dir)])
    out = flat(capsys.readouterr().out)
    assert rc == 1
    assert "WIRING WRONG" in out and "embedding output" in out and "hs[0, 2, 15, 27]" in out
    assert "eagle_config.eagle_aux_hidden_state_layer_ids: [-1, 1, 14, 26] → [1, 14, 26]" in out
    assert "SGLang/SpecForge ids [1, 14, 26], vLLM/speculators ids [2, 15, 27]" in out


def test_config_only_static(tmp_path, capsys):
    """A config alone is checked before launching a server; the target's config.json is enough."""
    target = tmp_path / "target.json"
    target.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_size": 576,
                                  "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
                                  "num_key_value_heads": 3, "max_position_embeddings": 8192}))
    rc, out = run_json(capsys, [str(drafter(tmp_path / "bad", [-1, 1, 14, 26], weights=False)), "--target", str(target)])
    assert rc == 1 and out["verdict"] == "mismatch" and out["slots"] == [] and out["expected_ids"] is None
    assert "embedding_capture" in {f["code"] for f in out["findings"]}
    assert out["engines"]["sglang"]["hf_indices"] == [0, 2, 15, 27] and out["engines"]["vllm"]["hf_indices"] == [1, 14, 26]
    rc, out = run_json(capsys, [str(drafter(tmp_path / "good", [1, 14, 26], weights=False)), "--target", str(target)])
    assert rc == 4 and out["verdict"] == "inconclusive" and out["checked"] == "static"  # never OK without a numeric check
    assert "wiring NOT checked numerically (--target is a config.json alone" in out["conclusion"]


def test_truncated_data_exit_2_without_loading_the_target(data_dir, tmp_path, capsys, monkeypatch):
    import shutil

    import eaglelab.engine.formats.loader as loader

    monkeypatch.setattr(loader, "load_target", lambda *a, **k: pytest.fail("the target must not load for bad data"))
    bad = tmp_path / "data"
    shutil.copytree(data_dir, bad)
    victim = list_samples(bad)[2]
    victim.write_bytes(victim.read_bytes()[:300])
    rc, out = run_json(capsys, [str(drafter(tmp_path / "d", [1, 14, 26])), "--data", str(bad)])
    assert rc == 2 and out["verdict"] == "error" and out["file"] == str(victim)
    rc = main(["check-wiring", str(tmp_path / "d"), "--data", str(bad)])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and str(victim) in err


def test_unreadable_config_exit_2(tmp_path, capsys):
    d = tmp_path / "d"
    d.mkdir()
    (d / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"], ')
    rc = main(["check-wiring", str(d)])
    err = flat(capsys.readouterr().err)
    assert rc == 2 and "not valid JSON" in err and "Traceback" not in err
    rc, out = run_json(capsys, [str(d)])
    assert rc == 2 and out["verdict"] == "error" and "not valid JSON" in out["error"]
    rc, out = run_json(capsys, [str(tmp_path / "missing")])
    assert rc == 2 and out["verdict"] == "error"


@pytest.mark.parametrize("serving, rc_expected", [("sglang", 0), ("vllm", 1)])
def test_live_check_runs_the_engine(cached_target, data_dir, capsys, serving, rc_expected):
    """--live: the engine's own prefill feeds the shipped drafter; the features it hands over match the
    data slot by slot when SGLang reads the ids, and match nothing when vLLM reads them one layer lower."""
    from eaglelab.draft_registry import shipped_drafter_dir

    rc, out = run_json(capsys, [str(shipped_drafter_dir()), "--data", str(data_dir), "--live", "--serving", serving])
    assert rc == rc_expected
    live = out["live"]
    if rc_expected == 0:
        assert live["verdict"] == "ok" and [s["engine_slot"] for s in live["slots"]] == [0, 1, 2]
        assert min(s["similarity"] for s in live["slots"]) > 0.999
    else:
        assert live["verdict"] == "mismatch" and out["verdict"] == "mismatch"
        assert all(s["engine_slot"] is None for s in live["slots"])
