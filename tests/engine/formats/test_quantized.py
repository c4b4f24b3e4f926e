"""Quantized targets as they ship: block FP8 (DeepSeek-V3 / Kimi-K2) and NVFP4 (modelopt, compressed-tensors)
checkpoints written here from a tiny HF DeepSeek-V3 with ragged edges, loaded in memory and layer-streamed
against HF transformers on the dequantized weights; the unpacking arithmetic against bit-level references;
and schemes we do not read refused with exit 2 naming file, field, found and expected."""

from __future__ import annotations

import json
import math

import pytest
import torch

from eaglelab.engine.errors import CheckpointError, ConfigError
from eaglelab.engine.formats.loader import load_target
from eaglelab.engine.formats.quantized import dequantize_nvfp4, dequantize_packed_int, read_scheme, unpack_int32
from eaglelab.engine.formats.streamed import StreamedTarget

transformers = pytest.importorskip("transformers")

# 160 / 144 against 128-blocks: every FP8 matrix of the experts and dense MLP has partial edge blocks
TINY = dict(hidden_size=160, intermediate_size=144, moe_intermediate_size=160, n_routed_experts=4, num_experts_per_tok=2,
            n_group=1, topk_group=1, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=2, vocab_size=97,
            q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, first_k_dense_replace=1,
            max_position_embeddings=64, initializer_range=0.2, routed_scaling_factor=2.5)
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def plain_state(tmp_path) -> tuple[dict, dict]:
    """(HF's saved state dict with per-expert names, its config.json as a dict)."""
    from safetensors.torch import load_file

    torch.manual_seed(0)
    hf = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**TINY))
    hf.save_pretrained(tmp_path / "plain")
    return load_file(str(tmp_path / "plain" / "model.safetensors")), json.loads((tmp_path / "plain" / "config.json").read_text())


