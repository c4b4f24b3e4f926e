"""Programmatic dependent launch (``engine/model/pdl.py``): every kernel of ours waits on entry when launched
dependently and is unchanged otherwise (compiled for sm_90 without a GPU), the launch switch, the phase compiler's
options, what a CPU says, and (on a Hopper GPU) the same tokens with and without it."""

from __future__ import annotations

import inspect

import pytest
import torch

from eaglelab.engine.model import pdl

from tests.conftest import has_triton


def _ptx(fn, const: dict, types: dict[str, str], warps: int, launch_pdl: bool) -> str:
    """``fn`` compiled for sm_90 with these constexprs (pointers as ``types`` says, other arguments i32)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = list(inspect.signature(fn.fn).parameters)
    sig = {n: "constexpr" if n in const else types.get(n, "i32") for n in names}
    src = ASTSource(fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in const.items()})
    options = {"num_warps": warps} | ({"launch_pdl": True} if launch_pdl else {})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    assert bool(getattr(kernel.metadata, "launch_pdl", False)) == launch_pdl
    return kernel.asm["ptx"]


def _kernels():
    """(name, kernel, constexprs, pointer types, warps) for each of our kernels, at one shape each."""
    from eaglelab.engine.model import decode_attention_kernels as A
    from eaglelab.engine.model import gemv_kernels as G
    from eaglelab.engine.runtime import cycle_kernels as C

    bf16 = {n: "*bf16" for n in ("x_ptr", "w_ptr", "b_ptr", "y_ptr", "q_ptr", "k_ptr", "v_ptr", "out_ptr")}
    f32 = {n: "*fp32" for n in ("part_ptr", "acc_ptr", "ml_ptr", "val_ptr", "peak_ptr", "mass_ptr", "score_ptr")}
    i64 = {n: "*i64" for n in ("pred_ptr", "tok_ptr", "par_ptr", "dep_ptr", "len_ptr", "acc_len_ptr", "path_ptr",
                               "out_tok_ptr", "bonus_ptr", "count_ptr", "new_root_ptr", "eos_ptr", "n_out_ptr",
                               "limit_ptr", "root_ptr", "emitted_ptr", "cand_ptr", "sel_ptr")}
    other = {"ticket_ptr": "*i32", "idx_ptr": "*i32", "mask_ptr": "*u8", "done_ptr": "*i1", "hit_ptr": "*i1",
             "active_ptr": "*i1", "qk_scale": "fp32"}
    attn_out = {"out_ptr": "*bf16"}
    types = bf16 | f32 | i64 | other
    commit_types = types | {"mask_ptr": "*i1", "out_ptr": "*i64"}
    return [
        ("gemv, one row", G.gemv_kernel, {"HAS_BIAS": False, "SPLITS": 1, "BLOCK_M": 1, "BLOCK_N": 16, "BLOCK_K": 256,
                                          "STAGES": 3, "EARLY": 0}, types, 4),
        ("gemv, 24 rows split along K", G.gemv_kernel, {"HAS_BIAS": True, "SPLITS": 2, "BLOCK_M": 32, "BLOCK_N": 16,
                                                        "BLOCK_K": 128, "STAGES": 3, "EARLY": 0}, types, 4),
        ("gemv, 4 rows on the CUDA cores", G.gemv_kernel, {"HAS_BIAS": False, "SPLITS": 1, "BLOCK_M": 4, "BLOCK_N": 8,
                                                           "BLOCK_K": 128, "STAGES": 3, "EARLY": 0}, types, 4),
        ("decode attention", A.attention_kernel, {"BLOCK_M": 16, "BLOCK_S": 64, "HEAD_D": 64, "SPLITS": 4,
                                                  "ROUNDS": 2, "PARTIAL": True, "ROW_BLOCKS": 1}, types | attn_out, 4),
        ("decode attention, merged in the launch", A.attention_kernel, {
            "BLOCK_M": 16, "BLOCK_S": 64, "HEAD_D": 64, "SPLITS": 4, "ROUNDS": 2, "PARTIAL": True, "ROW_BLOCKS": 1,
            "MERGE": True}, types | attn_out, 4),
        ("attention merge", A.attention_combine_kernel, {"BLOCK_SPLITS": 4, "HEAD_D": 64}, types | attn_out, 1),
        ("greedy commit", C.greedy_commit_kernel, {"NP": 32, "DP": 8, "HP": 4, "HDP": 64, "COMPACT": True,
                                                   "HAS_V": True}, commit_types, 4),
        ("emit and advance", C.emit_advance_kernel, {"KP": 8, "EP": 2, "HAS_COUNT": True}, commit_types, 1),
        ("expansion blocks", C.expand_blocks_kernel, {"CHUNK": 256, "K": 4, "KP": 4}, types, 4),
        ("expansion select", C.expand_select_kernel, {"K": 4, "FP": 4, "KP": 4, "CP": 64, "CKP": 256}, types, 4),
        ("expansion in one launch", C.expand_kernel, {"CHUNK": 256, "K": 4, "KP": 4, "FP": 4, "CP": 64, "CKP": 256},
         types, 4),
    ]


def _first(ptx: str, *ops: str) -> int:
    """Where the first of ``ops`` is in ``ptx`` (its length when none is)."""
    return min([i for i in (ptx.find(op) for op in ops) if i >= 0] or [len(ptx)])


@pytest.mark.skipif(not has_triton(), reason="Triton not installed (it ships with CUDA builds of torch)")
def test_every_kernel_waits_on_entry_only_when_launched_dependently():
    """With PDL each kernel's PTX waits for the kernel before (griddepcontrol.wait) and lets the next launch, and the
    wait comes before its first global load or store; without, neither instruction is there. The GEMV's early
    weights (EARLY: one tile or two) are loads before the wait (the compiler kept them there), and still no store
    or atomic."""
    for name, fn, const, types, warps in _kernels():
        on = _ptx(fn, const | {"PDL": True}, types, warps, launch_pdl=True)
        off = _ptx(fn, const | {"PDL": False}, types, warps, launch_pdl=False)
        assert "griddepcontrol.wait" in on and "griddepcontrol.launch_dependents" in on, name
        assert "griddepcontrol" not in off, name
        assert on.find("griddepcontrol.wait") < _first(on, "ld.global", "st.global", "atom.global"), name
        for tiles in (1, 2) if name.startswith("gemv") else ():
            early = _ptx(fn, const | {"PDL": True, "EARLY": tiles}, types, warps, launch_pdl=True)
            wait = early.find("griddepcontrol.wait")
            assert 0 < _first(early, "ld.global") < wait < _first(early, "st.global", "atom.global"), name
            ahead = [line for line in early[:wait].splitlines() if "ld.global" in line]
            assert all("evict_first" in line for line in ahead), name  # the weights' loads (x's carry no hint)
            if tiles == 2:  # the second tile's loads are ahead of the wait too
                assert len(ahead) > len(once), (name, len(ahead), len(once))
            once = ahead


def test_the_launch_switch_nests_and_adds_launch_pdl_only_inside():
    off, on = {"PDL": False}, {"PDL": True, "launch_pdl": True}
    assert not pdl.active() and pdl.launch_options() == off and pdl.launch_options(True) == on
    with pdl.dependent_launches(True):
        assert pdl.active() and pdl.launch_options() == on and pdl.launch_options(False) == off
        with pdl.dependent_launches(False):
            assert not pdl.active() and pdl.launch_options() == off
        assert pdl.active()
    assert not pdl.active()
    with pytest.raises(RuntimeError), pdl.dependent_launches(True):
        raise RuntimeError("a failed capture")
    assert not pdl.active()  # restored after an error too


@pytest.mark.skipif(not has_triton(), reason="needs Triton")
def test_the_gemv_op_loads_two_tiles_early_at_one_row_and_one_at_more(monkeypatch):
    """Dependent launches take the row rule (two weight tiles before the wait for a decode's one row, one for a
    verify's or a draft step's rows); plain launches none. The shares' op (gemv_shares) launches alike."""
    from eaglelab.engine.model import gemv_kernels as G
    seen = []
    monkeypatch.setattr(G, "launch", lambda x, w, b, cfg, dependent, early, shares:
                        seen.append((x.shape[0], dependent, early, shares)))
    w = torch.zeros(8, 16)
    for rows in (1, 4, 40):
        G.gemv(torch.zeros(rows, 16), w, None, 8, 16, 1, 4, 3)
        with pdl.dependent_launches(True):
            G.gemv(torch.zeros(rows, 16), w, None, 8, 16, 1, 4, 3)
            G.gemv_shares(torch.zeros(rows, 16), w, 8, 16, 2, 4, 3)
    assert seen == [(1, False, 0, False), (1, True, 2, False), (1, True, 2, True),
                    (4, False, 0, False), (4, True, 1, False), (4, True, 1, True),
                    (40, False, 0, False), (40, True, 1, False), (40, True, 1, True)]


