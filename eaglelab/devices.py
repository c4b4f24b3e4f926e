"""Which device and dtype a command runs on, each with the reason shown to the user (``--device``,
``--dtype``): every command that loads a model asks here."""

from __future__ import annotations

from typing import Any


def pick_device(name: str) -> tuple[Any, str]:
    """``--device`` (auto | cpu | cuda | cuda:N) -> (torch.device, why). auto: CUDA when there is one."""
    import torch

    from eaglelab.engine.errors import EagleLabError

    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda"), "auto: CUDA is available"
        return torch.device("cpu"), "auto: no CUDA device"
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise EagleLabError("unknown device", field="--device", found=name, expected="auto | cpu | cuda | cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EagleLabError("CUDA is not available here", field="--device", found=name, hint="use --device cpu")
    return dev, "as asked"


def pick_dtype(name: str, device: Any) -> tuple[str, str]:
    """``--dtype`` -> (dtype name, why). auto: bfloat16 on CUDA, float32 on CPU."""
    from eaglelab.engine.formats.loader import parse_dtype

    if name == "auto":
        if device.type == "cuda":
            return "bfloat16", "auto: bfloat16 on CUDA (tensor cores, half the weight traffic)"
        return "float32", "auto: float32 on CPU (exact, and bf16 matmuls are slow on most CPUs)"
    parse_dtype(name)
    return str(parse_dtype(name)).replace("torch.", ""), "as asked"


def rank_device(device: Any, reason: str, tp: Any) -> tuple[Any, str]:
    """Under tensor parallelism on CUDA, this rank's own GPU (as torchrun numbers them); else as given."""
    import torch

    if tp is None or device.type != "cuda":
        return device, reason
    return (torch.device("cuda", tp.local_rank),
            reason + f"; tensor parallel rank {tp.rank} of {tp.world_size} on GPU {tp.local_rank}")


def device_name(device: Any) -> str:
    """``cpu``, or ``cuda:0 (NVIDIA H200)``: what a manifest records and a summary prints."""
    if device.type != "cuda":
        return str(device)
    import torch

    return f"{device} ({torch.cuda.get_device_name(device)})"


def profile_device(device: Any) -> str:
    """The name a device profile matches (:func:`eaglelab.profiles.device_key`): ``cpu``, or the GPU's name."""
    from eaglelab.profiles import device_key

    if device.type != "cuda":
        return device_key(device.type, None)
    import torch

    return device_key("cuda", torch.cuda.get_device_name(device))