def fp8_blocks(w: torch.Tensor, block: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek's block FP8, block by block: (e4m3 weight, scale_inv [ceil(o/b), ceil(i/b)], dequantized)."""
    rows, cols = w.shape
    q, deq = torch.empty(rows, cols, dtype=torch.float8_e4m3fn), torch.empty(rows, cols)
    s = torch.empty(math.ceil(rows / block), math.ceil(cols / block))
    for i in range(s.shape[0]):
        for j in range(s.shape[1]):
            sl = (slice(i * block, (i + 1) * block), slice(j * block, (j + 1) * block))
            s[i, j] = w[sl].abs().max() / 448
            q[sl] = (w[sl] / s[i, j]).to(torch.float8_e4m3fn)
            deq[sl] = q[sl].float() * s[i, j]
    return q, s, deq


def nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 as modelopt stores it: (uint8 [o, i/2] low nibble first, e4m3 scales [o, i/16], weight_scale_2, dequantized)."""
    rows, cols = w.shape
    ws2 = w.abs().max() / (6 * 448)
    blocks = w.reshape(rows, cols // 16, 16)
    scale = (blocks.abs().amax(-1) / 6 / ws2).to(torch.float8_e4m3fn)  # [o, i/16]
    eff = (scale.float() * ws2).unsqueeze(-1)
    x = blocks / eff
    idx = (x.abs().unsqueeze(-1) - E2M1).abs().argmin(-1)  # nearest magnitude
    code = (idx | ((x < 0).long() << 3)).reshape(rows, cols)
    deq = (E2M1[idx] * torch.where(x < 0, -1.0, 1.0) * eff).reshape(rows, cols)
    packed = (code[:, 0::2] | (code[:, 1::2] << 4)).to(torch.uint8)
    return packed, scale, ws2.reshape(()), deq


def write(tmp_path, name: str, state: dict, config: dict, quantize, quantization_config: dict | None) -> tuple:
    """A quantized checkpoint (``quantize(name, w)`` -> stored tensors, or None to keep ``w``) and a plain one
    holding what those tensors dequantize to."""
    from safetensors.torch import save_file

    stored, deq = {}, {}
    for k, w in state.items():
        got = quantize(k, w) if w.dim() == 2 and k.endswith("proj.weight") else None
        stored.update(got[0] if got else {k: w})
        deq[k] = got[1] if got else w
    dirs = []
    for sub, tensors, qc in ((name, stored, quantization_config), (name + "-deq", deq, None)):
        (tmp_path / sub).mkdir()
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / sub / "model.safetensors"))
        (tmp_path / sub / "config.json").write_text(json.dumps({**config, **({"quantization_config": qc} if qc else {})}))
        dirs.append(tmp_path / sub)
    return dirs[0], transformers.DeepseekV3ForCausalLM.from_pretrained(dirs[1]).eval()


def check_against_hf(path, hf, note: str) -> None:
    """In memory: logits within 1e-4 of HF's; streamed: every hidden state within 1e-4, HF's greedy tokens."""
    x = torch.randint(0, TINY["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(5))
    target = load_target(path, with_tokenizer=False)
    with torch.no_grad():
        out = hf(x, output_hidden_states=True)
        got = target.model.logits(target.model.all_hidden_states(x)[-1])
    assert (got - out.logits).abs().max().item() < 1e-4
    assert note in target.notes[0]
    streamed = StreamedTarget(path).run(x)
    for i, (a, b) in enumerate(zip(streamed.hidden_states, out.hidden_states)):
        assert (a - b).abs().max().item() < 1e-4, f"hs[{i}]"
    assert torch.equal(streamed.next_tokens, out.logits.argmax(-1))


def test_block_fp8_equals_hf_on_its_dequantized_weights(tmp_path):
    """Every projection in 128x128 FP8 blocks (DeepSeek-V3's quantization_config), partial edge blocks included."""
    state, config = plain_state(tmp_path)

    def fp8(k, w):
        q, s, deq = fp8_blocks(w)
        return {k: q, k + "_scale_inv": s}, deq

    qc = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    path, hf = write(tmp_path, "fp8", state, config, fp8, qc)
    check_against_hf(path, hf, "block FP8 e4m3 (128x128 scales)")


@pytest.mark.parametrize("where", ["config.json", "hf_quant_config.json"])
def test_modelopt_nvfp4_equals_hf_on_its_dequantized_weights(where, tmp_path):
    """Routed experts in modelopt NVFP4 (e2m1 pairs, e4m3 scales per 16, weight_scale_2); the scheme read from
    config.json's quantization_config or from modelopt's hf_quant_config.json."""
    state, config = plain_state(tmp_path)

    def fp4(k, w):
        if ".experts." not in k:
            return None
        packed, scale, ws2, deq = nvfp4(w)
        return {k: packed, k[:-len("weight")] + "weight_scale": scale, k[:-len("weight")] + "weight_scale_2": ws2,
                k[:-len("weight")] + "input_scale": torch.tensor(1.0)}, deq

    ignore = ["lm_head", "model.layers.*.self_attn*", "model.layers.*.shared_experts*", "model.layers.0.mlp*"]
    qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ignore}
    path, hf = write(tmp_path, "nvfp4", state, config, fp4, qc if where == "config.json" else None)
    if where == "hf_quant_config.json":
        (path / where).write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.37.0"}, "quantization": {
            "quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": ignore}}))
    check_against_hf(path, hf, "routed experts NVFP4 (modelopt")