def test_cpu_is_refused_with_the_reason():
    assert pdl.refusal("cpu") == "PDL is a CUDA feature (cpu device)"


def test_phase_compiler_asks_inductor_for_pdl_code_and_keeps_the_mode():
    from eaglelab.engine.runtime.compile import CompileLog, PhaseCompiler, phase_options

    opts = phase_options(None, pdl=True)
    assert opts == {"fullgraph": True, "dynamic": False, "options": {"triton.enable_pdl": True}}
    tuned = phase_options("max-autotune-no-cudagraphs", pdl=True)["options"]
    assert tuned["triton.enable_pdl"] and tuned["max_autotune"] and not tuned.get("triton.cudagraphs", False)
    if pdl.software_refusal() is None:  # this torch's inductor takes the option: a phase compiles with it
        phase = PhaseCompiler(CompileLog(None), pdl=True)("decode", lambda x: (x * 2 + 1,))
        out = phase(torch.ones(3))  # on a CPU inductor takes the option and generates no PDL code
        assert phase.reason is None and torch.equal(out[0], torch.full((3,), 3.0))


def test_compiled_kernels_carry_pdl_into_the_runner_pieces():
    import tempfile
    from pathlib import Path

    from eaglelab.engine.runtime.compile import compiled_kernels

    with tempfile.TemporaryDirectory() as d:
        k = compiled_kernels(Path(d), pdl=True)
    assert k.pdl and k.compile_phase.pdl and k.eager_pieces().pdl
    assert not compiled_kernels(Path(d)).pdl


