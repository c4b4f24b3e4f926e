"""`eaglelab run --gemv`: the few-row kernel of the device (Triton on CUDA, C on CPU); where it cannot run, the
run goes on with F.linear (MKL) and says why."""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.model import gemv as G


def _run(tiny_dir, capsys, *flags: str) -> tuple[int, str]:
    from eaglelab.cli import main

    rc = main(["run", "w1 w2 w3", "--model", str(tiny_dir), "--device", "cpu", "--max-new-tokens", "3",
               *(flags if "--draft" in flags else ("--draft", "none", *flags))])
    out = capsys.readouterr()
    return rc, " ".join((out.out + out.err).split())


def _no_triton():
    raise ImportError("No module named 'triton'")


@pytest.mark.parametrize("flags", [("--gemv",), ("--draft", "ngram")])
def test_on_a_cpu_the_gemv_is_the_c_kernel_and_triton_is_never_asked(tiny_dir, capsys, monkeypatch, flags):
    """On CPU the few-row kernel is the C one, asked for or on by default when speculating (Triton, a CUDA kernel,
    is not the reason of anything)."""
    from eaglelab.engine.model.cpu_gemm import CpuGemm

    monkeypatch.setattr(G, "load_op", _no_triton)
    monkeypatch.setenv("EAGLELAB_CACHE", str(tiny_dir.parent / "cache"))
    if CpuGemm(tiny_dir.parent / "cache").reason is not None:
        pytest.skip("no C compiler here")
    rc, text = _run(tiny_dir, capsys, *flags)
    assert rc == 0 and "Traceback" not in text and "Triton" not in text
    assert "projections of <= 256 rows (decode, verify, short prompts) on the few-row CPU kernel" in text


def test_on_a_cpu_without_a_compiler_the_run_goes_on_with_mkl_and_says_why(tiny_dir, capsys, monkeypatch):
    monkeypatch.setenv("CC", "no-such-cc-for-eaglelab")
    monkeypatch.setenv("EAGLELAB_CACHE", str(tiny_dir.parent / "cache"))
    rc, text = _run(tiny_dir, capsys, "--draft", "ngram")
    assert rc == 0 and "Traceback" not in text
    assert "few-row CPU kernel off (no C compiler: 'no-such-cc-for-eaglelab' not found): MKL instead" in text


@pytest.mark.parametrize("flags", [("--draft", "ngram", "--no-gemv"), ()])
def test_no_gemv_or_plain_decoding_on_a_cpu_runs_mkl(tiny_dir, capsys, monkeypatch, flags):
    """--no-gemv, or plain decoding by default where the kernel cannot be built (said nowhere: plain decoding
    never needed it)."""
    monkeypatch.setenv("CC", "no-such-cc-for-eaglelab")  # nothing built: no note of a missing compiler
    rc, text = _run(tiny_dir, capsys, *flags)
    assert rc == 0 and "few-row" not in text


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
    from eaglelab.bench.harness import BenchRow
    from eaglelab.bench.report import headline
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
    (torch.bfloat16, "--gemv: projections of <= 256 rows on the Triton GEMV (bf16/fp16; F.linear per shape where it is "
                     "faster)")])
def test_gemv_on_cuda_notes_a_float32_model_as_off(monkeypatch, dtype, note):
    """On CUDA with Triton, a float32 model's calls are all refused (gemv.refusal): the note says off, and why."""
    from types import SimpleNamespace

    from eaglelab.session import _add_gemv

    monkeypatch.setattr(G, "triton_unavailable", lambda: None)
    s = SimpleNamespace(target=SimpleNamespace(device=torch.device("cuda"), dtype=dtype), kernels=None, notes=[])
    _add_gemv(s, log=lambda m: None)
    assert s.notes == [note] and s.kernels.gemv is not None


def _timed(monkeypatch, one_row_ms: float, verify_ms: float, calls: list | None = None) -> None:
    """time_rows reads ``one_row_ms`` on the kernel at one row, ``verify_ms`` at more, and 5.0 ms on MKL."""
    from eaglelab.engine.model import cpu_gemm as C

    def timed(gemm, weights, rows=(1,)):
        if calls is not None:
            calls.extend(rows)
        return tuple(C.Timed(one_row_ms if r == 1 else verify_ms, 5.0) for r in rows)

    monkeypatch.setattr(C, "time_rows", timed)


