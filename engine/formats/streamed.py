"""A target forward that never holds more than about two decoder layers: for targets larger than memory.

A 1T-parameter target (Kimi-K2, DeepSeek-V3: 61 layers of ~16 B parameters) does not fit in one
machine's memory, but the wiring checks need only its hidden states over a few samples. So:

    x = embed(ids)                              # [B, T, H]        hs[0]
    for i in 0..L-1:                            # one decoder layer in memory at a time
        layer_i = build + load layer i           # from the sharded safetensors, memory-mapped
        x = layer_i(x)                          # the whole batch, causal, no KV cache
        keep x                                  #                  hs[i+1]
    x = norm(x); top1 = argmax(lm_head(x))      #                  hs[L] (final norm), the next tokens

While layer i runs, a worker thread reads layer i+1 (the disk and the arithmetic overlap), hence
"two layers". What stays resident: the activations of the samples (L+1 states of [B, T, H]) and the
embedding and head tables. The result equals the in-memory forward (the same modules run the same
arithmetic on the same inputs): ``tests/engine/formats/test_streamed.py`` checks it bit for bit.

Quantized weights as they ship (DeepSeek's block FP8, compressed-tensors INT4 pack-quantized as in
Kimi-K2-Thinking, NVFP4) are dequantised as they are read: :mod:`eaglelab.engine.formats.quantized`.
"""

from __future__ import annotations

import gc
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from eaglelab.engine.formats.loader import find_stored, parse_dtype, read_tensors, safetensors_files, stored_tensor
from eaglelab.engine.formats.quantized import FP8_BLOCK, QuantizedReader, dequantize_fp8  # noqa: F401 (re-exported)
from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.layers import RMSNorm, Rotary
from eaglelab.engine.model.model import DecoderLayer
from eaglelab.engine.model.tp_layers import ParallelLMHead, VocabParallelEmbedding
from eaglelab.engine.model.weights import copy_sharded

LayerProgress = Callable[[int, int, float], None]  # (layers done, total, seconds for the last one)


@dataclass(frozen=True)
class StreamedStates:
    """What one streamed pass gives: every HF hidden state and the target's greedy next tokens."""

    hidden_states: list[torch.Tensor]  # L+1 x [B, T, H] on the CPU (hs[L] after the final norm)
    next_tokens: torch.Tensor  # [B, T] argmax of the target's logits at each position
    draft_logprobs: torch.Tensor | None  # [B, T, len(vocab_ids)] log-softmax over vocab_ids, if asked
    seconds_per_layer: list[float]
    peak_bytes: int  # the most parameter bytes resident at once (layers + embedding + head)


