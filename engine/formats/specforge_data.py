"""SpecForge offline training data: one ``torch.save`` dict per sample.

Layout (the same as SpecForge writes)::

    <dir>/rows_0-2000/data_0.ckpt        (or data_0.ckpt.gz)
    <dir>/rows_0-2000/data_1.ckpt
    ...
    <dir>/rows_2000-4000/data_2000.ckpt
    <dir>/vocab_mapping/vocab_mapping.pt  {"d2t": [draft_vocab] int64, "t2d": [vocab] bool}

Each sample holds ``input_ids`` [T], ``loss_mask`` [T], ``hidden_state`` [1, T, H] (the target's
final hidden state, after the final norm) and ``aux_hidden_state`` [1, T, n*H] (n aux states
concatenated). A sample without a ``loss_mask`` key trains on every token (all ones); one
that holds something else under it is refused. Files are read with ``torch.load(weights_only=True)`` only: nothing else in a user's
directory is ever unpickled.
"""

from __future__ import annotations

import gzip
import io
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NamedTuple

import torch

from eaglelab.engine.errors import CheckpointError
from eaglelab.engine.formats.validate import check_finite_tensor, check_integer_tensor, torch_load

ROWS_PER_DIR = 2000
_DATA_NAME = re.compile(r"^data_(\d+)\.ckpt(\.gz)?$")


@dataclass(frozen=True)
class Sample:
    """One training sample, shapes normalised."""

    input_ids: torch.Tensor  # [T] int64
    loss_mask: torch.Tensor  # [T]
    hidden_state: torch.Tensor | None  # [1, T, H]; None when the file has none
    aux_hidden_state: torch.Tensor  # [1, T, n*H]
    path: Path | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    def truncated(self, max_tokens: int) -> "Sample":
        """The first ``max_tokens`` tokens (causal models: the prefix's states are unchanged)."""
        t = min(max_tokens, self.num_tokens)
        hs = self.hidden_state[:, :t] if self.hidden_state is not None else None
        return Sample(self.input_ids[:t], self.loss_mask[:t], hs, self.aux_hidden_state[:, :t], self.path)


@dataclass(frozen=True)
class VocabMapping:
    """Draft-vocabulary maps: target id = draft id + d2t[draft id]; t2d[target id] marks draft tokens."""

    d2t: torch.Tensor  # [draft_vocab] int64
    t2d: torch.Tensor  # [vocab] bool


