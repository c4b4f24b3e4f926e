"""Server logs are read line by line: the lines equal ``bytes.decode(..., "replace").split("\\n")``, the file is
never read whole, and an SGLang log's summary equals one computed from the whole text at once."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from eaglelab.probes import log_lines
from eaglelab.probes.log_lines import split_lines
from eaglelab.probes.sglang_log import BatchLine, parse_line, read_sglang_log

EXAMPLES = sorted((Path(__file__).parents[2] / "examples" / "data").glob("*.log"))


class NoWholeRead(io.RawIOBase):
    """A binary file that fails the test if anything asks for more than ``limit`` bytes at once."""

    def __init__(self, data: bytes, limit: int) -> None:
        self._f = io.BytesIO(data)
        self.limit = limit
        self.largest = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        assert 0 <= size <= self.limit, f"read({size}): the whole file asked for"
        return self._f.read(size)

    def readline(self, size: int = -1) -> bytes:
        assert 0 <= size <= self.limit, f"readline({size}): an unbounded line asked for"
        line = self._f.readline(size)
        self.largest = max(self.largest, len(line))
        return line


@pytest.mark.parametrize("data", [
    b"", b"\n", b"a", b"a\n", b"a\nb", b"a\n\nb\n\n", b"x\r\ny\rz\x0b\xe2\x80\xa8w\n",
    b"bad \xff\xfe utf-8\ncut \xe2\x82\n\xe2\x82\xac ok", "accept len: 3.1 \u00b5s\n".encode(),
])
def test_lines_equal_the_whole_text_split_on_newlines(data):
    assert list(split_lines(NoWholeRead(data, log_lines.MAX_LINE_BYTES))) == data.decode("utf-8", "replace").split("\n")


def test_an_overlong_line_keeps_its_head_and_the_next_lines_still_come(monkeypatch):
    monkeypatch.setattr(log_lines, "MAX_LINE_BYTES", 8)
    data = b"short\n" + b"L" * 30 + b"\nafter\n" + b"M" * 20
    assert list(split_lines(NoWholeRead(data, 8))) == ["short", "LLLLLLLL", "after", "MMMMMMMM"]


def _reference(text: str) -> dict:
    """The figures of the whole text at once, as the report computed them before it streamed."""
    items = [parse_line(line, n) for n, line in enumerate(text.split("\n"), start=1)]
    batches = [b for b in items if isinstance(b, BatchLine)]
    decode = [b for b in batches if b.kind == "decode"]
    prefill = [b for b in batches if b.kind == "prefill"]

    def mean(values):
        present = [v for v in values if v is not None]
        return sum(present) / len(present) if present else None

    flags = [b.cuda_graph for b in decode if b.cuda_graph is not None]
    return dict(
        decode_lines=len(decode), prefill_lines=len(prefill),
        accept_len_mean=mean(b.accept_len for b in decode), accept_rate_mean=mean(b.accept_rate for b in decode),
        gen_throughput_mean=mean(b.gen_throughput for b in decode),
        cuda_graph_fraction=sum(flags) / len(flags) if flags else None,
        cache_hit_rate_mean=mean(b.cache_hit_rate for b in prefill),
        input_throughput_mean=mean(b.input_throughput for b in prefill),
    )


def big_log(path: Path, min_bytes: int = 4 << 20) -> Path:
    """The example logs over and over (a few MB), as a long-running server writes them."""
    one = "".join(p.read_text() for p in EXAMPLES)
    path.write_text(one * (min_bytes // len(one) + 1))
    return path


@pytest.mark.parametrize("name", [p.name for p in EXAMPLES])
def test_sglang_summary_streamed_equals_the_whole_text(name):
    path = EXAMPLES[[p.name for p in EXAMPLES].index(name)]
    s = read_sglang_log(path)
    assert {k: getattr(s, k) for k in _reference("")} == _reference(path.read_text())
    assert s.decode_lines + s.prefill_lines > 0


def test_a_big_log_is_summarised_with_the_same_figures(tmp_path):
    path = big_log(tmp_path / "server.log")
    s = read_sglang_log(path)
    ref = _reference(path.read_text())
    assert s.decode_lines == ref["decode_lines"] > 1000
    for key, value in ref.items():
        assert getattr(s, key) == pytest.approx(value, rel=1e-12), key
    with path.open("rb") as f:
        wrapped = NoWholeRead(f.read(), log_lines.MAX_LINE_BYTES)
    assert sum(1 for _ in split_lines(wrapped)) == len(path.read_text().split("\n"))
    assert wrapped.largest < 1000  # one line at a time, never a block of the file
