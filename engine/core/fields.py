"""Checks of single config values: a number in range, an integer, a string, a ``rope_scaling`` object.

Each returns the value it checked (converted to the type wanted) or raises a
:class:`~eaglelab.engine.errors.ConfigError` (or the error class passed) naming the file, the field,
what was found and what was expected. Both ``model`` (``ModelConfig.from_dict``) and ``formats``
(every file reader) use them, so they sit in the core below both; the file-level checks (weights,
shards, tensors) stay in :mod:`eaglelab.engine.formats.validate`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from eaglelab.engine.errors import ConfigError, EagleLabError

_MISSING = object()


def shown(value: Any, limit: int = 80) -> str:
    """A found value as the user wrote it, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def real_number(
    d: Mapping[str, Any],
    key: str,
    source: str | Path,
    *,
    default: Any = _MISSING,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    prefix: str = "",
) -> float:
    """``d[key]`` as a finite float in [low, high] (``low_open``: strictly above ``low``)."""
    value = d.get(key)
    if value is None:
        if default is _MISSING:
            raise ConfigError("missing field", file=source, field=prefix + key, hint="add it (see the model's card)")
        value = default
    return check_real(value, source, prefix + key, low=low, high=high, low_open=low_open)


def check_real(value: Any, source: str | Path | None, field: str, *, low: float | None = None,
               high: float | None = None, low_open: bool = False, error: type[EagleLabError] = ConfigError) -> float:
    """A finite number (not a bool, not a string) within the bounds given."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error("must be a number", file=source, field=field, found=shown(value), expected=value_range(low, high, low_open))
    number = float(value)
    if not math.isfinite(number):
        raise error("must be a finite number", file=source, field=field, found=shown(value),
                    expected=value_range(low, high, low_open), hint="NaN and infinities make every output garbage; fix the value")
    too_low = low is not None and (number <= low if low_open else number < low)
    if too_low or (high is not None and number > high):
        raise error("out of range", file=source, field=field, found=shown(value), expected=value_range(low, high, low_open))
    return number


def check_int(value: Any, source: str | Path | None, field: str, *, low: int | None = None,
              high: int | None = None, error: type[EagleLabError] = ConfigError) -> int:
    """An integer (not a bool, not a float) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error("must be an integer", file=source, field=field, found=shown(value), expected=value_range(low, high, False))
    if (low is not None and value < low) or (high is not None and value > high):
        raise error("out of range", file=source, field=field, found=value, expected=value_range(low, high, False))
    return value


def value_range(low: float | None, high: float | None, low_open: bool) -> str:
    if low is None and high is None:
        return "a finite number"
    if high is None:
        return f"{'>' if low_open else '>='} {low:g}"
    if low is None:
        return f"<= {high:g}"
    return f"{low:g} {'<' if low_open else '<='} value <= {high:g}"


def check_text(value: Any, source: str | Path | None, field: str, *, max_len: int = 10_000) -> str:
    """A string of at most ``max_len`` characters."""
    if not isinstance(value, str):
        raise ConfigError("must be a string", file=source, field=field, found=shown(value))
    if len(value) > max_len:
        raise ConfigError("too long", file=source, field=field, found=f"{len(value)} characters", expected=f"<= {max_len}")
    return value


ROPE_TYPES = (None, "default", "llama3", "linear", "yarn")


def check_rope_scaling(value: Any, source: str | Path, field: str = "rope_scaling") -> dict | None:
    """``rope_scaling``: null, or an object of a supported type whose factors are finite and positive."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError("must be an object or null", file=source, field=field, found=shown(value))
    kind = value.get("rope_type", value.get("type"))
    if not isinstance(kind, (str, type(None))) or kind not in ROPE_TYPES:
        raise ConfigError("unsupported rope scaling", file=source, field=field + ".rope_type", found=shown(kind),
                          expected="default | llama3 | linear | yarn")
    if kind in ("linear", "llama3", "yarn"):
        real_number(value, "factor", source, low=0.0, low_open=True, prefix=field + ".")
    if kind == "yarn":  # the rotary tables read these (beta_* and the attention factors have defaults there)
        real_number(value, "original_max_position_embeddings", source, low=1.0, prefix=field + ".")
        for key in ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"):
            if value.get(key) is not None:
                real_number(value, key, source, low=0.0, low_open=True, prefix=field + ".")
    if kind == "llama3":
        low = real_number(value, "low_freq_factor", source, default=1.0, low=0.0, low_open=True, prefix=field + ".")
        high = real_number(value, "high_freq_factor", source, default=4.0, low=0.0, low_open=True, prefix=field + ".")
        real_number(value, "original_max_position_embeddings", source, default=8192, low=1.0, prefix=field + ".")
        if high <= low:
            raise ConfigError("must be larger than low_freq_factor", file=source, field=field + ".high_freq_factor",
                              found=high, expected=f"> {low}")
    return value