cuda_pdl = pytest.mark.skipif(not torch.cuda.is_available() or pdl.refusal("cuda") is not None,
                              reason="needs a CUDA GPU of compute capability 9.0+ with PDL support")


@pytest.mark.gpu
@cuda_pdl
def test_same_tokens_with_and_without_dependent_launches():
    """bf16 on a Hopper GPU, compiled phases with our GEMV and decode attention, plain decoding and a one-graph
    speculative cycle: the graphs with dependent launches give the same tokens and accepted lengths as without
    (launches overlap, memory effects never do)."""
    from dataclasses import replace

    from eaglelab.engine.model.decode_attention import TritonDecodeAttention
    from eaglelab.engine.model.gemv import TritonGemv
    from eaglelab.engine.runtime.compile import compiled_kernels
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner
    from eaglelab.engine.runtime.drafters import Eagle3Drafter
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.engine.runtime.spec_config import SpecConfig
    from tests.conftest import random_model
    from tests.engine.runtime.test_speculative import CFG, PROMPTS, TAPS, random_drafter

    import tempfile
    from pathlib import Path

    model = random_model(CFG, seed=21).to("cuda", torch.bfloat16)
    net = random_drafter(model, 5, draft_vocab=CFG["vocab_size"]).to("cuda", torch.bfloat16)  # shares model's embedding
    got = {}
    gemv, attention = TritonGemv(), TritonDecodeAttention()  # one tuner for both: the same tilings, so the same sums
    with tempfile.TemporaryDirectory() as d:
        for on in (False, True):
            kernels = replace(compiled_kernels(Path(d), pdl=on), gemv=gemv, attention=attention)
            for speculate in (False, True):
                spec = SpecConfig("eagle3", 3, 4, 12, cuda_graphs=True, compile=True) if speculate \
                    else SpecConfig(cuda_graphs=True, compile=True)
                drafter = Eagle3Drafter(net, spec, TAPS) if speculate else None
                runner = CudaGraphRunner.for_engine(model, spec, drafter, max_len=192, buckets=(1, 4), kernels=kernels)
                out = Engine(model, drafter=drafter, spec=spec, runner=runner).generate(PROMPTS, 40)
                assert not runner._failed, runner._failed
                got[on, speculate] = (out.tokens, out.accept_lens)
    assert got[True, False] == got[False, False]
    assert got[True, True] == got[False, True]


@pytest.mark.parametrize("device, capability, graphs, note", [
    ("cpu", None, True, "--pdl: off, PDL is a CUDA feature (cpu device)"),
    ("cuda", (8, 0), True, "--pdl: off, PDL needs compute capability 9.0 or later (Hopper); this GPU is 8.0"),
    ("cuda", (9, 0), False, "--pdl: off, it applies to captured phases (--no-cuda-graphs)"),
    ("cuda", (9, 0), True, "--pdl: inductor's kernels and ours launch dependently in the captured phases (each "
                           "starts while the one before finishes, then waits for its results)")])