def test_unpack_int32_matches_bit_by_bit_reference():
    """Element i at bits [i*b, i*b+b) of little-endian words, for widths that straddle words (3, 5, 7) and not."""
    g = torch.Generator().manual_seed(0)
    for bits in range(1, 9):
        cols = 37
        vals = torch.randint(0, 1 << bits, (3, cols), generator=g)
        words = torch.zeros(3, math.ceil(cols * bits / 32), dtype=torch.int64)
        for r in range(3):
            for i in range(cols):
                for b in range(bits):
                    if vals[r, i] >> b & 1:
                        pos = i * bits + b
                        words[r, pos // 32] |= 1 << (pos % 32)
        packed = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
        assert torch.equal(unpack_int32(packed, bits, cols), vals), f"{bits} bits"


def test_packed_int_groups_zero_points_and_act_order():
    """(q - zp) * scale with the group of each column from g_idx when given: [4, 64] INT4, 2 groups."""
    q = torch.randint(-8, 8, (4, 64), generator=torch.Generator().manual_seed(1))
    words = ((q + 8).reshape(4, 8, 8) << (torch.arange(8) * 4)).sum(-1)  # 8 nibbles per word
    packed = torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)
    scale = torch.tensor([[1.0, 2.0], [0.5, 4.0], [3.0, 1.0], [1.0, 1.0]])
    zp = torch.tensor([[1, -2], [0, 3], [-8, 7], [2, 2]])
    zp_words = ((zp + 8) << (torch.arange(4).unsqueeze(1) * 4)).sum(0, keepdim=True)  # [1, 2]: packed down the rows
    g_idx = torch.arange(64) % 2
    got = dequantize_packed_int(packed, scale, (4, 64), 4, zp_words.to(torch.int32), g_idx)
    assert torch.equal(got, (q - zp[:, g_idx]).float() * scale[:, g_idx])
    assert torch.equal(dequantize_packed_int(packed, scale, (4, 64), 4), q.float() * scale.repeat_interleave(32, 1))


def test_compressed_tensors_nvfp4_against_the_library(tmp_path):
    """compressed-tensors' own NVFP4A16 compressor: our dequantization equals its decompression to its bf16 rounding."""
    pytest.importorskip("compressed_tensors", reason="compressed-tensors (test extra) writes the checkpoint")
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme
    from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp, generate_gparam

    root = torch.nn.Sequential(torch.nn.Linear(64, 24, bias=False))
    apply_quantization_config(root, QuantizationConfig(config_groups={"g": preset_name_to_scheme("NVFP4A16", ["Linear"])}))
    m = root[0]
    w = m.weight.detach()
    m.weight_global_scale.data.copy_(generate_gparam(w.min(), w.max()).reshape(m.weight_global_scale.shape))
    m.weight_scale.data.copy_(compute_dynamic_scales_and_zp(w, m.quantization_scheme.weights, m, m.weight_global_scale)[0])
    compressor = ModelCompressor.from_pretrained_model(root, quantization_format="nvfp4-pack-quantized")
    compressor.compress_model(root)
    sd = {k: v.clone() for k, v in root.state_dict().items()}
    compressor.decompress_model(root)
    ref = root[0].weight.detach().float()
    ours = dequantize_nvfp4(sd["0.weight_packed"], sd["0.weight_scale"], 1.0 / float(sd["0.weight_global_scale"]))
    assert (ours - ref).abs().max().item() <= 2 ** -7 * ref.abs().max().item()
    assert (ours - w).abs().max() > 0  # it was quantized: the comparison could fail


UNREAD = [
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, "quantization_config.quant_method", "'awq'"),
    ({"quant_method": "gptq", "bits": 4}, "quantization_config.quant_method", "'gptq'"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "quantization_config.quant_method", "'bitsandbytes'"),
    ({"quant_method": "compressed-tensors", "format": "float-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}}},
     "quantization_config.format", "'float-quantized'"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "quantization_config.weight_block_size", "None"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, "quantization_config.quant_algo", "'FP8'"),
]


@pytest.mark.parametrize("qc,field,found", UNREAD, ids=["awq", "gptq", "bnb", "ct-float", "fp8-per-tensor", "modelopt-fp8"])
def test_schemes_we_do_not_read_name_field_and_found(qc, field, found, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "quantization_config": qc}))
    with pytest.raises(ConfigError) as e:
        read_scheme(tmp_path)
    assert e.value.field == field and e.value.found == found and "config.json" in e.value.file
    assert "pack-quantized" in str(e.value.expected) and e.value.hint


