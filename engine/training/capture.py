"""Capture EAGLE-3 training data from a target: self-distillation into SpecForge's offline format.

For each prompt the target writes its own response (batched generation with the engine), then one
batched causal forward over prompt + response records, per token:

* ``input_ids`` [T] and ``loss_mask`` [T] (1 on the response tokens, the assistant's, EOS included);
* ``hidden_state`` [1, T, H]: the final hidden state after the final norm (the target's logits are
  ``lm_head(hidden_state)``);
* ``aux_hidden_state`` [1, T, n*H]: the aux states at the chosen layer ids, concatenated in id order,

all in the target's dtype, written with :func:`eaglelab.engine.formats.specforge_data.write_sample`.
``manifest.json`` beside the samples records the target's identity (config and weights digests),
the layer ids with their convention and HF indices, dtype, chat template and counts.

Worked example (SmolLM2-135M, 30 layers, default ids): SpecForge's default ``[1, 14, 26]`` in the
SGLang convention taps ``hs[2], hs[15], hs[27]``: ``aux_hidden_state`` is [1, T, 1728].
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from eaglelab.engine.formats.conventions import CONVENTIONS, default_ids, ids_to_hf_indices
from eaglelab.engine.errors import ConfigError, read_json_object
from eaglelab.engine.model.model import Transformer
from eaglelab.engine.formats.specforge_data import sample_path, write_sample

if TYPE_CHECKING:
    from eaglelab.engine.formats.streamed import StreamedTarget

MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1
ProgressFn = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass(frozen=True)
class CaptureSettings:
    """How to capture. ``layer_ids`` are read in ``convention`` (SpecForge writes "sglang")."""

    layer_ids: tuple[int, ...]
    convention: str = "sglang"
    max_new_tokens: int = 512
    batch_size: int = 32
    temperature: float = 0.0  # 0 = greedy responses
    seed: int = 0
    max_length: int = 2048  # prompt + response tokens kept per sample
    compress: bool = False

    def __post_init__(self) -> None:
        if self.convention not in CONVENTIONS:
            raise ConfigError("unknown layer-id convention", field="--convention", found=self.convention,
                              expected=" | ".join(CONVENTIONS))
        for name in ("max_new_tokens", "batch_size", "max_length"):
            if getattr(self, name) < 1:
                raise ConfigError("must be >= 1", field="--" + name.replace("_", "-"), found=getattr(self, name))

    @property
    def hf_indices(self) -> tuple[int, ...]:
        """The HF ``output_hidden_states`` indices the ids name."""
        return ids_to_hf_indices(self.layer_ids, self.convention)


@dataclass(frozen=True)
class CaptureSummary:
    """What a capture wrote (this run plus samples found from an earlier, resumed one)."""

    samples: int
    skipped_existing: int
    dropped: int  # prompts with no room for a response, or an empty one
    tokens: int
    assistant_tokens: int
    out_dir: Path
    sample_lengths: tuple[int, ...] = field(default=(), repr=False)


def default_layer_ids(num_layers: int) -> tuple[int, ...]:
    """SpecForge's default aux ids for an ``num_layers``-layer target, in the SGLang convention."""
    return default_ids(num_layers, "sglang")


def check_layer_ids(hf: tuple[int, ...], num_layers: int, field_name: str = "--layer-ids", *,
                    convention: str = "sglang", source: str | Path | None = None) -> None:
    """Taps must be decoder-layer outputs a serving engine can capture: HF indices 1..L-1, distinct.
    ``convention``: how the ids the user wrote count layers (for the hint); ``source``: the target's config."""
    bad = [h for h in hf if not 1 <= h <= num_layers - 1]
    if bad or len(set(hf)) != len(hf) or not hf:
        first = 0 if convention == "sglang" else 1  # the ids naming hs[1] .. hs[L-1]
        raise ConfigError(
            "layer ids name no tappable layer, the embedding output, or a layer twice", file=source, field=field_name,
            found=f"HF indices {list(hf)}", expected=f"distinct HF indices in 1..{num_layers - 1} ({convention} ids "
            f"{first}..{num_layers - 2 + first} for this {num_layers}-layer target)",
            hint="ids in the SGLang convention count decoder-layer outputs from 0 (hs[k+1])" if convention == "sglang"
            else f"ids in the {convention} convention name hs[k], the input of decoder layer k",
        )
    if list(hf) != sorted(hf):
        raise ConfigError(
            "layer ids must be ascending", file=source, field=field_name, found=list(hf), expected=sorted(hf),
            hint="serving engines concatenate the aux states in layer order; the data must too",
        )


