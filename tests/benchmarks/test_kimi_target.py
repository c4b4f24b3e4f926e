"""``benchmarks/kimi_target.py --small`` end to end on CPU: the directory contract, Kimi-K2.5's checkpoint layout
(wrapper config, quantization_config under text_config, INT4 routed experts packed per expert, bf16 rest, shards
with an index), and that ``eaglelab run`` opens the target and continues a held-out prompt greedily."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import kimi_target  # noqa: E402


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[Path, float]:
    out = tmp_path_factory.mktemp("kimi")
    t0 = time.perf_counter()
    assert kimi_target.main(["--out", str(out), "--small", "--device", "cpu", "--train-s", "4"]) == 0
    return out, time.perf_counter() - t0


def test_the_directory_contract(made):
    out, _ = made
    assert {p.name for p in out.iterdir()} >= {"target", "train_prompts.jsonl", "heldout_prompts.jsonl", "target_summary.json"}
    held = [json.loads(line) for line in (out / "heldout_prompts.jsonl").read_text().splitlines()]
    train = [json.loads(line) for line in (out / "train_prompts.jsonl").read_text().splitlines()]
    assert held and train and {r["kind"] for r in held} == {"heldout"} and {r["kind"] for r in train} == {"train"}
    assert not {r["file"] for r in held} & {r["file"] for r in train}, "held-out modules never prompt training"
    assert all(8 <= r["prompt"].count("\n") <= 40 for r in held + train)  # 20-40 lines, or a short module whole
    s = json.loads((out / "target_summary.json").read_text())
    assert s["steps"] >= 1 and s["train_tokens"] == s["steps"] * kimi_target.SMALL.batch * kimi_target.SMALL.seq
    for k in ("heldout_loss_bf16_experts", "heldout_loss_int4_experts", "train_loss_last10pct"):
        assert 0 < s[k] < 1.2 * torch.log(torch.tensor(float(kimi_target.SMALL.vocab))).item(), k
    assert abs(s["int4_cost"]) < 0.5 and any("routed experts INT4" in n for n in s["load_notes"])
    assert s["int4_greedy_sample"] and s["wall_s"] >= s["train_wall_s"] + s["data_s"]


def test_the_checkpoint_is_laid_out_as_kimi_k25_ships(made):
    from safetensors import safe_open

    target = made[0] / "target"
    config = json.loads((target / "config.json").read_text())
    assert config["architectures"] == ["KimiK25ForConditionalGeneration"] and config["model_type"] == "kimi_k25"
    text = config["text_config"]
    assert text["model_type"] == "kimi_k2" and "quantization_config" not in config
    qc = text["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    w = qc["config_groups"]["group_0"]["weights"]
    assert (w["num_bits"], w["type"], w["strategy"], w["group_size"], w["symmetric"]) == (4, "int", "group", 32, True)
    index = json.loads((target / "model.safetensors.index.json").read_text())["weight_map"]
    shards = sorted(set(index.values()))
    assert len(shards) == 2 and all((target / f).exists() for f in shards)
    dtypes = {}
    for f in shards:
        with safe_open(str(target / f), "pt") as h:
            assert set(h.keys()) == {n for n, file in index.items() if file == f}
            dtypes.update({n: h.get_tensor(n).dtype for n in h.keys()})
    expert = "language_model.model.layers.1.mlp.experts.0.down_proj"
    assert dtypes[expert + ".weight_packed"] == torch.int32 and dtypes[expert + ".weight_scale"] == torch.bfloat16
    assert dtypes[expert + ".weight_shape"] == torch.int64 and expert + ".weight" not in dtypes
    assert dtypes["language_model.lm_head.weight"] == torch.bfloat16
    assert dtypes["language_model.model.layers.1.self_attn.kv_a_proj_with_mqa.weight"] == torch.bfloat16
    assert dtypes["language_model.model.layers.1.mlp.shared_experts.up_proj.weight"] == torch.bfloat16
    assert dtypes["language_model.model.layers.0.mlp.gate_proj.weight"] == torch.bfloat16  # layer 0 dense
    assert dtypes["language_model.model.layers.1.mlp.gate.e_score_correction_bias"] == torch.float32
    n_packed = sum(n.endswith(".weight_packed") for n in dtypes)
    assert n_packed == 3 * kimi_target.SMALL.experts * (kimi_target.SMALL.layers - 1)


def test_the_training_balanced_the_experts(made):
    """The routing bias moved (DeepSeek-V3's aux-loss-free balance ran) and was saved."""
    from safetensors import safe_open

    target = made[0] / "target"
    index = json.loads((target / "model.safetensors.index.json").read_text())["weight_map"]
    name = "language_model.model.layers.1.mlp.gate.e_score_correction_bias"
    with safe_open(str(target / index[name]), "pt") as h:
        assert h.get_tensor(name).abs().max() > 0


def test_eaglelab_run_continues_a_heldout_prompt(made):
    """The CLI opens the directory (INT4 dequantized on load, said in the notes) and decodes greedily."""
    out, seconds = made
    prompt = json.loads((out / "heldout_prompts.jsonl").read_text().splitlines()[0])["prompt"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, "-m", "eaglelab", "run", prompt, "--raw", "--model", str(out / "target"),
                        "--draft", "none", "--max-new-tokens", "8", "--device", "cpu"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    text = r.stdout + r.stderr
    assert "routed experts INT4" in text and "dequantized" in text and "Traceback" not in text
    assert seconds < 60, f"--small took {seconds:.0f} s"


def test_load_balancer_counts_as_bincount_and_nudges_against_the_load():
    """Each router's load is its tokens per expert (torch.bincount's counts); a step moves every bias by ``rate``
    against it (up where below the mean, down where above) and returns the worst max/mean load, at least 1."""
    from eaglelab.engine.model.config import ModelConfig
    from eaglelab.engine.model.moe import Router

    cfg = ModelConfig.from_dict(kimi_target.wrapper_config(kimi_target.SMALL, 512), source="test")
    router = Router(cfg)
    torch.nn.init.normal_(router.weight, generator=torch.Generator().manual_seed(0))
    balancer = kimi_target.LoadBalancer(router, rate=0.25)
    x = torch.randn(40, cfg.hidden_size, generator=torch.Generator().manual_seed(1))
    _, idx = router(x)
    counts = torch.bincount(idx.flatten(), minlength=cfg.moe.num_experts).float()
    assert torch.equal(balancer.loads[router], counts)
    worst = balancer.step()
    assert worst.dim() == 0 and float(worst) == pytest.approx(max(1.0, float(counts.max() / counts.mean())))
    assert torch.equal(router.e_score_correction_bias.data, 0.25 * torch.sign(counts.mean() - counts))
    assert not balancer.loads and float(balancer.step()) == 1.0  # no forward since: nothing moves, even
    balancer.close()
