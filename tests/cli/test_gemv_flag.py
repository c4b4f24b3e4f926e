"""`eaglelab run --gemv` where the kernel cannot run: the run goes on with F.linear and says why."""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.model import gemv as G
from tests.conftest import add_word_tokenizer, random_model, save_hf_dir, tiny_config


@pytest.fixture
def tiny_dir(tmp_path):
    cfg = tiny_config()
    path = save_hf_dir(random_model(cfg), cfg, tmp_path / "tiny")
    add_word_tokenizer(path, vocab=cfg["vocab_size"])
    return path


def _run(tiny_dir, capsys) -> tuple[int, str]:
    from eaglelab.cli import main

    rc = main(["run", "w1 w2 w3", "--model", str(tiny_dir), "--device", "cpu", "--draft", "none",
               "--max-new-tokens", "3", "--gemv"])
    out = capsys.readouterr()
    return rc, out.out + out.err


def test_gemv_on_a_cpu_is_off_with_the_reason(tiny_dir, capsys, monkeypatch):
    monkeypatch.setattr(G, "triton_unavailable", lambda: None)  # Triton found (or not): the device is the reason
    rc, text = _run(tiny_dir, capsys)
    assert rc == 0 and "Traceback" not in text
    assert "--gemv: off on cpu (a CUDA kernel), F.linear instead" in " ".join(text.split())


def _no_triton():
    raise ImportError("No module named 'triton'")


def test_gemv_on_a_cpu_without_triton_names_the_device_not_triton(tiny_dir, capsys, monkeypatch):
    # Once "Triton GEMV unavailable", as if installing Triton would help: the GEMV is CUDA-only.
    monkeypatch.setattr(G, "load_op", _no_triton)
    rc, text = _run(tiny_dir, capsys)
    text = " ".join(text.split())
    assert rc == 0 and "Traceback" not in text
    assert "--gemv: off on cpu (a CUDA kernel), F.linear instead" in text and "Triton" not in text


def test_gemv_on_cuda_without_triton_is_off_with_the_reason(monkeypatch):
    """On a CUDA device the missing Triton is the reason."""
    from types import SimpleNamespace

    from eaglelab.session import _add_gemv

    monkeypatch.setattr(G, "load_op", _no_triton)
    s = SimpleNamespace(target=SimpleNamespace(device=torch.device("cuda"), dtype=torch.bfloat16), kernels=None,
                        notes=[])
    _add_gemv(s, log=lambda m: None)
    assert s.notes == ["--gemv: off, F.linear instead: Triton GEMV unavailable (ImportError: No module named 'triton')"]
    assert s.kernels.gemv.reason is not None  # every call takes F.linear


def test_headline_reads_every_plain_config_against_the_bandwidth_bound():
    """15 GB of weights per token at 4.3 TB/s: a bound of 286.7 tok/s. The baseline plain-graphs (118.2 tok/s,
    6.5 ms decodes) is 41% of it; plain-compile-gemv (240 tok/s, 4 ms decodes = 250 tok/s) 84% end to end,
    87% per step; a skipped config and batch 8 do not count."""
    from eaglelab.bench.harness import BenchRow, headline
    from eaglelab.cmd_bench import _headline_lines

    rows = [BenchRow("plain-graphs", 1, tok_per_s=118.2, decode_ms=6.5),
            BenchRow("plain-compile-gemv", 1, tok_per_s=240.0, decode_ms=4.0),
            BenchRow("plain-compile-gemv", 8, tok_per_s=1500.0, decode_ms=5.0),
            BenchRow("plain-graphs-gemv", 1, skipped="Triton GEMV unavailable")]
    h = headline(rows, [], 15_000_000_000, 4.3)["bandwidth_bound_batch1"]
    assert h["bound_tok_per_s"] == pytest.approx(286.67, abs=0.01)
    assert set(h["plain_configs"]) == {"plain-graphs", "plain-compile-gemv"}
    gemv = h["plain_configs"]["plain-compile-gemv"]
    assert gemv["fraction"] == pytest.approx(240 / 286.67, abs=1e-4)
    assert gemv["decode_step_fraction"] == pytest.approx(250 / 286.67, abs=1e-4)
    lines = _headline_lines(headline(rows, [], 15_000_000_000, 4.3))
    assert "    plain-compile-gemv: 240.0 tok/s = 84% of the bound (87% per decode step)" in lines


@pytest.mark.parametrize("dtype, note", [
    (torch.float32, "--gemv: off for float32 weights (the GEMV takes bfloat16 or float16), F.linear instead"),
    (torch.bfloat16, "--gemv: projections of <= 16 rows on the Triton GEMV (bf16/fp16)")])
def test_gemv_on_cuda_notes_a_float32_model_as_off(monkeypatch, dtype, note):
    """On CUDA with Triton, a float32 model's calls are all refused (gemv.refusal): the note says off, and why."""
    from types import SimpleNamespace

    from eaglelab.session import _add_gemv

    monkeypatch.setattr(G, "triton_unavailable", lambda: None)
    s = SimpleNamespace(target=SimpleNamespace(device=torch.device("cuda"), dtype=dtype), kernels=None, notes=[])
    _add_gemv(s, log=lambda m: None)
    assert s.notes == [note] and s.kernels.gemv is not None
