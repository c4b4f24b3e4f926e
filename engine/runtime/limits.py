"""What a generation needs, checked before anything is allocated: the context window and memory.

A prompt past the model's context window runs for minutes and produces garbage; a huge
``max_new_tokens`` sizes a KV cache that the OOM killer ends without a word. Both are refused here
with the numbers and what to do.
"""

from __future__ import annotations

from pathlib import Path

import torch

from eaglelab.engine.errors import EagleLabError
from eaglelab.engine.model.config import ModelConfig

MEMORY_HEADROOM = 0.8  # use at most this share of the memory available now


def check_context(config: ModelConfig, prompt_tokens: int, max_new_tokens: int, flag: str = "--max-new-tokens",
                  prompt_field: str = "PROMPT", prompt_hint: str = "shorten the prompt") -> None:
    """Prompt plus new tokens must fit the model's context window (``max_position_embeddings``); ``flag``
    is the command's name for the new tokens, ``prompt_field`` and ``prompt_hint`` name the prompt's source and
    what to do when the prompt alone does not fit."""
    window = config.max_position_embeddings
    if prompt_tokens > window:
        raise EagleLabError("the prompt is longer than the model's context window", field=prompt_field,
                            found=f"{prompt_tokens} tokens", expected=f"<= {window} (max_position_embeddings)",
                            hint=prompt_hint)
    if prompt_tokens + max_new_tokens > window:
        raise EagleLabError("prompt + new tokens exceed the model's context window", field=flag,
                            found=f"{prompt_tokens} prompt + {max_new_tokens} new = {prompt_tokens + max_new_tokens} tokens",
                            expected=f"<= {window} (max_position_embeddings)",
                            hint=f"use {flag} {window - prompt_tokens} or less")


def length_in_window(config: ModelConfig, max_length: int, flag: str = "--max-length") -> tuple[int, str | None]:
    """(tokens kept per sample, the reason when fewer than ``max_length``): training and capture cut their
    samples at the model's context window, since positions beyond it were never trained in the target."""
    window = config.max_position_embeddings
    if max_length <= window:
        return max_length, None
    return window, (f"samples cut at {window} tokens, the target's context window (max_position_embeddings); "
                    f"{flag} {max_length} reaches beyond it")


def kv_cache_bytes(config: ModelConfig, batch: int, slots: int, dtype: torch.dtype, kv_heads: int | None = None) -> int:
    """Bytes of a target KV cache: keys and values for every layer, row and slot."""
    heads = config.num_kv_heads if kv_heads is None else kv_heads
    per_slot = 2 * config.num_layers * heads * config.head_dim * torch.empty((), dtype=dtype).element_size()
    return batch * slots * per_slot


def available_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors now: CUDA's free memory, or Linux's MemAvailable; None if unknown."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(need: int, device: torch.device, what: str) -> None:
    """Refuse an allocation of ``need`` bytes that does not fit in the memory available on ``device``."""
    free = available_bytes(device)
    if free is None or need <= free * MEMORY_HEADROOM:
        return
    gib = 1 << 30
    raise EagleLabError(f"not enough memory for {what}", field="--max-new-tokens",
                        found=f"{need / gib:.2f} GiB needed", expected=f"<= {free * MEMORY_HEADROOM / gib:.2f} GiB "
                        f"({MEMORY_HEADROOM:.0%} of the {free / gib:.2f} GiB available on {device})",
                        hint="lower --max-new-tokens, the batch size or the prompt length")