def test_run_notes_say_whether_launches_are_dependent(monkeypatch, device, capability, graphs, note):
    from types import SimpleNamespace

    from eaglelab.session import _dependent_launches

    if capability is not None:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: capability)
        monkeypatch.setattr(pdl, "software_refusal", lambda: None)
    s = SimpleNamespace(args=SimpleNamespace(pdl=True), notes=[],
                        spec=SimpleNamespace(cuda_graphs=graphs, compile=graphs))
    assert _dependent_launches(s, torch.device(device)) == note.startswith("--pdl: inductor")
    assert s.notes == [note]
    s = SimpleNamespace(args=SimpleNamespace(pdl=False), notes=[], spec=s.spec)
    assert not _dependent_launches(s, torch.device(device)) and s.notes == []


def test_run_flag_on_a_cpu_runs_on_and_says_why(tiny_dir, capsys):
    """``eaglelab run --pdl`` on a CPU: the run goes on as without it and says why, no traceback."""
    from tests.conftest import run_cli

    rc, text = run_cli(capsys, "run", "w1 w2 w3", "--model", str(tiny_dir), "--device", "cpu", "--draft", "none",
                       "--max-new-tokens", "3", "--pdl")
    assert rc == 0 and "Traceback" not in text
    assert "--pdl: off, PDL is a CUDA feature (cpu device)" in text


def test_pdl_columns_are_named_only_and_never_the_regime():
    from eaglelab.bench.configs import CONFIGS, Regime, pick_configs, regime_config

    assert not any(name.endswith("-pdl") for name in pick_configs(None))
    for name in ("plain-compile-gemv-attn-pdl", "spec-compile-gemv-attn-pdl"):
        cfg = CONFIGS[name]
        assert cfg.pdl and cfg.graphs and cfg.compile and cfg.gemv and cfg.attn and cfg.triton
        base = CONFIGS[name.removesuffix("-pdl")]
        assert (cfg.speculative, cfg.one_graph) == (base.speculative, base.one_graph) and not base.pdl
    regime = Regime(graphs=True, compile=True, gemv=True, attn=True)
    assert regime_config(True, regime).name == "spec-compile-gemv-attn"
    assert regime_config(False, regime).name == "plain-compile-gemv-attn"


def test_bench_pdl_makes_the_headline_the_pdl_columns():
    """``bench --pdl`` on CUDA: run's regime with dependent launches, whose configurations are the ``*-pdl`` columns
    (a combination no column names is made, named and flagged as such); on a CPU it says why it is off."""
    from types import SimpleNamespace

    from eaglelab.bench.configs import Regime, regime_config
    from eaglelab.bench.setup import run_regime

    args = SimpleNamespace(gemv=True, decode_attn=True, bench_pdl=True)
    regime = run_regime(args, "cuda", None)
    assert regime.pdl and "dependent launches (PDL)" in regime.label
    assert "--pdl: the captured phases' kernels launched dependently (as flagged)" in regime.reasons
    assert regime_config(True, regime).name == "spec-compile-gemv-attn-pdl"
    assert regime_config(False, regime).name == "plain-compile-gemv-attn-pdl"
    made = regime_config(True, Regime(graphs=True, compile=False, pdl=True))
    assert made.name == "spec-graphs-pdl" and made.pdl and not made.compile
    cpu = run_regime(args, "cpu", None)
    assert not cpu.pdl and "--pdl: off (dependent launches are a CUDA feature)" in cpu.reasons
    assert not run_regime(SimpleNamespace(gemv=True, decode_attn=True), "cuda", None).pdl


def _profile(pdl: bool | None, **kw):
    from eaglelab.profiles import BucketChoice, DeviceProfile

    return DeviceProfile("NVIDIA H100 80GB HBM3", "bfloat16", "ab" * 32, (BucketChoice(1, 5, 4, 24, "measured"),),
                         compile=True, gemv=True, decode_attn=True, pdl=pdl, kernels_reason="tune, 2026-12-06", **kw)