def sample_path(data_dir: str | Path, index: int, *, compress: bool = False) -> Path:
    """Where sample ``index`` lives: ``rows_{g}-{g+2000}/data_{index}.ckpt[.gz]``."""
    g = (index // ROWS_PER_DIR) * ROWS_PER_DIR
    return Path(data_dir) / f"rows_{g}-{g + ROWS_PER_DIR}" / f"data_{index}.ckpt{'.gz' if compress else ''}"


def list_samples(data_dir: str | Path) -> list[Path]:
    """Sample files under ``data_dir``, ordered by sample index. Raises if there are none."""
    root = Path(data_dir)
    if not root.is_dir():
        raise CheckpointError("no such data directory", file=root, hint="pass the directory SpecForge wrote (rows_*/data_*.ckpt)")
    found = []
    for path in root.glob("rows_*/data_*.ckpt*"):
        m = _DATA_NAME.match(path.name)
        if m:
            found.append((int(m.group(1)), path))
    if not found:
        raise CheckpointError("no SpecForge samples found", file=root, expected="rows_*/data_*.ckpt or .ckpt.gz",
                              hint="pass the output directory of SpecForge's prepare_hidden_states")
    return [p for _, p in sorted(found)]


def _load(path: Path) -> object:
    """``torch.load(weights_only=True)`` of a .ckpt or .ckpt.gz; user-facing error on failure."""
    hint = ("eaglelab loads only tensors and plain containers: the sample is truncated or corrupt, or not a dict of "
            "tensors; regenerate it (or drop it from the directory)")
    if path.name.endswith(".gz"):
        try:
            with gzip.open(path, "rb") as f:
                data = f.read()
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise CheckpointError(f"cannot be decompressed ({exc})", file=path, hint=hint) from None
        return torch_load(path, what="a SpecForge sample", hint=hint, data=data)
    return torch_load(path, what="a SpecForge sample", hint=hint)


def read_sample(path: str | Path) -> Sample:
    """Read and check one sample file."""
    path = Path(path)
    obj = _load(path)
    if not isinstance(obj, dict):
        raise CheckpointError("expected a dict of tensors", file=path, found=type(obj).__name__)
    for key in ("input_ids", "aux_hidden_state"):
        if not isinstance(obj.get(key), torch.Tensor):
            raise CheckpointError("missing tensor", file=path, field=key,
                                  expected="input_ids, loss_mask, hidden_state, aux_hidden_state")
    ids, mask = ids_and_mask(obj, path)  # [T], [T]
    t = ids.shape[0]
    aux = _as_batch_seq(obj["aux_hidden_state"], t, path, "aux_hidden_state")
    hs = obj.get("hidden_state")
    hs = _as_batch_seq(hs, t, path, "hidden_state") if isinstance(hs, torch.Tensor) else None
    if hs is not None and aux.shape[-1] % hs.shape[-1]:
        raise CheckpointError("width is not a multiple of hidden_state's", file=path, field="aux_hidden_state",
                              found=aux.shape[-1], expected=f"n x {hs.shape[-1]}")
    for key, x in (("aux_hidden_state", aux), ("hidden_state", hs)):
        if x is not None and not torch.is_floating_point(x):
            raise CheckpointError("must hold floating-point states", file=path, field=key, found=str(x.dtype))
        if x is not None:
            check_finite_tensor(x, path, key, hint="the target overflowed or the file is damaged: recapture this sample")
    return Sample(ids, mask, hs, aux, path)


def ids_and_mask(obj: dict, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """A sample's ``input_ids`` [T] (long, each >= 0, T >= 1) and ``loss_mask`` [T] (:func:`loss_mask_of`),
    checked; the hidden states are not touched (a token scan reads just these)."""
    if not isinstance(obj.get("input_ids"), torch.Tensor):
        raise CheckpointError("missing tensor", file=path, field="input_ids",
                              expected="input_ids, loss_mask, hidden_state, aux_hidden_state")
    check_integer_tensor(obj["input_ids"], path, "input_ids", low=0)
    ids = obj["input_ids"].reshape(-1).long()  # [T]
    if ids.shape[0] == 0:
        raise CheckpointError("holds no tokens", file=path, field="input_ids", found="0 tokens", expected=">= 1",
                              hint="drop the empty sample from the directory (or recapture it)")
    return ids, loss_mask_of(obj, ids.shape[0], path)


def loss_mask_of(obj: dict, t: int, path: Path) -> torch.Tensor:
    """A sample's ``loss_mask`` [T] for its ``t`` input ids: absent -> all ones; otherwise a tensor of ``t``
    finite values (SpecForge writes 0/1 integers; a NaN would count as set, so it is refused)."""
    if "loss_mask" not in obj:
        return torch.ones(t, dtype=torch.long)
    mask = obj["loss_mask"]
    if not isinstance(mask, torch.Tensor):
        raise CheckpointError("must be a tensor", file=path, field="loss_mask", found=type(mask).__name__,
                              expected=f"a 0/1 integer tensor of input_ids' length ({t})",
                              hint="recapture the sample (or delete the key: a sample without loss_mask trains on every token)")
    mask = mask.reshape(-1)
    if mask.shape[0] != t:
        raise CheckpointError("length differs from input_ids", file=path, field="loss_mask", found=mask.shape[0], expected=t,
                              hint="the sample is damaged: recapture it")
    check_finite_tensor(mask, path, "loss_mask", hint="the sample is damaged: recapture it (SpecForge writes 0/1 integers)")
    return mask


def _as_batch_seq(x: torch.Tensor, t: int, path: Path, key: str) -> torch.Tensor:
    """[T, W] or [1, T, W] -> [1, T, W], checking T."""
    if x.dim() == 2:
        x = x.unsqueeze(0)
    if x.dim() != 3 or x.shape[0] != 1 or x.shape[1] != t:
        raise CheckpointError("unexpected shape", file=path, field=key, found=list(x.shape), expected=f"[1, {t}, width]")
    return x


def iter_samples(data_dir: str | Path, *, limit: int | None = None) -> Iterator[Sample]:
    """Samples in index order (the first ``limit`` when given)."""
    for path in list_samples(data_dir)[:limit]:
        yield read_sample(path)


def write_sample(data_dir: str | Path, index: int, sample: Sample | dict, *, compress: bool = False) -> Path:
    """Write one sample in SpecForge's layout and key names; returns its path."""
    if isinstance(sample, Sample):
        data = {"input_ids": sample.input_ids, "loss_mask": sample.loss_mask,
                "hidden_state": sample.hidden_state, "aux_hidden_state": sample.aux_hidden_state}
        data = {k: v for k, v in data.items() if v is not None}
    else:
        data = dict(sample)
    data = {k: v.detach().cpu().contiguous() for k, v in data.items()}
    from eaglelab.engine.formats.safe_write import write_atomic

    def write(tmp: Path) -> None:
        if compress:
            buf = io.BytesIO()
            torch.save(data, buf)
            with gzip.open(tmp, "wb") as f:
                f.write(buf.getvalue())
        else:
            torch.save(data, tmp)

    # whole or not at all: a truncated sample would be kept as done by a resumed capture
    return write_atomic(sample_path(data_dir, index, compress=compress), write, what="training sample")


def vocab_mapping_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / "vocab_mapping" / "vocab_mapping.pt"


def read_vocab_mapping(data_dir: str | Path) -> VocabMapping | None:
    """The data directory's vocab mapping, or None when it has none."""
    path = vocab_mapping_path(data_dir)
    if not path.exists():
        return None
    obj = _load(path)
    if not isinstance(obj, dict) or not all(isinstance(obj.get(k), torch.Tensor) for k in ("d2t", "t2d")):
        raise CheckpointError("expected a dict with tensors d2t and t2d", file=path,
                              found=sorted(obj) if isinstance(obj, dict) else type(obj).__name__)
    return _checked_mapping(path, obj["d2t"], obj["t2d"])


def _checked_mapping(path: Path, d2t: torch.Tensor, t2d: torch.Tensor) -> VocabMapping:
    """d2t integer offsets into the target vocabulary and t2d a mask of exactly the tokens they reach: a
    broken map would pick the wrong lm_head rows (a negative id silently wraps) and train the wrong tokens."""
    hint = "regenerate the data's vocab_mapping.pt (or delete it: training then builds one from the data)"
    check_integer_tensor(d2t, path, "d2t")
    if t2d.dtype != torch.bool:
        check_integer_tensor(t2d, path, "t2d", low=0, high=1)
    for key, x in (("d2t", d2t), ("t2d", t2d)):
        if x.dim() != 1 or x.numel() == 0:
            raise CheckpointError("must be a non-empty vector", file=path, field=key, found=list(x.shape),
                                  expected="[draft_vocab]" if key == "d2t" else "[vocab]", hint=hint)
    problem = vocab_map_problem(d2t.long(), t2d.bool())
    if problem is not None:
        offsets = "d2t holds offsets (target id = draft id + d2t[draft id]): " if problem.field == "d2t" else ""
        raise CheckpointError(problem.message, file=path, field=problem.field, found=problem.found,
                              expected=problem.expected, hint=offsets + hint)
    return VocabMapping(d2t.long(), t2d.bool())


class MapProblem(NamedTuple):
    """Why d2t and t2d are not one draft vocabulary: the map at fault, what is wrong, found and expected."""

    field: str
    message: str
    found: str
    expected: str


def vocab_map_problem(d2t: torch.Tensor, t2d: torch.Tensor) -> MapProblem | None:
    """d2t [draft_vocab] (long offsets: target id = draft id + d2t[draft id]) and t2d [vocab] (bool) describe
    one draft vocabulary: every target id within t2d, each once, and t2d marks exactly those; else the problem."""
    target = torch.arange(d2t.numel()) + d2t  # [draft_vocab] target ids
    lo, hi = int(target.min()), int(target.max())
    if lo < 0 or hi >= t2d.numel():
        return MapProblem("d2t", "draft id + d2t falls outside the target vocabulary", f"target ids {lo}..{hi}",
                          f"target ids 0..{t2d.numel() - 1}")
    count = int(t2d.sum())
    if target.unique().numel() != d2t.numel() or count != d2t.numel() or not bool(t2d[target].all()):
        return MapProblem("t2d", "marks other tokens than d2t maps to", f"{count} tokens marked",
                          f"the {d2t.numel()} distinct target tokens of d2t")
    return None


def write_vocab_mapping(data_dir: str | Path, mapping: VocabMapping) -> Path:
    """Write ``vocab_mapping/vocab_mapping.pt`` as ``{d2t, t2d}``."""
    from eaglelab.engine.formats.safe_write import write_atomic

    state = {"d2t": mapping.d2t.cpu(), "t2d": mapping.t2d.cpu()}
    return write_atomic(vocab_mapping_path(data_dir), lambda tmp: torch.save(state, tmp), what="vocabulary mapping")
