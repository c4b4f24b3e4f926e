"""Kimi-style INT4 targets written by compressed-tensors itself: a tiny DeepSeek-V3 (MLA + MoE, saved by
HF transformers) whose routed experts the library quantizes (RTN, its own scales) and packs to
``pack-quantized`` W4A16 group 32 as Kimi-K2-Thinking ships (attention, shared experts, dense layers and
lm_head in ``ignore``). eaglelab's load, in memory and layer-streamed, must equal HF transformers' forward
on the model the library itself decompresses."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from eaglelab.engine.formats.loader import load_target
from eaglelab.engine.formats.streamed import StreamedTarget

transformers = pytest.importorskip("transformers")
ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors (test extra) writes the checkpoints here")

from compressed_tensors.compressors import ModelCompressor  # noqa: E402
from compressed_tensors.quantization import (  # noqa: E402
    QuantizationArgs, QuantizationConfig, QuantizationScheme, apply_quantization_config)
from compressed_tensors.quantization.utils.helpers import compute_dynamic_scales_and_zp  # noqa: E402

# hidden 64 and expert width 96: 2 and 3 groups of 32; two layers, the first dense (as Kimi's first_k_dense_replace)
TINY = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=96, n_routed_experts=4, num_experts_per_tok=2,
            n_group=1, topk_group=1, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=2, vocab_size=97,
            q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, first_k_dense_replace=1,
            max_position_embeddings=64, initializer_range=0.2, routed_scaling_factor=2.5)
KIMI_IGNORE = ["lm_head", r"re:.*self_attn.*", r"re:.*shared_experts.*", r"re:.*mlp\.(gate|up|down)_proj$"]


def hf_model(seed: int = 0):
    torch.manual_seed(seed)
    hf = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**TINY)).eval()
    with torch.no_grad():
        for layer in hf.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.normal_(0, 0.1)
    return hf


def linears_of(state: dict[str, torch.Tensor]) -> nn.Module:
    """Every 2-D ``*proj.weight`` / ``lm_head.weight`` of an HF state dict as an nn.Linear at its HF module path:
    the tree compressed-tensors walks (transformers keeps the experts fused, so its own model cannot be)."""
    root = nn.Module()
    for name, w in state.items():
        if w.dim() != 2 or not (name.endswith("proj.weight") or name == "lm_head.weight"):
            continue
        *path, leaf, _ = name.split(".")
        parent = root
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, nn.Module())
            parent = getattr(parent, part)
        lin = nn.Linear(w.shape[1], w.shape[0], bias=False)
        lin.weight.data.copy_(w)
        parent.add_module(leaf, lin)
    return root


def write_int4(tmp_path, symmetric: bool = True) -> tuple[object, object]:
    """(the HF model holding the library's decompressed weights, the compressed checkpoint's directory)."""
    hf = hf_model()
    plain = tmp_path / "plain"
    hf.save_pretrained(plain)
    from safetensors.torch import load_file, save_file

    state = load_file(str(plain / "model.safetensors"))
    tree = linears_of(state)
    weights = QuantizationArgs(num_bits=4, type="int", symmetric=symmetric, strategy="group", group_size=32)
    qc = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights)},
                            ignore=KIMI_IGNORE, format="pack-quantized")
    apply_quantization_config(tree, qc)
    for module in tree.modules():  # data-free RTN with the library's own min-max scales
        if getattr(module, "quantization_scheme", None) is not None:
            scale, zp = compute_dynamic_scales_and_zp(module.weight, module.quantization_scheme.weights, module)
            module.weight_scale.data.copy_(scale)
            if hasattr(module, "weight_zero_point"):
                module.weight_zero_point.data.copy_(zp)
    compressor = ModelCompressor.from_pretrained_model(tree, quantization_format="pack-quantized")
    compressor.compress_model(tree)
    packed = {k: v.contiguous() for k, v in tree.state_dict().items()}
    out = tmp_path / "int4"
    out.mkdir()
    save_file({**{k: v for k, v in state.items() if k not in packed and k.rpartition(".")[0] + ".weight_packed" not in packed},
               **packed}, str(out / "model.safetensors"))
    (out / "config.json").write_text((plain / "config.json").read_text())
    compressor.update_config(str(out))
    compressor.decompress_model(tree)  # the library's own unpacking: the reference weights
    deq = {k: v for k, v in tree.state_dict().items() if k.endswith(".weight")}
    fused = {}
    for layer in range(1, TINY["num_hidden_layers"]):
        pre = f"model.layers.{layer}.mlp.experts"
        gate_up = [torch.cat([deq[f"{pre}.{e}.gate_proj.weight"], deq[f"{pre}.{e}.up_proj.weight"]]) for e in range(4)]
        fused[f"{pre}.gate_up_proj"] = torch.stack(gate_up)
        fused[f"{pre}.down_proj"] = torch.stack([deq[f"{pre}.{e}.down_proj.weight"] for e in range(4)])
    with torch.no_grad():
        params = dict(hf.named_parameters())
        for name, t in fused.items():
            assert not torch.equal(params[name], t), "quantization changed nothing: the test could not fail"
            params[name].copy_(t)
    return hf, out


def ids(batch: int = 2, length: int = 12) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize("symmetric", [True, False], ids=["symmetric-as-kimi", "zero-point"])
def test_int4_pack_quantized_equals_hf_on_library_decompressed(symmetric, tmp_path):
    """Logits within 1e-4 (float32) of HF's on the weights compressed-tensors decompresses; the config and
    tensors are the library's (weight_packed int32, weight_scale, weight_shape; ignore list kept plain)."""
    hf, path = write_int4(tmp_path, symmetric)
    qc = json.loads((path / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    target = load_target(path, with_tokenizer=False)
    x = ids()
    with torch.no_grad():
        ref = hf(x).logits
        got = target.model.logits(target.model.all_hidden_states(x)[-1])
    assert (got - ref).abs().max().item() < 1e-4
    kind = "symmetric" if symmetric else "asymmetric"
    assert target.notes == (f"target: routed experts INT4 (compressed-tensors pack-quantized, {kind}, group 32), "
                            "dequantized to float32 on load: no INT4 kernel of ours",)


def test_int4_streams_like_hf(tmp_path):
    """The layer-streamed reader: every hidden state within 1e-4 of HF's, the same greedy tokens."""
    hf, path = write_int4(tmp_path)
    x = ids(1, 10)
    st = StreamedTarget(path)
    got = st.run(x)
    with torch.no_grad():
        out = hf(x, output_hidden_states=True)
    for i, (a, b) in enumerate(zip(got.hidden_states, out.hidden_states)):
        assert (a - b).abs().max().item() < 1e-4, f"hs[{i}]"
    assert torch.equal(got.next_tokens, out.logits.argmax(-1))
    assert "routed experts INT4" in st.notes[0]