class StreamedTarget:
    """An HF-format target read one decoder layer at a time (``model_dir``: config.json + safetensors).

    ``device``/``dtype``: where and how each layer runs. Construction reads config.json and the
    safetensors headers only; :meth:`run` does the pass.
    """

    def __init__(self, model_dir: str | Path, *, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype = torch.float32, prefetch: bool = True) -> None:
        self.path = Path(model_dir)
        self.config = ModelConfig.from_json(self.path / "config.json")
        self.device, self.dtype, self.prefetch = torch.device(device), parse_dtype(dtype), prefetch
        self._handles = read_tensors(safetensors_files(self.path))
        self.quant = QuantizedReader.of(self.path, self.device)  # dequantize where the layers run
        self.embed_tokens = self._build(lambda: VocabParallelEmbedding(self.config.vocab_size, self.config.hidden_size, None),
                                        "embed_tokens.")

    # ---- reading ---------------------------------------------------------------------------------------
    def _read(self, prefix: str) -> Callable[[str], tuple[torch.Tensor, str] | None]:
        def read(name: str) -> tuple[torch.Tensor, str] | None:
            for stored in self.quant.stored_names(prefix + name):
                src = find_stored(stored, self._handles)  # HF's names, or Kimi-K2.5's language_model.
                if src is not None:
                    return self.quant.load(src, self._tensor(src), self._tensor), f"{self._handles[src][0]}: {src}"
            return None

        return read

    def _tensor(self, name: str) -> torch.Tensor | None:
        return stored_tensor(self._handles, name)

    @property
    def notes(self) -> tuple[str, ...]:
        """How the config was read (a multimodal wrapper's text_config) and how the layers read so far were
        read (quantized weights dequantized on load), for a run's notes."""
        return tuple(self.config.notes) + tuple(self.quant.notes(self.dtype))

    def _build(self, make: Callable[[], nn.Module], prefix: str) -> nn.Module:
        """``make()`` on the meta device, cast to ``dtype`` (routers stay float32), allocated on
        ``device`` and filled from the checkpoint tensors under ``prefix``."""
        with torch.device("meta"):
            module = make().to(self.dtype)
        module = module.to_empty(device=self.device)
        copy_sharded(module, self._read(prefix), str(self.path))
        return module.eval()

    def _layer(self, i: int) -> nn.Module:
        return self._build(lambda: DecoderLayer(self.config, i, None), f"layers.{i}.")

    # ---- the pass ----------------------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, input_ids: torch.Tensor, progress: LayerProgress | None = None,
            vocab_ids: torch.Tensor | None = None, keep: tuple[int, ...] | None = None) -> StreamedStates:
        """All HF hidden states and the greedy next tokens for ``input_ids`` [B, T] (causal; right
        padding is harmless: no real token attends to a later one); with ``vocab_ids`` [V'] also the
        log-softmax of the logits restricted to those ids (a drafter's vocabulary).

        ``keep``: HF indices whose states to hold (default all L+1); the others are dropped as soon as
        the next layer has run, so a capture of 3 taps of a 61-layer target holds 4 states, not 62.
        ``hidden_states[i]`` is then an empty tensor for every ``i`` not kept (hs[L], after the final
        norm, always comes back)."""
        import time

        cfg = self.config
        ids = input_ids.to(self.device)
        x = self.embed_tokens(ids)  # [B, T, H]
        rotary = Rotary(cfg.rope_dim, cfg.rope_theta, cfg.rope_scaling_dict).to(self.device)
        cos, sin = rotary(torch.arange(ids.shape[1], device=self.device).expand_as(ids), x.dtype)
        wanted = set(range(cfg.num_layers + 1) if keep is None else keep)

        def hold(i: int, state: torch.Tensor) -> torch.Tensor:
            return state.cpu() if i in wanted else torch.empty(0)

        states, seconds = [hold(0, x)], []
        resident = _nbytes(self.embed_tokens)
        peak = resident
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending: Future = pool.submit(self._layer, 0)
            for i in range(cfg.num_layers):
                t0 = time.perf_counter()
                layer = pending.result()
                if self.prefetch and i + 1 < cfg.num_layers:
                    pending = pool.submit(self._layer, i + 1)  # read the next layer while this one runs
                x = layer(x, cos, sin, None, None, None)  # [B, T, H]
                states.append(hold(i + 1, x))
                peak = max(peak, resident + _nbytes(layer) * (2 if self.prefetch and i + 1 < cfg.num_layers else 1))
                del layer
                gc.collect()
                if not self.prefetch and i + 1 < cfg.num_layers:
                    pending = pool.submit(self._layer, i + 1)
                seconds.append(time.perf_counter() - t0)
                if progress is not None:
                    progress(i + 1, cfg.num_layers, seconds[-1])
        states[-1], top1, logp, head_bytes = self._finish(x, vocab_ids)
        return StreamedStates(states, top1, logp, seconds, max(peak, resident + head_bytes))

    def _finish(self, x: torch.Tensor, vocab_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
        """The final norm (hs[L] is taken after it, as HF does) and the head's argmax."""
        cfg = self.config
        norm = self._build(lambda: RMSNorm(cfg.hidden_size, cfg.rms_norm_eps), "norm.")
        x = norm(x)
        if cfg.tie_word_embeddings:
            weight = self.embed_tokens.weight
        else:
            weight = self._build(lambda: ParallelLMHead(cfg.hidden_size, cfg.vocab_size, None, cfg.num_layers), "lm_head.").weight
        top1, logp = [], []
        for row in x.split(1):  # [1, T, V] logits at a time
            logits = nn.functional.linear(row, weight).float()
            top1.append(logits.argmax(-1).cpu())
            if vocab_ids is not None:
                logp.append(logits[..., vocab_ids.to(logits.device)].log_softmax(-1).cpu())
        return x.cpu(), torch.cat(top1), torch.cat(logp) if logp else None, weight.numel() * weight.element_size()


def _nbytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())
