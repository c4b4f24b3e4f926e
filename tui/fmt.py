"""Small text helpers shared by the widgets: numbers to short strings, fractions to bars."""

from __future__ import annotations

DASH = "—"
_EIGHTHS = " ▏▎▍▌▋▊▉"


def hbar(fraction: float, width: int) -> str:
    """A left-aligned bar of ``width`` cells filled to ``fraction`` (clamped to 0..1), in eighths.

    ``hbar(0.5, 4) == "██  "``; the result is always ``width`` characters long.
    """
    assert width >= 0, f"width {width} must be >= 0"
    fraction = min(max(fraction, 0.0), 1.0)
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    bar = "█" * full + (_EIGHTHS[part] if part else "")
    return bar.ljust(width)[:width]


def ms(value: float | None, digits: int | None = None) -> str:
    """``12.35 ms``, or a dash for None; by default fewer decimals as values grow (``8692 ms``)."""
    if value is None:
        return DASH
    if digits is None:
        digits = 2 if abs(value) < 100 else 1 if abs(value) < 1000 else 0
    return f"{value:.{digits}f} ms"


def pct(value: float | None, digits: int = 1) -> str:
    """A fraction as a percentage, ``0.387 -> 38.7%``; a dash for None."""
    return DASH if value is None else f"{100.0 * value:.{digits}f}%"


def num(value: float | None, digits: int = 2) -> str:
    """A plain number with ``digits`` decimals; a dash for None."""
    return DASH if value is None else f"{value:.{digits}f}"


def nbytes(value: float) -> str:
    """Bytes in B / KiB / MiB / GiB with one decimal."""
    for unit in ("B", "KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


_LEVELS = " ▁▂▃▄▅▆▇█"


def sparkline_rows(values: list[float] | tuple[float, ...], width: int, height: int) -> list[str]:
    """A zero-based sparkline: ``height`` strings of ``width`` cells, top row first.

    More values than columns are averaged in even buckets; fewer fill the left columns. The tallest
    column reaches the top, zero is the bottom (so a 5% wobble looks like one, not like a cliff).
    ``sparkline_rows([1, 2], 2, 1) == ["▄█"]``.
    """
    if width <= 0 or height <= 0:
        return [""] * max(height, 0)
    columns = _bucket_means(list(values), width)
    top = max(columns, default=0.0)
    rows = []
    for level in reversed(range(height)):
        cells = []
        for v in columns:
            eighths = round(max(v, 0.0) / top * height * 8) if top > 0 else 0
            cells.append(_LEVELS[min(max(eighths - 8 * level, 0), 8)])
        rows.append("".join(cells).ljust(width))
    return rows


def _bucket_means(values: list[float], width: int) -> list[float]:
    n = len(values)
    if n <= width:
        return values
    return [sum(chunk) / len(chunk) for chunk in (values[i * n // width : (i + 1) * n // width] for i in range(width))]