def test_a_profile_measured_with_pdl_makes_it_the_default(monkeypatch):
    """A device profile that ``tune --pdl`` wrote turns dependent launches on for run and bench where no flag says
    otherwise, with the reason; a flag wins; a profile without the field (every shipped one) leaves it off."""
    from types import SimpleNamespace

    from eaglelab.bench.setup import run_regime
    from eaglelab.session import _dependent_launches

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (9, 0))
    monkeypatch.setattr(pdl, "software_refusal", lambda: None)
    measured = _profile(True)
    why = ("on by default, as measured on NVIDIA H100 80GB HBM3 (tune, 2026-12-06); --no-pdl to change it")
    regime = run_regime(SimpleNamespace(gemv=None, decode_attn=None, bench_pdl=None), "cuda", measured)
    assert regime.pdl and f"--pdl: {why}" in regime.reasons
    flagged_off = run_regime(SimpleNamespace(gemv=None, decode_attn=None, bench_pdl=False), "cuda", measured)
    assert not flagged_off.pdl and "--pdl: off (as flagged)" in flagged_off.reasons
    assert not run_regime(SimpleNamespace(gemv=None, decode_attn=None, bench_pdl=None), "cuda", _profile(None)).pdl

    spec = SimpleNamespace(cuda_graphs=True, compile=True)
    for asked, profile, on in ((None, measured, True), (False, measured, False), (None, _profile(None), False),
                               (None, None, False)):
        s = SimpleNamespace(args=SimpleNamespace(pdl=asked), notes=[], spec=spec,
                            draft=SimpleNamespace(profile=profile))
        assert _dependent_launches(s, torch.device("cuda")) == on
        assert (bool(s.notes) and s.notes[0].endswith(why)) == (on and asked is None), s.notes


def test_profiles_keep_pdl_and_refuse_a_bad_value(tmp_path):
    import json

    from eaglelab.engine.errors import EagleLabError
    from eaglelab.profiles import merge_tuned, read_profiles, write_profile

    path = tmp_path / "p.json"
    write_profile(path, _profile(True))
    assert read_profiles(path)[0].pdl is True
    doc = json.loads(path.read_text())
    doc["profiles"][0]["pdl"] = "yes"
    path.write_text(json.dumps(doc))
    with pytest.raises(EagleLabError) as err:
        read_profiles(path)
    assert "profiles[0].pdl" in str(err.value) and "true, false or absent" in str(err.value)
    # a tune in another regime (with or without dependent launches) replaces the profile's buckets, never mixes them
    assert merge_tuned(_profile(None), _profile(True))[1] == ()
    assert merge_tuned(_profile(False), _profile(None))[0].pdl is None  # absent and false: the same regime


def test_tune_writes_the_regime_it_measured_in():
    from types import SimpleNamespace

    from eaglelab.bench.configs import Regime
    from eaglelab.bench.tune import tuned_profile

    report = {"confirmation": [
        {"batch": 1, "steps": 0, "measured_tok_per_s": 1000.0},
        {"batch": 1, "steps": 5, "topk": 4, "draft_tokens": 24, "measured_tok_per_s": 2300.0}],
        "hardware": {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0"}, "settings": {"prompts": 10}}
    for pdl_on in (True, False):
        settings = SimpleNamespace(new_tokens=128, passes=3,
                                   regime=Regime(graphs=True, compile=True, gemv=True, attn=True, pdl=pdl_on))
        p = tuned_profile(report, settings, "NVIDIA H100 80GB HBM3", "bfloat16", "ab" * 32, "2026-12-06")
        assert p.pdl is pdl_on and p.buckets[0].steps == 5


def test_bench_and_run_give_pdl_phases_a_gemv_tuned_in_dependent_launches(monkeypatch):
    """bench: the ``*-pdl`` configs' kernels hold a Triton GEMV of their own (``pdl``), the others the plain one,
    each built once; both count in the report's tuning time. run: a --pdl session's GEMV is a --pdl one."""
    from types import SimpleNamespace

    from eaglelab import session as S
    from eaglelab.bench import harness as H
    from eaglelab.engine.model import gemv as G

    monkeypatch.setattr("eaglelab.gemv_cache.prepare", lambda gemv, *a, **k: None)
    ctx = H.BenchContext(target=torch.nn.Linear(2, 2), spec=None, make_drafter=None, prompts=[[1]],
                         max_new_tokens=1, batch_sizes=(1,))
    plain, dependent = ctx.kernels(False, gemv=True), ctx.kernels(False, gemv=True, pdl=True)
    assert not plain.gemv.pdl and dependent.gemv.pdl and dependent.pdl
    assert ctx.kernels(False, gemv=True, pdl=True).gemv is dependent.gemv and ctx.kernels(False, True).gemv is plain.gemv
    assert ctx.gemvs() == [plain.gemv, dependent.gemv]
    assert ctx.gemv_of(True) is dependent.gemv and ctx.gemv_of(False) is plain.gemv  # what tune --pdl writes

    built: list = []
    monkeypatch.setattr(S, "_add_triton_kernel", lambda s, flag, field, kernel, *a: built.append(kernel))
    for on in (False, True):
        S._add_gemv(SimpleNamespace(target=SimpleNamespace(device="cpu", dtype=torch.float16)), print, pdl=on)
    assert [type(k) for k in built] == [G.TritonGemv] * 2 and [k.pdl for k in built] == [False, True]