def test_unsupported_scheme_exits_2_through_the_cli(tmp_path, capsys):
    """``eaglelab run --model DIR`` on an AWQ target: exit 2, the file, field, found and what is read; no traceback."""
    from eaglelab.cli import main
    from tests.conftest import random_model, save_hf_dir, tiny_config

    cfg = tiny_config()
    path = save_hf_dir(random_model(cfg), cfg, tmp_path / "awq")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "awq", "bits": 4}}))
    rc = main(["run", "hi", "--model", str(path), "--device", "cpu", "--draft", "none", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "quantization_config.quant_method" in err and "'awq'" in err and "compressed-tensors" in err
    assert str(path / "config.json") in err and "Traceback" not in err


def test_quantized_tensors_without_a_scheme_are_refused(tmp_path):
    """int32 packed experts in a directory whose config.json lost its quantization_config: a CheckpointError
    naming the tensor, not a silently wrong model."""
    from safetensors.torch import save_file

    state, config = plain_state(tmp_path)
    name = "model.layers.1.mlp.experts.0.down_proj.weight"
    state[name + "_packed"] = torch.zeros(160, 20, dtype=torch.int32)
    del state[name]
    (tmp_path / "bad").mkdir()
    save_file(state, str(tmp_path / "bad" / "model.safetensors"))
    (tmp_path / "bad" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as e:
        load_target(tmp_path / "bad", with_tokenizer=False)
    assert e.value.field == name + "_packed" and "torch.int32" in str(e.value.found)


def test_missing_scale_is_named(tmp_path):
    """An FP8 weight whose weight_scale_inv is missing: the error names that tensor."""
    from safetensors.torch import save_file

    state, config = plain_state(tmp_path)
    name = "model.layers.1.self_attn.o_proj.weight"
    state[name] = state[name].to(torch.float8_e4m3fn)
    (tmp_path / "fp8").mkdir()
    save_file(state, str(tmp_path / "fp8" / "model.safetensors"))
    qc = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}
    (tmp_path / "fp8" / "config.json").write_text(json.dumps({**config, "quantization_config": qc}))
    with pytest.raises(CheckpointError) as e:
        StreamedTarget(tmp_path / "fp8").run(torch.zeros(1, 3, dtype=torch.long))
    assert e.value.field == name + "_scale_inv"


def test_fp8_llama_runs_and_the_run_says_what_it_dequantized(tmp_path, capsys):
    """``eaglelab run`` on a Llama-layout target stored as block FP8: it generates, and its notes name the scheme
    and the dtype the weights became; the same weights in float32 give the same tokens."""
    from safetensors.torch import load_file, save_file

    from eaglelab.cli import main
    from tests.conftest import add_word_tokenizer, random_model, save_hf_dir, tiny_config

    cfg = tiny_config()
    path = save_hf_dir(random_model(cfg), cfg, tmp_path / "fp8")
    add_word_tokenizer(path, vocab=cfg["vocab_size"])
    stored, plain = {}, {}
    for k, w in load_file(str(path / "model.safetensors")).items():
        if k.endswith("proj.weight"):
            q, s, deq = fp8_blocks(w)
            stored.update({k: q, k + "_scale_inv": s})
            plain[k] = deq
        else:
            stored[k] = plain[k] = w
    save_file(stored, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({**cfg, "quantization_config": {
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}))
    rc = main(["run", "w1 w2 w3", "--model", str(path), "--device", "cpu", "--draft", "none", "--max-new-tokens", "3"])
    out = capsys.readouterr()
    text = " ".join((out.out + out.err).split())
    assert rc == 0
    n = sum(k.endswith("proj.weight") for k in plain)
    assert f"target: {n} linears block FP8 e4m3 (128x128 scales), dequantized to float32 on load" in text
    ours = load_target(path, with_tokenizer=False).model
    (tmp_path / "deq").mkdir()
    save_file(plain, str(tmp_path / "deq" / "model.safetensors"))
    (tmp_path / "deq" / "config.json").write_text(json.dumps(cfg))
    ref = load_target(tmp_path / "deq", with_tokenizer=False).model
    x = torch.randint(0, cfg["vocab_size"], (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(ours.logits(ours.all_hidden_states(x)[-1]), ref.logits(ref.all_hidden_states(x)[-1]))