# ---- identity ------------------------------------------------------------------------------------


def _sha256_files(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in sorted(files):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 24):
                h.update(chunk)
    return h.hexdigest()


def target_identity(model: Transformer, model_dir: Path | None = None, name: str | None = None,
                    full_hash: bool = True) -> dict[str, Any]:
    """Config and weights digests of the target: of its files when ``model_dir`` is given, else of
    the in-memory config and parameters (``model`` needs only ``.config`` with ``model_dir``).
    ``full_hash=False``: the weights digest covers each file's name, size and first MiB, not every
    byte (hashing a 1T-parameter checkpoint would read 2 TB once more)."""
    cfg = model.config
    ident: dict[str, Any] = {
        "name": name or (model_dir.name if model_dir else "in-memory"),
        "path": str(model_dir) if model_dir else None,
        "architecture": cfg.architecture, "num_layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_position_embeddings,
    }
    if model_dir is not None:
        from eaglelab.engine.formats.loader import safetensors_files

        ident["config_sha256"] = hashlib.sha256((model_dir / "config.json").read_bytes()).hexdigest()
        if full_hash:
            ident["weights_sha256"] = _sha256_files(safetensors_files(model_dir))
        else:
            from eaglelab.engine.formats.loader import model_digest

            ident["weights_digest"] = model_digest(model_dir)  # names, sizes and first MiB of the shards
        return ident
    ident["config_sha256"] = hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode()).hexdigest()
    h = hashlib.sha256()
    for pname, p in sorted(model.state_dict().items()):
        h.update(pname.encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    ident["weights_sha256"] = h.hexdigest()
    return ident


# ---- the three stages ----------------------------------------------------------------------------


def generate_responses(
    model: Transformer,
    prompts: list[list[int]],
    *,
    eos_token_ids: tuple[int, ...],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
) -> list[list[int]]:
    """The target's own responses to ``prompts`` (one batch), EOS included where it ended a row."""
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.engine.runtime.sampling import SamplingParams

    engine = Engine(model, eos_token_ids=eos_token_ids)
    device = next(model.parameters()).device
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    result = engine.generate(prompts, max_new_tokens, SamplingParams(temperature=temperature), gen)
    return result.tokens


def build_example(prompt: list[int], response: list[int], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids [T] = prompt + response (cut at ``max_length``), loss_mask [T] = 1 on the response."""
    ids = (list(prompt) + list(response))[:max_length]
    mask = ([0] * len(prompt) + [1] * len(response))[:max_length]
    return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)


@torch.inference_mode()
def forward_states(
    model: Transformer, sequences: list[torch.Tensor], hf_indices: tuple[int, ...]
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One padded causal forward over ``sequences`` ([T_i] each); yields per sequence the final
    hidden [1, T_i, H] and the aux states [1, T_i, n*H], on the CPU in the model's dtype."""
    device = next(model.parameters()).device
    ids = _padded(sequences).to(device)  # [B, T]; right padding never affects earlier positions (causal)
    positions = torch.arange(ids.shape[1], device=device).expand_as(ids)
    hidden, aux = model(ids, positions, taps=hf_indices)  # [B, T, H], [B, T, n*H]
    hidden, aux = hidden.cpu(), aux.cpu()
    for b, s in enumerate(sequences):
        t = int(s.numel())
        yield hidden[b: b + 1, :t].clone(), aux[b: b + 1, :t].clone()


# ---- the whole capture ---------------------------------------------------------------------------


def _exists(out_dir: Path, index: int) -> bool:
    return sample_path(out_dir, index).exists() or sample_path(out_dir, index, compress=True).exists()


StatesFn = Callable[[list[torch.Tensor], tuple[int, ...]], Iterator[tuple[torch.Tensor, torch.Tensor]]]
ResponsesFn = Callable[[list[int], int], list[list[int]]]  # (prompt indices, seed salt) -> responses


@dataclass(frozen=True)
class _Target:
    """What the capture loop needs of a target: its depth and dtype, how to respond, how to read states."""

    num_layers: int
    dtype: torch.dtype
    respond: ResponsesFn
    states: StatesFn


def capture(
    model: Transformer,
    prompts: list[list[int]],
    out_dir: str | Path,
    settings: CaptureSettings,
    *,
    eos_token_ids: tuple[int, ...],
    responses: list[list[int]] | None = None,
    identity: dict[str, Any] | None = None,
    chat_template: str | None = None,
    extra: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
) -> CaptureSummary:
    """Generate responses and capture states for ``prompts`` (token ids, chat template applied),
    writing sample ``i`` for prompt ``i``. Samples already in ``out_dir`` are kept (resume).
    ``responses`` (token ids, one per prompt): use these instead of generating.

    Prompts are batched by length (``settings.batch_size`` per batch); generation and the forward
    both run batched on the model's device.
    """
    def respond(chunk: list[int], salt: int) -> list[list[int]]:
        if responses is not None:
            return [list(responses[i]) for i in chunk]
        room = settings.max_length - max(len(prompts[i]) for i in chunk)
        return generate_responses(
            model, [prompts[i] for i in chunk], eos_token_ids=eos_token_ids,
            max_new_tokens=max(1, min(settings.max_new_tokens, room)), temperature=settings.temperature,
            seed=settings.seed + salt,
        )

    target = _Target(model.config.num_layers, next(model.parameters()).dtype, respond,
                     lambda seqs, hf: forward_states(model, seqs, hf))
    return _capture(target, prompts, out_dir, settings, identity or target_identity(model), chat_template, extra, progress)


def capture_streamed(
    streamed: StreamedTarget,
    prompts: list[list[int]],
    responses: list[list[int]],
    out_dir: str | Path,
    settings: CaptureSettings,
    *,
    identity: dict[str, Any],
    chat_template: str | None = None,
    extra: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
    layer_progress: Callable[[int, int, float], None] | None = None,
) -> CaptureSummary:
    """:func:`capture` with the target run one decoder layer at a time (``streamed``: a
    :class:`~eaglelab.engine.formats.streamed.StreamedTarget`), for targets larger than memory.

    The responses are given (one per prompt): generating them would need one pass over all the
    weights per token, so they come from where the target is served. Each batch of
    ``settings.batch_size`` prompts costs one read of every layer; the samples written are those of
    :func:`capture` given the same responses."""
    if len(responses) != len(prompts):
        raise ConfigError("one response per prompt", field="responses", found=len(responses), expected=len(prompts))
    target = _Target(streamed.config.num_layers, streamed.dtype, lambda chunk, salt: [list(responses[i]) for i in chunk],
                     lambda seqs, hf: streamed_states(streamed, seqs, hf, layer_progress))
    return _capture(target, prompts, out_dir, settings, identity, chat_template, extra, progress)


def streamed_states(streamed: StreamedTarget, sequences: list[torch.Tensor], hf_indices: tuple[int, ...],
                    layer_progress: Callable[[int, int, float], None] | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`forward_states` through a streamed target: only the taps and hs[L] are held."""
    ids = _padded(sequences)  # [B, T]
    L = streamed.config.num_layers
    hs = streamed.run(ids, progress=layer_progress, keep=tuple(hf_indices) + (L,)).hidden_states
    aux = torch.cat([hs[h] for h in hf_indices], -1)  # [B, T, n*H]
    for b, s in enumerate(sequences):
        t = int(s.numel())
        yield hs[L][b: b + 1, :t].clone(), aux[b: b + 1, :t].clone()


def _padded(sequences: list[torch.Tensor]) -> torch.Tensor:
    """[T_i] each -> [B, max T], right-padded with 0 (causal: padding never reaches earlier positions)."""
    ids = torch.zeros(len(sequences), max(int(s.numel()) for s in sequences), dtype=torch.long)
    for b, s in enumerate(sequences):
        ids[b, : s.numel()] = s
    return ids


def _capture(target: _Target, prompts, out_dir, settings, identity, chat_template, extra, progress) -> CaptureSummary:
    """The loop both captures share: batches by length, resume, manifest."""
    out_dir = Path(out_dir)
    hf = settings.hf_indices
    check_layer_ids(hf, target.num_layers)
    _check_same_target(read_manifest(out_dir), identity, out_dir)
    todo = [i for i in range(len(prompts)) if not _exists(out_dir, i)]
    skipped = len(prompts) - len(todo)
    todo.sort(key=lambda i: (len(prompts[i]), i))  # similar lengths share a batch
    write_manifest(out_dir, _manifest(target.dtype, settings, identity, chat_template, extra, status="incomplete"))
    dropped, done = 0, 0
    bs = settings.batch_size
    for start in range(0, len(todo), bs):
        chunk = [i for i in todo[start: start + bs] if len(prompts[i]) < settings.max_length]
        dropped += len(todo[start: start + bs]) - len(chunk)
        if chunk:
            dropped += _capture_chunk(target, prompts, chunk, out_dir, settings, hf, start)
        done += len(todo[start: start + bs])
        if progress:
            progress("capture", done, len(todo))
    return finish_manifest(out_dir, skipped=skipped, dropped=dropped)


def _check_same_target(manifest: dict[str, Any] | None, identity: dict[str, Any], out_dir: Path) -> None:
    """Samples kept from an earlier capture must come from the same target (its config digest)."""
    old = (manifest or {}).get("target") or {}
    if not isinstance(old, dict) or "config_sha256" not in old:
        return
    if old.get("config_sha256") != identity.get("config_sha256"):
        raise ConfigError("the directory holds data captured from another target", file=manifest_path(out_dir),
                          field="target.config_sha256", found=str(identity.get("config_sha256"))[:16],
                          expected=f"{str(old.get('config_sha256'))[:16]} ({old.get('name')})",
                          hint="use another --out, or the target the data was captured from")


def _capture_chunk(target: _Target, prompts, chunk, out_dir, settings, hf, salt) -> int:
    """Respond to, forward and write one batch of prompts; returns how many were dropped."""
    keep = [(i, r) for i, r in zip(chunk, target.respond(chunk, salt)) if r]
    if not keep:
        return len(chunk)
    examples = [build_example(prompts[i], r, settings.max_length) for i, r in keep]
    states = target.states([ids for ids, _ in examples], hf)
    for (i, _), (ids, mask), (hidden, aux) in zip(keep, examples, states):
        write_sample(out_dir, i, {"input_ids": ids, "loss_mask": mask, "hidden_state": hidden,
                                  "aux_hidden_state": aux}, compress=settings.compress)
    return len(chunk) - len(keep)


# ---- manifest ------------------------------------------------------------------------------------


def _manifest(dtype: torch.dtype, settings: CaptureSettings, identity, chat_template, extra, status: str) -> dict[str, Any]:
    return {
        "manifest_version": MANIFEST_VERSION,
        "format": "specforge-offline",
        "status": status,
        "target": identity,
        "layer_ids": list(settings.layer_ids),
        "layer_id_convention": settings.convention,
        "hf_indices": list(settings.hf_indices),
        "sglang_layer_ids": [h - 1 for h in settings.hf_indices],
        "dtype": str(dtype).replace("torch.", ""),
        "chat_template": chat_template,
        "generation": {"max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature,
                       "seed": settings.seed, "batch_size": settings.batch_size, "max_length": settings.max_length},
        "self_distillation": True,
        "versions": {"torch": torch.__version__, "python": platform.python_version()},
        **(extra or {}),
    }


def manifest_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / MANIFEST_NAME


def write_json_atomic(path: Path, obj: dict[str, Any]) -> Path:
    """Write ``obj`` as indented JSON to ``path`` whole or not at all (a reader never sees half)."""
    from eaglelab.engine.formats.safe_write import write_atomic

    text = json.dumps(obj, indent=2, default=str) + "\n"
    return write_atomic(path, lambda tmp: tmp.write_text(text), what=path.name)


def write_manifest(data_dir: str | Path, manifest: dict[str, Any]) -> Path:
    return write_json_atomic(manifest_path(data_dir), manifest)


def read_manifest(data_dir: str | Path) -> dict[str, Any] | None:
    """The data directory's manifest, or None when it has none (SpecForge data written by others)."""
    path = manifest_path(data_dir)
    if not path.exists():
        return None
    return read_json_object(path)


def finish_manifest(out_dir: Path, *, skipped: int, dropped: int) -> CaptureSummary:
    """Count what the directory holds and mark the manifest complete."""
    from eaglelab.engine.training.draft_vocab import read_ids_and_mask
    from eaglelab.engine.formats.specforge_data import list_samples

    lengths, assistant = [], 0
    for path in list_samples(out_dir):
        ids, mask = read_ids_and_mask(path)
        lengths.append(int(ids.numel()))
        assistant += int((mask != 0).sum())
    manifest = read_manifest(out_dir) or {}
    manifest["status"] = "complete"
    manifest["counts"] = {"samples": len(lengths), "tokens": sum(lengths), "assistant_tokens": assistant,
                          "dropped_prompts": dropped}
    write_manifest(out_dir, manifest)
    return CaptureSummary(len(lengths), skipped, dropped, sum(lengths), assistant, out_dir, tuple(lengths))
