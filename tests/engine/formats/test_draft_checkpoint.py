"""Reading EAGLE-3 drafter directories (SGLang/SpecForge and speculators) and their static checks.

Drafters here are tiny (hidden 64, vocab 256, draft vocab 64) for a 30-layer target of hidden 64.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from eaglelab.engine.formats.draft_checkpoint import expected_tensor_shapes, read_draft_checkpoint
from eaglelab.engine.formats.draft_export import save_draft_checkpoint, sglang_config, speculators_config
from eaglelab.engine.errors import CheckpointError, ConfigError

H, VOCAB, DRAFT_VOCAB = 64, 256, 64


@dataclass(frozen=True)
class Target:
    num_layers: int = 30
    hidden_size: int = H
    vocab_size: int = VOCAB
    max_position_embeddings: int = 8192


def make_drafter(
    path: Path,
    *,
    fmt: str = "sglang",
    ids: list[int] | None = (1, 14, 26),
    num_fc: int = 3,
    target_hidden: int = H,
    weights: bool = True,
    **cfg_overrides,
) -> Path:
    """A random drafter; ``num_fc`` target states feed ``fc`` whatever the config says."""
    cfg = sglang_config(hidden_size=H, vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB,
                        aux_layer_ids=list(ids) if ids is not None else None, num_attention_heads=4,
                        num_key_value_heads=2, intermediate_size=128, target_hidden_size=target_hidden)
    cfg.update(cfg_overrides)
    if fmt == "speculators":
        cfg = speculators_config(cfg, aux_layer_ids=list(ids) if ids is not None else None)
    g = torch.Generator().manual_seed(0)
    shapes = expected_tensor_shapes(hidden_size=H, aux_hidden_size=target_hidden, num_aux=num_fc, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=16, intermediate_size=128,
                                    vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB)
    tensors = {k: torch.randn(s, generator=g) for k, s in shapes.items() if k not in ("d2t", "t2d")}
    chosen = torch.randperm(VOCAB, generator=g)[:DRAFT_VOCAB].sort().values  # [draft_vocab] target ids
    tensors["d2t"] = chosen - torch.arange(DRAFT_VOCAB)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[chosen] = True
    tensors["t2d"] = t2d
    return save_draft_checkpoint(path, cfg, tensors if weights else {})


def codes(findings, severity=None):
    return sorted({f.code for f in findings if severity is None or f.severity == severity})


def test_reads_sglang_format(tmp_path):
    ck = read_draft_checkpoint(make_drafter(tmp_path / "d"))
    assert ck.format == "sglang" and ck.default_serving == "sglang"
    assert ck.aux_layer_ids == (1, 14, 26) and ck.aux_convention == "sglang"
    assert ck.aux_ids_field == "eagle_config.eagle_aux_hidden_state_layer_ids"
    assert (ck.hidden_size, ck.aux_hidden_size, ck.vocab_size, ck.draft_vocab_size) == (64, 64, 256, 64)
    assert (ck.num_attention_heads, ck.num_key_value_heads, ck.head_dim, ck.intermediate_size) == (4, 2, 16, 128)
    assert ck.shape("fc.weight") == (64, 192) and ck.num_aux_from_fc == 3
    assert ck.shape("midlayer.self_attn.q_proj.weight") == (64, 128)


def test_clean_drafter_has_no_errors_or_warnings(tmp_path):
    ck = read_draft_checkpoint(make_drafter(tmp_path / "d"))
    findings = ck.validate(Target())
    assert codes(findings, "error") == [] and codes(findings, "warning") == []
    assert "format" in codes(findings, "info")


def test_reads_speculators_format_with_normalised_names(tmp_path):
    d = make_drafter(tmp_path / "d", fmt="speculators", ids=[2, 15, 27])
    from safetensors import safe_open

    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        assert "layers.0.self_attn.q_proj.weight" in set(f.keys())
    ck = read_draft_checkpoint(d)
    assert ck.format == "speculators" and ck.default_serving == "vllm"
    assert ck.aux_layer_ids == (2, 15, 27) and ck.aux_convention == "vllm"
    assert ck.verifier == "target" and ck.norm_before_residual is False
    assert "midlayer.self_attn.q_proj.weight" in ck.tensors
    q = ck.load_tensor("midlayer.self_attn.q_proj.weight")
    assert q.shape == (64, 128)
    assert codes(ck.validate(Target()), "error") == []


def test_speculators_null_ids_warns(tmp_path):
    """`speculators convert` writes null ids: vLLM then taps its defaults."""
    ck = read_draft_checkpoint(make_drafter(tmp_path / "d", fmt="speculators", ids=None))
    assert ck.aux_layer_ids is None and ck.aux_convention is None
    f = [x for x in ck.validate(Target()) if x.code == "missing_ids"]
    assert f and f[0].severity == "warning" and "hs[2, 15, 27]" in f[0].message and "speculators convert" in f[0].hint


def test_missing_eagle_config_names_defaults(tmp_path):
    ck = read_draft_checkpoint(make_drafter(tmp_path / "d", ids=None))
    assert not ck.eagle_config_present
    f = [x for x in ck.validate(Target()) if x.code == "missing_ids"][0]
    assert f.message.startswith("no eagle_config") and "[1, 14, 26]" in f.message


def test_fc_width_disagrees_with_ids(tmp_path):
    ck = read_draft_checkpoint(make_drafter(tmp_path / "d", ids=[-1, 1, 14, 26], num_fc=3))
    found = codes(ck.validate(Target()), "error")
    assert "fc_width" in found and "embedding_capture" in found
    msg = [x for x in ck.validate(Target()) if x.code == "fc_width"][0].message
    assert "fc takes 3" in msg and "names 4" in msg


def test_fc_not_multiple_of_target_hidden(tmp_path):
    ck = read_draft_checkpoint(make_drafter(tmp_path / "d", num_fc=3, target_hidden=48))
    # config says target_hidden_size 48 and fc is 3 x 48: consistent, but the target has 64
    assert codes(ck.validate(Target()), "error") == ["target_hidden"]
    ck2 = read_draft_checkpoint(make_drafter(tmp_path / "e", num_fc=3, target_hidden=48, target_hidden_size=40))
    assert "fc_width" in codes(ck2.validate(None), "error")


def test_ids_checks(tmp_path):
    dup = read_draft_checkpoint(make_drafter(tmp_path / "a", ids=[1, 14, 14], weights=False))
    assert "duplicate_ids" in codes(dup.validate(Target()), "error")
    unordered = read_draft_checkpoint(make_drafter(tmp_path / "b", ids=[14, 1, 26], weights=False))
    assert codes(unordered.validate(Target()), "warning") == ["unordered_ids"]
    far = read_draft_checkpoint(make_drafter(tmp_path / "c", ids=[1, 14, 29], weights=False))
    assert "ids_out_of_range" in codes(far.validate(Target()), "error")  # SGLang id 29 = hs[30]: never tapped
    assert "ids_out_of_range" not in codes(far.validate(Target(num_layers=40)), "error")
    other = read_draft_checkpoint(make_drafter(tmp_path / "e", ids=[2, 15, 27], weights=False))
    f = [x for x in other.validate(Target()) if x.code == "other_convention"]
    assert f and "[1, 14, 26]" in f[0].hint


def test_config_only_directory(tmp_path):
    ck = read_draft_checkpoint(make_drafter(tmp_path / "d", ids=[-1, 2, 30, 58], weights=False))
    assert not ck.has_weights
    found = ck.validate(Target(num_layers=61))
    assert "config_only" in codes(found, "info")
    assert codes(found, "error") == ["embedding_capture"]


def test_draft_vocab_and_maps(tmp_path):
    bad = read_draft_checkpoint(make_drafter(tmp_path / "a", draft_vocab_size=32))
    found = [x for x in bad.validate(Target()) if x.code == "draft_vocab"]
    assert {x.field for x in found} == {"lm_head.weight", "d2t"}
    d = make_drafter(tmp_path / "b")
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(d / "model.safetensors"))
    tensors["t2d"] = torch.roll(tensors["t2d"], 1)  # marks other tokens than d2t maps to
    save_file(tensors, str(d / "model.safetensors"))
    assert "vocab_map" in codes(read_draft_checkpoint(d).validate(Target()), "error")
    assert "vocab_size" in codes(read_draft_checkpoint(d).validate(Target(vocab_size=300)), "error")


def test_a_d2t_mapping_two_draft_ids_to_one_token_is_refused(tmp_path):
    """64 draft tokens over a 256-token vocabulary: draft id 1 re-pointed at draft id 0's target token and t2d
    marking one other token, so t2d still marks 64 (the count the check compared) and every d2t target: refused as
    read_vocab_mapping refuses the same maps, naming t2d, its shard, found and expected."""
    from safetensors.torch import load_file, save_file

    d = make_drafter(tmp_path / "d")
    tensors = load_file(str(d / "model.safetensors"))
    d2t, t2d = tensors["d2t"], tensors["t2d"]
    t2d[1 + int(d2t[1])] = False
    d2t[1] = int(d2t[0]) - 1  # draft id 1 -> draft id 0's target
    t2d[int(torch.nonzero(~t2d)[0])] = True  # 64 marked again
    save_file(tensors, str(d / "model.safetensors"))
    (f,) = [x for x in read_draft_checkpoint(d).validate(Target()) if x.code == "vocab_map"]
    assert (f.severity, f.field, f.file) == ("error", "t2d", d / "model.safetensors")
    assert (f.found, f.expected) == ("64 tokens marked", "the 64 distinct target tokens of d2t")


def test_layer_shapes_disagree_with_config(tmp_path):
    ck = read_draft_checkpoint(make_drafter(tmp_path / "d", head_dim=32))
    errs = [x for x in ck.validate(None) if x.code == "layer_shape"]
    assert {x.field for x in errs} >= {"midlayer.self_attn.q_proj.weight", "midlayer.self_attn.o_proj.weight"}


def test_small_max_positions(tmp_path):
    ck = read_draft_checkpoint(make_drafter(tmp_path / "d", max_position_embeddings=2048))
    f = [x for x in ck.validate(Target(max_position_embeddings=8192)) if x.code == "max_positions"]
    assert f and "#271" in f[0].message and f[0].hint == "set it to 8192"
    assert "max_positions" in codes(ck.validate(None), "warning")


def test_truncated_safetensors_names_file(tmp_path):
    d = make_drafter(tmp_path / "d")
    blob = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(blob[:100])
    with pytest.raises(CheckpointError) as exc:
        read_draft_checkpoint(d)
    assert "model.safetensors" in str(exc.value)


def test_bad_configs(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        read_draft_checkpoint(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_draft_checkpoint(d)
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 64}))
    with pytest.raises(ConfigError, match="not an EAGLE-3 drafter"):
        read_draft_checkpoint(d)
    cfg = sglang_config(hidden_size=H, vocab_size=VOCAB, draft_vocab_size=DRAFT_VOCAB, aux_layer_ids=None,
                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=128)
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ["2", 15, 27]}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError) as exc:
        read_draft_checkpoint(d)
    assert exc.value.field == "eagle_config.eagle_aux_hidden_state_layer_ids"
