"""Our ``pack-quantized`` writer against compressed-tensors itself: the same bf16 weights give bit-identical
packed int32 words and equal scales through the library's own scale function and compressor, and eaglelab's
reader turns what we wrote back into exactly ``q * scale``."""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.errors import ConfigError
from eaglelab.engine.formats.quantized import QuantScheme, QuantizedReader, IntArgs, unpack_int32
from eaglelab.engine.formats.quantized_write import pack_int32, pack_quantized, pack_quantized_config

ct = pytest.importorskip("compressed_tensors", reason="compressed-tensors (test extra) is the reference writer")

from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor  # noqa: E402
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme  # noqa: E402
from compressed_tensors.quantization.utils.helpers import calculate_qparams  # noqa: E402


def weight(rows: int, cols: int, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    """A trained-looking weight: normal values, a few outliers, one all-zero group, exact group maxima."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.02
    w[0, :32] = 0.0  # a zero group: the library's eps scale
    w[1, 5] = 0.5  # an outlier group
    w[2, cols - 3] = -0.3  # a negative maximum
    return w.to(dtype)


def library_pack(w: torch.Tensor, num_bits: int, group_size: int | None) -> dict[str, torch.Tensor]:
    """compressed-tensors' own RTN: min/max per group -> calculate_qparams -> its PackedQuantizationCompressor."""
    args = QuantizationArgs(num_bits=num_bits, type="int", symmetric=True,
                            strategy="group" if group_size else "channel", group_size=group_size)
    rows, cols = w.shape
    size = group_size or cols
    groups = w.reshape(rows, cols // size, size)
    scale, zp = calculate_qparams(groups.amin(-1), groups.amax(-1), args)  # [out, G]
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    return PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale, "weight_zero_point": zp}, scheme)


@pytest.mark.parametrize("num_bits,group_size,shape", [(4, 32, (64, 96)), (4, None, (16, 48)), (8, 32, (8, 64)),
                                                       (3, 32, (8, 64)), (5, 16, (4, 48))],
                         ids=["int4-g32-as-kimi", "int4-channel", "int8-g32", "int3-straddles", "int5-g16"])
def test_packed_words_and_scales_equal_the_library(num_bits, group_size, shape):
    w = weight(*shape, seed=num_bits)
    ours, theirs = pack_quantized(w, num_bits, group_size), library_pack(w, num_bits, group_size)
    assert set(theirs) == set(ours), "the same stored tensors (weight_packed, weight_scale, weight_shape)"
    assert ours["weight_scale"].dtype == theirs["weight_scale"].dtype == torch.bfloat16
    assert torch.equal(ours["weight_scale"], theirs["weight_scale"].reshape(ours["weight_scale"].shape))
    assert ours["weight_packed"].dtype == theirs["weight_packed"].dtype == torch.int32
    assert torch.equal(ours["weight_packed"], theirs["weight_packed"]), "bit-identical packed words"
    assert ours["weight_shape"].tolist() == theirs["weight_shape"].tolist() == list(shape)


def test_pack_int32_equals_the_library_on_every_value():
    """Every representable value in every position, 1 to 8 bits, ragged widths included."""
    for bits in range(1, 9):
        low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
        q = torch.randint(low, high + 1, (6, 77), generator=torch.Generator().manual_seed(bits), dtype=torch.int8)
        assert torch.equal(pack_int32(q, bits), pack_to_int32(q, bits)), f"{bits} bits"


def test_the_reader_dequantizes_what_we_wrote_to_q_times_scale():
    """float32: exactly (q) * scale per group of 32, and within about half an INT4 step of the bf16 weight."""
    w = weight(48, 128, seed=7)
    stored = pack_quantized(w)
    scheme = QuantScheme("pack-quantized", "config.json", groups=(IntArgs(("Linear",), 4, True, "group", 32),))
    reader = QuantizedReader(scheme)
    name = "language_model.model.layers.1.mlp.experts.3.up_proj"
    got = reader.load(name + ".weight_packed", stored["weight_packed"], lambda n: stored.get(n.rpartition(".")[2]))
    q = unpack_int32(stored["weight_packed"], 4, 128).float() - 8  # [48, 128] in [-8, 7]
    assert q.min() >= -8 and q.max() <= 7
    want = (q.view(48, 4, 32) * stored["weight_scale"].float().unsqueeze(-1)).view(48, 128)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    step = stored["weight_scale"].float().repeat_interleave(32, 1)
    err = (got - w.float()).abs() / step  # in INT4 steps: half a step, plus bf16's rounding of w / scale (<= 8 * 2^-8)
    assert err.max() <= 0.5 + 8 * 2 ** -8 and err.mean() < 0.3
    assert reader.dequantized == [name]


def test_the_config_is_one_the_library_and_our_reader_accept(tmp_path):
    """At the top level, and where Kimi-K2.5 keeps it: inside the wrapper's text_config."""
    import json

    from eaglelab.engine.formats.quantized import read_scheme

    qc = pack_quantized_config()
    parsed = QuantizationConfig.model_validate(qc)
    assert parsed.format == "pack-quantized" and parsed.config_groups["group_0"].weights.group_size == 32
    assert r"re:.*shared_experts.*" in parsed.ignore and "lm_head" in parsed.ignore
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": qc}))
    s = read_scheme(tmp_path)
    assert s.kind == "pack-quantized" and s.groups[0] == IntArgs(("Linear",), 4, True, "group", 32)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"],
                                                      "text_config": {"quantization_config": qc}}))
    assert read_scheme(tmp_path) == s
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"quantization_config": [qc]}}))
    with pytest.raises(ConfigError, match="text_config.quantization_config"):
        read_scheme(tmp_path)
