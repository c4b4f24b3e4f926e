"""The draft vocabulary: most frequent assistant tokens, d2t/t2d consistent, coverage as defined."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.training.draft_vocab import build_draft_vocab, count_tokens, coverage, draft_target_ids, scan_data
from eaglelab.engine.formats.specforge_data import Sample, write_sample


def test_worked_example():
    """counts [5, 0, 9, 1], size 2 -> ids [0, 2], d2t [0, 1], t2d [T, F, T, F], coverage 14/15."""
    dv = build_draft_vocab(torch.tensor([5, 0, 9, 1]), 2)
    assert dv.mapping.d2t.tolist() == [0, 1]
    assert dv.mapping.t2d.tolist() == [True, False, True, False]
    assert dv.target_ids.tolist() == [0, 2]
    assert abs(dv.coverage - 14 / 15) < 1e-12
    assert dv.assistant_tokens == 15 and dv.distinct_tokens == 3


def test_counts_only_under_the_loss_mask():
    ids = torch.tensor([7, 7, 3, 3, 3, 1])
    mask = torch.tensor([0, 0, 1, 1, 0, 1])  # the prompt's 7s never count
    counts = count_tokens([(ids, mask)], 10)
    assert counts.tolist() == [0, 1, 0, 2, 0, 0, 0, 0, 0, 0]


def test_ties_take_the_lower_id_and_unseen_ids_fill_up():
    dv = build_draft_vocab(torch.tensor([0, 3, 0, 3, 0, 1]), 4)
    assert dv.target_ids.tolist() == [0, 1, 3, 5]  # 1, 3 (3 each), 5 (1), then unseen 0
    assert dv.coverage == 1.0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=3, max_size=40), st.integers(1, 40))
def test_maps_agree_and_keep_the_most_frequent(raw, k):
    counts = torch.tensor(raw)
    k = min(k, counts.numel())
    dv = build_draft_vocab(counts, k)
    tid = draft_target_ids(dv.mapping)
    assert tid.numel() == k and bool((tid[1:] > tid[:-1]).all())  # ascending, distinct
    assert int(dv.mapping.t2d.sum()) == k and bool(dv.mapping.t2d[tid].all())
    # no id outside beats an id inside
    inside = counts[dv.mapping.t2d]
    outside = counts[~dv.mapping.t2d]
    if outside.numel():
        assert int(inside.min()) >= int(outside.max())
    total = int(counts.sum())
    expected = int(torch.sort(counts, descending=True).values[:k].sum()) / total if total else 0.0
    assert abs(dv.coverage - expected) < 1e-12
    assert abs(coverage(counts, dv.mapping) - dv.coverage) < 1e-12


def test_scan_reads_ids_and_lengths_from_files(tmp_path):
    for i, t in enumerate((5, 9)):
        ids = torch.arange(t) % 4
        write_sample(tmp_path, i, Sample(ids, (torch.arange(t) >= 2).long(), torch.zeros(1, t, 8), torch.zeros(1, t, 24)))
    counts, lengths = scan_data(tmp_path, 6)
    assert lengths == [5, 9]
    # ids 2,3,0,... from position 2: [2,3,0] and [2,3,0,1,2,3,0]
    assert counts.tolist() == [3, 1, 3, 3, 0, 0]


def test_scan_refuses_ids_the_target_cannot_embed_naming_the_sample(tmp_path):
    """A 6-token vocabulary: id 6 outside the loss mask (position 0) is still embedded in training, so the scan
    refuses it naming the sample (it counted only masked ids and passed); a negative id in a plain .ckpt is
    refused as read_sample refuses it (the memory-mapped reader let it through)."""
    from eaglelab.engine.errors import CheckpointError, ConfigError

    mask = torch.tensor([0, 1, 1, 1])
    path = write_sample(tmp_path / "a", 0, Sample(torch.tensor([6, 1, 2, 3]), mask, None, torch.zeros(1, 4, 8)))
    with pytest.raises(ConfigError) as err:
        scan_data(tmp_path / "a", 6)
    assert (err.value.file, err.value.field, err.value.found) == (str(path), "input_ids", 6)
    path = write_sample(tmp_path / "b", 0, Sample(torch.tensor([-1, 1, 2, 3]), mask, None, torch.zeros(1, 4, 8)))
    with pytest.raises(CheckpointError) as err:
        scan_data(tmp_path / "b", 6)
    assert (err.value.file, err.value.field, err.value.found) == (str(path), "input_ids", "-1..3")


def test_scan_refuses_an_empty_sample_as_read_sample_does(tmp_path):
    """A plain .ckpt holding 0 tokens: the memory-mapped scan refuses it naming the file and input_ids, the
    error read_sample gives (it counted nothing and passed, leaving training to fail on it later)."""
    from eaglelab.engine.errors import CheckpointError
    from eaglelab.engine.formats.specforge_data import read_sample

    path = write_sample(tmp_path, 0, {"input_ids": torch.zeros(0, dtype=torch.long), "aux_hidden_state": torch.zeros(1, 0, 8)})
    errors = []
    for read in (lambda: scan_data(tmp_path, 6), lambda: read_sample(path)):
        with pytest.raises(CheckpointError) as err:
            read()
        errors.append((err.value.file, err.value.field, err.value.found, err.value.hint))
    assert errors[0] == errors[1] == (str(path), "input_ids", "0 tokens", errors[0][3]) and errors[0][3]
