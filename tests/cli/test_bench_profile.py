"""``eaglelab bench --profile``: one decode step under torch.profiler, kernel (CPU: operator) by kernel."""

from __future__ import annotations

import json

import pytest
import torch

from eaglelab.bench.profile import category, profile_decode
from eaglelab.cli import build_parser
from tests.tp_harness import RankFailure, spawn_ranks

QUESTIONS = [{"question_id": 1, "category": "writing", "turns": ["Write a haiku about the sea."]}]


def test_kernel_categories_from_names():
    """Real kernel names of an H200 decode step (cuBLAS, NCCL, flash attention, inductor) and CPU ops."""
    assert category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1") == "matmul"
    assert category("void gemv2T_kernel_val<int, int, __nv_bfloat16, float, float, 128, 16, 4, 4>") == "matmul"
    assert category("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "collective"
    assert category("void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64>>") == "attention"
    assert category("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "compiled"
    assert category("aten::mm") == "matmul" and category("c10d::allreduce_") == "collective"
    assert category("void at::native::elementwise_kernel<128, 2>") == "other"


def test_kernel_categories_of_an_h100_verify_and_decode():
    """Names from an H100 profile of SmolLM2's verify and decode (2026-12-06): cuBLAS's nvjet GEMMs are matmuls; the
    compiler's kernels are "compiled" whatever ops they fuse (their names list a GEMV or the decode attention that
    only feeds them), so a verify that takes cuBLAS and a decode that takes the GEMV compare matmul to matmul."""
    assert category("nvjet_sm90_tst_64x24_64x16_4x1_v_bz_TNT") == "matmul"
    assert category("gemv_kernel") == "matmul" and category("triton_tem_fused_mm_0") == "matmul"
    assert category("triton_poi_fused_gemv_mul_silu_split_with_sizes_view_4") == "compiled"
    assert category("triton_per_fused__to_copy_add_gemv_mean_mul_pow_rsqrt_view_8") == "compiled"
    assert category("triton_poi_fused__to_copy_add_arange_cat_cos_decode_attention_le_mul_neg_sin_slice") == "compiled"
    assert category("attention_kernel") == "attention" and category("attention_combine_kernel") == "attention"
    assert category("expand_select_kernel") == "other"


def _bench_rank(tp, argv):
    from eaglelab.cmd_bench import bench

    report, _ = bench(build_parser().parse_args(argv), tp)
    return report.get("profile")


def test_bench_tp2_profile_shows_the_collectives_of_a_decode_step(tmp_path):
    """--tp 2 --profile --configs none (gloo, tiny model: 4 layers): rank 0 profiles one decode step per
    batch size; its table holds the step's 8 all-reduces and 1 logits all-gather per step, and the
    report has no configuration rows. Rank 1 ran the steps unprofiled."""
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps(QUESTIONS[0]) + "\n")
    out = tmp_path / "tp2.json"
    argv = ["bench", "--tp", "2", "--scale-model", "tiny", "--device", "cpu", "--dtype", "float32", "--questions",
            str(q), "--prompts", "1", "--batch-sizes", "1,2", "--max-new-tokens", "8", "--configs", "none",
            "--no-micro", "--profile", "--json", str(out)]
    ranks = spawn_ranks(_bench_rank, 2, argv, timeout_s=200.0)
    assert not any(isinstance(r, RankFailure) for r in ranks), ranks
    assert ranks[1] == []
    rep = json.loads(out.read_text())
    assert rep["rows"] == [] and rep["tp"]["world_size"] == 2
    profiles = rep["profile"]
    assert [(p["batch"], p["layers"], p["status"]) for p in profiles] == [(1, "eager", "ran"), (2, "eager", "ran")]
    for p in profiles:
        calls = {k["name"]: k["calls_per_step"] for k in p["kernels"]}
        assert calls.get("c10d::allreduce_") == 8 and calls.get("c10d::_allgather_base_") == 1, calls
        assert p["by_category"]["collective"] > 0 and p["by_category"]["matmul"] > 0
        assert p["device_us"] == pytest.approx(sum(p["by_category"].values()))
        assert p["launches"] >= sum(k["calls_per_step"] for k in p["kernels"]) > 9
        assert p["step_ms"] > 0 and (p["weight_gbps"] is not None) == (p["batch"] == 1)  # a weight read: batch 1 only


def test_profile_decode_compiled_whole_runs_and_matches_the_eager_step():
    """The compiled variant compiles the decode step whole (dynamo, fullgraph) and is profiled too;
    the step it profiles picks the eager step's tokens."""
    from eaglelab.engine.model.scale_models import build_scale_model, decode_weight_bytes
    from eaglelab.engine.runtime.compile import CompileLog, PhaseCompiler

    torch._dynamo.reset()
    model = build_scale_model("tiny", seed=0).model
    compiler = PhaseCompiler(CompileLog(None), backend="eager")
    got = profile_decode(model, None, (1,), 64, compiler, decode_weight_bytes(model), steps=2, warmup=1)
    assert [(p.layers, p.status) for p in got] == [("eager", "ran"), ("compiled", "ran")]
    assert [p.reason for p in compiler.made] == [None]
    for p in got:
        assert p.kernels and p.device_us > 0 and p.by_category.get("matmul", 0) > 0
        assert p.weight_gbps is not None and p.weight_gbps > 0  # batch 1: weight bytes / matmul time
    # the profiled phase (its rows done: it emits nothing) with the rows live: compiled, it picks the eager token
    from eaglelab.bench.profile import _decode_phase, _filled_cache

    picked = []
    with torch.inference_mode():  # as profile_decode runs
        cache = _filled_cache(model, 1, 64, 32)
        phase, state = _decode_phase(model, cache, torch.tensor([32]))
        for run in (phase, PhaseCompiler(CompileLog(None), backend="eager")("live decode [b=1]", phase)):
            live = {k: v.clone() for k, v in state.items()}
            live["done"], live["limit"] = torch.zeros(1, dtype=torch.bool), torch.tensor([4])
            run(**live)
            assert getattr(run, "reason", None) is None  # compiled: not fallen back to eager
            assert live["n_out"].tolist() == [1] and live["lengths"].tolist() == [33]
            picked.append(live["out"][0, 0].item())
    assert picked[0] == picked[1] >= 0
