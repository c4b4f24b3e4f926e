"""SpecForge offline data: layout, round trip, compressed files, and clear errors on bad files."""

from __future__ import annotations

import pytest
import torch

from eaglelab.engine.errors import CheckpointError
from eaglelab.engine.formats.specforge_data import (
    Sample,
    VocabMapping,
    iter_samples,
    list_samples,
    read_sample,
    read_vocab_mapping,
    sample_path,
    write_sample,
    write_vocab_mapping,
)


def make_sample(t: int = 12, h: int = 8, n: int = 3, seed: int = 0) -> Sample:
    g = torch.Generator().manual_seed(seed)
    return Sample(
        input_ids=torch.randint(0, 100, (t,), generator=g),
        loss_mask=(torch.arange(t) > 3).long(),
        hidden_state=torch.randn(1, t, h, generator=g).bfloat16(),
        aux_hidden_state=torch.randn(1, t, n * h, generator=g).bfloat16(),
    )


def test_layout_matches_specforge(tmp_path):
    assert sample_path(tmp_path, 0).relative_to(tmp_path).as_posix() == "rows_0-2000/data_0.ckpt"
    assert sample_path(tmp_path, 4123, compress=True).relative_to(tmp_path).as_posix() == "rows_4000-6000/data_4123.ckpt.gz"


@pytest.mark.parametrize("compress", [False, True])
def test_round_trip(tmp_path, compress):
    s = make_sample()
    path = write_sample(tmp_path, 7, s, compress=compress)
    raw = torch.load(path, weights_only=True) if not compress else None
    if raw is not None:
        assert sorted(raw) == ["aux_hidden_state", "hidden_state", "input_ids", "loss_mask"]
    r = read_sample(path)
    assert torch.equal(r.input_ids, s.input_ids) and torch.equal(r.loss_mask, s.loss_mask)
    assert torch.equal(r.aux_hidden_state, s.aux_hidden_state) and r.aux_hidden_state.dtype == torch.bfloat16
    assert torch.equal(r.hidden_state, s.hidden_state)
    assert r.path == path and r.num_tokens == 12


def test_listing_is_by_index_across_row_dirs(tmp_path):
    for i in (2001, 10, 2, 0):
        write_sample(tmp_path, i, make_sample(seed=i))
    paths = list_samples(tmp_path)
    assert [p.name for p in paths] == ["data_0.ckpt", "data_2.ckpt", "data_10.ckpt", "data_2001.ckpt"]
    assert [s.num_tokens for s in iter_samples(tmp_path, limit=2)] == [12, 12]


def test_shapes_normalised(tmp_path):
    """[1, T] ids and [T, W] states (seen in some exports) are accepted as [T] and [1, T, W]."""
    path = write_sample(tmp_path, 0, {"input_ids": torch.arange(5)[None], "loss_mask": torch.ones(1, 5),
                                      "hidden_state": torch.zeros(5, 4), "aux_hidden_state": torch.zeros(5, 12)})
    s = read_sample(path)
    assert s.input_ids.shape == (5,) and s.hidden_state.shape == (1, 5, 4) and s.aux_hidden_state.shape == (1, 5, 12)
    assert s.truncated(3).aux_hidden_state.shape == (1, 3, 12) and s.truncated(3).input_ids.tolist() == [0, 1, 2]


@pytest.mark.parametrize("compress", [False, True])
def test_truncated_file_names_it(tmp_path, compress):
    path = write_sample(tmp_path, 3, make_sample(), compress=compress)
    blob = path.read_bytes()
    path.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(CheckpointError) as exc:
        read_sample(path)
    assert exc.value.file == str(path) and "truncated" in exc.value.hint


def test_refuses_pickled_objects(tmp_path):
    """weights_only=True: an arbitrary object in a user's file is refused, never executed."""
    from fractions import Fraction  # a plain Python object, not on torch's weights_only allow-list

    path = sample_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    torch.save({"input_ids": torch.arange(3), "obj": Fraction(1, 3)}, path)
    with pytest.raises(CheckpointError, match="weights_only"):
        read_sample(path)


def test_bad_contents(tmp_path):
    path = write_sample(tmp_path, 0, {"input_ids": torch.arange(5), "hidden_state": torch.zeros(1, 5, 4)})
    with pytest.raises(CheckpointError) as exc:
        read_sample(path)
    assert exc.value.field == "aux_hidden_state"
    path = write_sample(tmp_path, 1, {"input_ids": torch.arange(5), "aux_hidden_state": torch.zeros(1, 4, 12)})
    with pytest.raises(CheckpointError, match="unexpected shape"):
        read_sample(path)
    with pytest.raises(CheckpointError, match="no SpecForge samples"):
        list_samples(tmp_path / "rows_0-2000")


def test_vocab_mapping_round_trip(tmp_path):
    assert read_vocab_mapping(tmp_path) is None
    t2d = torch.zeros(10, dtype=torch.bool)
    t2d[[1, 4, 7]] = True
    d2t = torch.tensor([1, 4, 7]) - torch.arange(3)
    path = write_vocab_mapping(tmp_path, VocabMapping(d2t, t2d))
    assert path.relative_to(tmp_path).as_posix() == "vocab_mapping/vocab_mapping.pt"
    m = read_vocab_mapping(tmp_path)
    assert m.d2t.tolist() == [1, 3, 5] and m.t2d.nonzero().flatten().tolist() == [1, 4, 7]


@pytest.mark.parametrize("d2t,t2d_ids,field,found", [
    ([1, 3, -4], [1, 4, 7], "d2t", "target ids -2..4"),  # draft id 2 -> target -2: lm_head[-2], silently
    ([1, 3, 8], [1, 4, 7], "d2t", "target ids 1..10"),  # beyond the 10-token vocabulary
    ([1, 3, 5], [1, 4, 8], "t2d", "3 tokens marked"),  # t2d from another mapping
    ([1, 3, 3], [1, 4, 7], "t2d", "3 tokens marked"),  # draft ids 1 and 2 both -> target 4
])
def test_vocab_mapping_whose_maps_disagree_is_refused(tmp_path, d2t, t2d_ids, field, found):
    """A 10-token vocabulary, 3 draft tokens (target = draft id + d2t): offsets reaching outside the vocabulary,
    or a t2d marking other tokens than d2t reaches, are refused naming the file and the map (were accepted)."""
    t2d = torch.zeros(10, dtype=torch.bool)
    t2d[t2d_ids] = True
    path = write_vocab_mapping(tmp_path, VocabMapping(torch.tensor(d2t), t2d))
    with pytest.raises(CheckpointError) as err:
        read_vocab_mapping(tmp_path)
    assert (err.value.file, err.value.field, err.value.found) == (str(path), field, found)


def test_vocab_mapping_of_float_offsets_is_refused(tmp_path):
    t2d = torch.zeros(10, dtype=torch.bool)
    t2d[[1, 4, 7]] = True
    write_vocab_mapping(tmp_path, VocabMapping(torch.tensor([1.0, 3.0, 5.0]), t2d))
    with pytest.raises(CheckpointError, match="must hold integers"):
        read_vocab_mapping(tmp_path)


@pytest.mark.parametrize("mask,found", [
    ([0, 0, 1, 1, 1], "list"),  # a list, not a tensor: was replaced by all ones
    (torch.tensor([0.0, 0.0, float("nan"), 1.0, 1.0]), "1 of 5 values"),  # NaN != 0: was counted as set
])
def test_a_loss_mask_that_is_not_a_finite_tensor_is_refused(tmp_path, mask, found):
    """A 5-token sample whose loss_mask is a list or holds a NaN: read_sample and the vocabulary scan
    (read_ids_and_mask) refuse it naming the file and field; a sample without the key still trains on all 5."""
    from eaglelab.engine.training.draft_vocab import read_ids_and_mask

    sample = {"input_ids": torch.arange(5), "aux_hidden_state": torch.zeros(1, 5, 12)}
    path = sample_path(tmp_path, 0)
    path.parent.mkdir(parents=True)
    torch.save({**sample, "loss_mask": mask}, path)
    for read in (read_sample, read_ids_and_mask):
        with pytest.raises(CheckpointError) as exc:
            read(path)
        assert exc.value.file == str(path) and exc.value.field == "loss_mask" and exc.value.found == found
        assert exc.value.hint
    torch.save(sample, path)
    assert read_sample(path).loss_mask.tolist() == [1] * 5 and read_ids_and_mask(path)[1].tolist() == [1] * 5
