"""Convert a Llama-architecture GGUF file into an HF-style model directory.

Writes ``config.json``, ``model.safetensors`` (float32, dequantized), ``tokenizer.json``,
``tokenizer_config.json`` (with the chat template) and ``generation_config.json``.

GGUF stores the q and k projections permuted for llama.cpp's interleaved rotary layout
(per head, the two rotary halves interleaved row by row); :func:`unpermute_qk` restores HF's
rotate-half layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from eaglelab.engine.errors import CheckpointError

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation: w [n_heads * D, H] -> HF layout.

    llama.cpp stores, per head, rows (r0, r_{D/2}, r1, r_{D/2+1}, ...); HF keeps (r0..r_{D/2-1},
    r_{D/2}..r_{D-1}).
    """
    out_dim = w.shape[0]
    d = out_dim // n_heads
    return w.reshape(n_heads, d // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def permute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of :func:`unpermute_qk` (HF layout -> llama.cpp layout)."""
    out_dim = w.shape[0]
    d = out_dim // n_heads
    return w.reshape(n_heads, 2, d // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def gguf_config(reader, path: Path) -> dict:
    """The HF config.json a Llama GGUF describes."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise CheckpointError(
            "unsupported GGUF architecture", file=path, field="general.architecture",
            found=arch, expected="llama",
        )
    p = f"{arch}."
    n_layers = _field(reader, p + "block_count")
    hidden = _field(reader, p + "embedding_length")
    heads = _field(reader, p + "attention.head_count")
    names = {t.name for t in reader.tensors}
    vocab = _field(reader, p + "vocab_size") or len(_field(reader, "tokenizer.ggml.tokens"))
    eos = _field(reader, "tokenizer.ggml.eos_token_id")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(vocab),
        "hidden_size": int(hidden),
        "intermediate_size": int(_field(reader, p + "feed_forward_length")),
        "num_hidden_layers": int(n_layers),
        "num_attention_heads": int(heads),
        "num_key_value_heads": int(_field(reader, p + "attention.head_count_kv", heads)),
        "head_dim": int(_field(reader, p + "rope.dimension_count", hidden // heads)),
        "rms_norm_eps": float(np.float32(_field(reader, p + "attention.layer_norm_rms_epsilon", 1e-5))),
        "rope_theta": float(_field(reader, p + "rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, p + "context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": eos,
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rope_scaling": None,
    }


def gguf_tokenizer_json(reader) -> dict:
    """A ``tokenizers`` byte-level BPE tokenizer.json built from the GGUF vocabulary and merges."""
    model = _field(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise CheckpointError(
            "unsupported GGUF tokenizer", field="tokenizer.ggml.model", found=model, expected="gpt2 (byte-level BPE)"
        )
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    merges = _field(reader, "tokenizer.ggml.merges")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if pre in ("smollm", "starcoder", "refact"):  # digits split one by one before the GPT-2 regex
        pre_tok = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, byte_level]}
    else:
        pre_tok = byte_level
    added = [
        {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, (tok, typ) in enumerate(zip(tokens, types))
        if typ == 3  # CONTROL
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tok,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": [m.split(" ", 1) for m in merges],
        },
    }


def gguf_tensors(reader, cfg: dict, progress: Callable[[int, int], None] | None = None) -> dict[str, torch.Tensor]:
    """Dequantized float32 tensors under HF names (with the ``model.`` prefix)."""
    from gguf.quants import dequantize

    out: dict[str, torch.Tensor] = {}
    total = len(reader.tensors)
    for n, t in enumerate(reader.tensors):
        arr = dequantize(t.data, t.tensor_type)  # numpy, shape reversed from GGUF's
        w = torch.from_numpy(np.array(arr, dtype=np.float32, copy=True))
        name = t.name
        if name == "token_embd.weight":
            out["model.embed_tokens.weight"] = w
        elif name == "output_norm.weight":
            out["model.norm.weight"] = w
        elif name == "output.weight":
            out["lm_head.weight"] = w
        elif name.startswith("blk."):
            _, idx, kind, _ = name.split(".", 3)
            if kind not in _LAYER_NAMES:
                raise CheckpointError("unknown GGUF tensor", field=name, expected=sorted(_LAYER_NAMES))
            if kind == "attn_q":
                w = unpermute_qk(w, cfg["num_attention_heads"])
            elif kind == "attn_k":
                w = unpermute_qk(w, cfg["num_key_value_heads"])
            out[f"model.layers.{idx}.{_LAYER_NAMES[kind]}.weight"] = w
        elif name == "rope_freqs.weight":
            continue
        else:
            raise CheckpointError("unknown GGUF tensor", field=name)
        if progress:
            progress(n + 1, total)
    return out


def convert_gguf(gguf_path: Path, out_dir: Path, progress: Callable[[int, int], None] | None = None) -> Path:
    """Convert ``gguf_path`` into an HF-style directory ``out_dir`` (written atomically)."""
    import gguf
    from safetensors.torch import save_file

    gguf_path = Path(gguf_path)
    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except (ValueError, OSError) as exc:
        raise CheckpointError(f"cannot read GGUF file ({exc})", file=gguf_path) from None
    cfg = gguf_config(reader, gguf_path)
    tensors = gguf_tensors(reader, cfg, progress)
    tmp = out_dir.with_name(out_dir.name + ".partial")
    tmp.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "source": gguf_path.name})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    (tmp / "tokenizer.json").write_text(json.dumps(gguf_tokenizer_json(reader), ensure_ascii=False))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    tok_cfg = {
        "chat_template": _field(reader, "tokenizer.chat_template"),
        "bos_token": tokens[cfg["bos_token_id"]] if cfg.get("bos_token_id") is not None else None,
        "eos_token": tokens[cfg["eos_token_id"]] if cfg.get("eos_token_id") is not None else None,
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
        "tokenizer_class": "GPT2Tokenizer",
    }
    (tmp / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    gen = {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]}
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir
