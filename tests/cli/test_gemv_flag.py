"""`eaglelab run --gemv` where the kernel cannot run: the run goes on with F.linear and says why."""

from __future__ import annotations

import pytest

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


def test_gemv_on_a_cpu_is_off_with_the_reason(tiny_dir, capsys):
    rc, text = _run(tiny_dir, capsys)
    assert rc == 0 and "Traceback" not in text
    assert "--gemv: off on cpu (a CUDA kernel), F.linear instead" in " ".join(text.split())


def test_gemv_without_triton_is_off_with_the_reason(tiny_dir, capsys, monkeypatch):
    def no_triton():
        raise ImportError("No module named 'triton'")

    monkeypatch.setattr(G, "load_op", no_triton)
    rc, text = _run(tiny_dir, capsys)
    assert rc == 0 and "Traceback" not in text
    assert ("--gemv: off, F.linear instead: Triton GEMV unavailable (ImportError: No module named 'triton')"
            in " ".join(text.split()))