@pytest.mark.parametrize("verify_ms, spec_on_kernel", [(1.0, True), (9.0, False)])
def test_bench_on_a_cpu_runs_its_eager_configs_on_the_c_kernel_as_run_does(tiny_dir, tmp_path, monkeypatch, capsys,
                                                                          verify_ms, spec_on_kernel):
    """`bench --model DIR` on CPU: each eager config's runner holds what run's engines of its side hold: the few-row
    kernel where it timed faster (the speculative config at the verify's rows), else MKL (a --scale-model bench
    builds no session: MKL). Here one row timed faster on MKL, the verify's rows either way."""
    import json

    from eaglelab.bench import harness as B
    from eaglelab.cli import main
    from eaglelab.engine.model.cpu_gemm import CpuGemm

    monkeypatch.setenv("EAGLELAB_CACHE", str(tmp_path / "cache"))
    if CpuGemm(tmp_path / "cache").reason is not None:
        pytest.skip("no C compiler here")
    _timed(monkeypatch, 9.0, verify_ms)
    seen = []
    made = B.FixedCacheEagerRunner.__init__

    def spy(self, target, drafter, max_len, kernels=B.EAGER_KERNELS):
        seen.append(kernels.gemv)
        made(self, target, drafter, max_len, kernels)

    monkeypatch.setattr(B.FixedCacheEagerRunner, "__init__", spy)
    questions = tmp_path / "q.jsonl"
    questions.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["w1 w2 w3"]}) + "\n")
    rc = main(["bench", "--model", str(tiny_dir), "--device", "cpu", "--draft", "ngram", "--configs", "plain-eager,spec-decode",
               "--batch-sizes", "1", "--prompts", "1", "--max-new-tokens", "3", "--repeats", "1", "--questions",
               str(questions), "--micro-batch-sizes", "1", "--micro-context", "8"])
    assert rc == 0, capsys.readouterr().err
    assert len(seen) == 2, seen  # plain-eager, then spec-decode
    assert seen[0] is None, "the plain config runs on MKL, as a --draft none run"
    assert isinstance(seen[1], CpuGemm) == spec_on_kernel, seen[1]


@pytest.mark.parametrize("flags, one_row_ms, verify_ms, plain_on_kernel, spec_on_kernel, timed", [
    ((), 9.0, 1.0, False, True, True),  # the common case: MKL at one row, the kernel at a verify's rows
    ((), 1.0, 9.0, True, False, True),  # a CPU where the kernel loses at more rows
    (("--gemv",), 9.0, 9.0, True, True, False),  # asked for everywhere: nothing timed
    (("--no-gemv",), 1.0, 1.0, False, False, False),
])
def test_each_side_of_a_cpu_speculative_run_takes_what_timed_faster(tiny_dir, tmp_path, monkeypatch, flags, one_row_ms,
                                                                    verify_ms, plain_on_kernel, spec_on_kernel, timed):
    """Speculating on CPU, the speculative engines take the C kernel where the verify's rows (draft tokens and lookup
    tokens) through the projections timed faster on it than on MKL, and the plain baseline where one row did (as
    `--draft none` would); --gemv asks for it everywhere, --no-gemv nowhere, untimed. Each timing leaves a note."""
    import argparse

    from eaglelab.engine.model.cpu_gemm import CpuGemm
    from eaglelab.session import add_engine_args, build_session

    monkeypatch.setenv("EAGLELAB_CACHE", str(tmp_path / "cache"))
    if CpuGemm(tmp_path / "cache").reason is not None:
        pytest.skip("no C compiler here")
    calls = []
    _timed(monkeypatch, one_row_ms, verify_ms, calls)
    p = argparse.ArgumentParser()
    add_engine_args(p)
    s = build_session(p.parse_args(["--model", str(tiny_dir), "--device", "cpu", "--draft", "ngram", *flags]),
                      log=lambda m: None)

    def on_kernel(engine) -> bool:
        return engine.runner is not None and isinstance(engine.runner.kernels.gemv, CpuGemm)

    assert on_kernel(s.engine()) == spec_on_kernel and on_kernel(s.plain_engine()) == plain_on_kernel
    rows = s.spec.draft_tokens + s.spec.lookup_tokens
    assert calls == ([rows, 1] if timed else []) and rows > 1
    if timed:
        verify = next(n for n in s.notes if n.startswith("gemv: speculation"))
        assert f"the verify's {rows} rows through every projection {verify_ms:.1f} ms on the kernel, 5.0 ms on MKL" \
            in verify and ("on the few-row CPU kernel" in verify) == spec_on_kernel


@pytest.mark.parametrize("kernel_ms, said", [(1.0, "plain decoding on the few-row CPU kernel"),
                                             (9.0, "plain decoding on MKL")])
def test_plain_decoding_on_a_cpu_takes_what_timed_faster_at_one_row(tiny_dir, capsys, monkeypatch, kernel_ms, said):
    """--draft none with no --gemv flag: the kernel is built quietly and plain decoding takes it only where one row
    through the projections timed faster on it than on MKL; the run says which, with both times."""
    from eaglelab.engine.model import cpu_gemm as C

    monkeypatch.setenv("EAGLELAB_CACHE", str(tiny_dir.parent / "cache"))
    if C.CpuGemm(tiny_dir.parent / "cache").reason is not None:
        pytest.skip("no C compiler here")
    _timed(monkeypatch, kernel_ms, kernel_ms)
    rc, text = _run(tiny_dir, capsys)
    assert rc == 0 and said in text and f"{kernel_ms:.1f} ms on the kernel, 5.0 ms on MKL" in text
