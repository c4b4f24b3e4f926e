"""Device profiles (eaglelab/profiles.py): the shipped drafter's measured-best settings, found by device and drafter."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from eaglelab.engine.errors import EagleLabError
from eaglelab.profiles import (SHIPPED_NAME, BucketChoice, DeviceProfile, cache_profile_path, drafter_digest,
                               find_profile, read_profiles, write_profile)
from eaglelab.draft_registry import shipped_drafter_dir


def _profile(sha: str, device: str = "NVIDIA H200", **kw) -> DeviceProfile:
    buckets = kw.pop("buckets", (BucketChoice(1, 5, 4, 24, "2.00x"), BucketChoice(8, 4, 4, 12, "1.44x")))
    return DeviceProfile(device=device, dtype="bfloat16", drafter_sha256=sha, buckets=buckets, **kw)


def test_the_shipped_drafter_carries_profiles_for_its_own_weights(tmp_path):
    """A retrained drafter shipped without new profiles fails here: its digest no longer matches."""
    shipped = shipped_drafter_dir()
    assert shipped is not None
    profiles = read_profiles(shipped / SHIPPED_NAME)
    assert {(p.device, p.dtype) for p in profiles} == {("NVIDIA H200", "bfloat16"), ("cpu", "float32")}
    h200 = find_profile("NVIDIA H200", "bfloat16", shipped, tmp_path)
    assert h200 is not None and (h200.compile, h200.gemv, h200.decode_attn) == (True, True, True)
    assert (h200.bucket(1).steps, h200.bucket(1).topk, h200.bucket(1).draft_tokens) == (5, 4, 24)
    assert [h200.bucket(b).lookup_tokens for b in (1, 8, 32)] == [16, 8, 0], "the lookup branch measured per bucket"
    assert h200.bucket(1).label == "5 steps, topk 4, 24 draft tokens, lookup 16"
    cpu = find_profile("cpu", "float32", shipped, tmp_path)
    assert cpu is not None and cpu.bucket(1).label == "3 steps, topk 1, 4 draft tokens"
    assert find_profile("NVIDIA A100-SXM4-80GB", "bfloat16", shipped, tmp_path) is None
    assert find_profile("NVIDIA H200", "float16", shipped, tmp_path) is None  # measured in bf16 only


def test_a_lookup_branch_survives_the_round_trip_and_none_is_not_written(tmp_path):
    p = _profile("x" * 64, buckets=(BucketChoice(1, 5, 4, 24, lookup_tokens=16), BucketChoice(8, 4, 4, 12)))
    data = p.to_json()
    assert [("lookup_tokens" in b) for b in data["buckets"]] == [True, False]
    path = tmp_path / SHIPPED_NAME
    path.write_text(json.dumps({"schema": 1, "profiles": [data]}))
    assert [b.lookup_tokens for b in read_profiles(path)[0].buckets] == [16, 0]


def test_bucket_is_the_smallest_that_holds_the_batch_else_the_largest():
    p = _profile("x" * 64, buckets=(BucketChoice(8, 4, 4, 12), BucketChoice(1, 5, 4, 24), BucketChoice(32, 3, 1, 4)))
    assert [p.bucket(b).max_batch for b in (1, 2, 8, 9, 32, 33, 512)] == [1, 8, 8, 32, 32, 32, 32]


def test_digest_is_the_same_for_one_file_or_shards_and_changes_with_a_weight(tmp_path):
    a = {"fc.weight": torch.arange(12, dtype=torch.bfloat16).reshape(3, 4), "norm.weight": torch.ones(4)}
    one, two, changed = (tmp_path / n for n in ("one", "two", "changed"))
    for d in (one, two, changed):
        d.mkdir()
        (d / "config.json").write_text('{"hidden_size": 4}')
    save_file(a, str(one / "model.safetensors"))
    save_file({"fc.weight": a["fc.weight"]}, str(two / "model-00001-of-00002.safetensors"))
    save_file({"norm.weight": a["norm.weight"]}, str(two / "model-00002-of-00002.safetensors"))
    save_file({**a, "norm.weight": torch.full((4,), 2.0)}, str(changed / "model.safetensors"))
    assert drafter_digest(one) == drafter_digest(two) != drafter_digest(changed)


def test_tune_profile_in_the_cache_wins_over_the_shipped_one(tmp_path):
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text("{}")
    sha = drafter_digest(drafter)
    write_profile(drafter / SHIPPED_NAME, _profile(sha))
    assert find_profile("NVIDIA H200", "bfloat16", drafter, tmp_path).bucket(1).steps == 5
    tuned = _profile(sha, buckets=(BucketChoice(1, 6, 8, 32, "tuned"),), source="eaglelab tune")
    write_profile(cache_profile_path(tmp_path, sha), tuned)
    assert find_profile("NVIDIA H200", "bfloat16", drafter, tmp_path) == tuned


def test_write_replaces_the_same_device_and_keeps_the_others(tmp_path):
    path = tmp_path / "p.json"
    write_profile(path, _profile("a" * 64))
    write_profile(path, _profile("a" * 64, device="cpu"))
    write_profile(path, _profile("a" * 64, buckets=(BucketChoice(1, 2, 1, 3),)))
    got = read_profiles(path)
    assert [(p.device, p.bucket(1).steps) for p in got] == [("cpu", 5), ("NVIDIA H200", 2)]
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("text, field", [
    ("not json", None),
    ('{"schema": 2, "profiles": []}', "schema / profiles"),
    ('{"schema": 1, "profiles": [{"device": "cpu", "dtype": "float32", "drafter_sha256": "x", "buckets": []}]}',
     "profiles[0].buckets"),
    ('{"schema": 1, "profiles": [{"device": "cpu", "dtype": "float32", "drafter_sha256": "x", '
     '"buckets": [{"max_batch": 1, "steps": 3, "topk": 1, "draft_tokens": NaN}]}]}', None),
    ('{"schema": 1, "profiles": [{"device": "cpu", "dtype": "float32", "drafter_sha256": "x", '
     '"buckets": [{"max_batch": 1, "steps": 3, "topk": 1, "draft_tokens": 9}]}]}', "profiles[0].buckets[0].draft_tokens"),
    ('{"schema": 1, "profiles": [{"device": "cpu", "dtype": "float32", "drafter_sha256": "x", '
     '"buckets": [{"max_batch": 1, "steps": 3, "topk": 1, "draft_tokens": 4, "lookup_tokens": 99}]}]}',
     "profiles[0].buckets[0].lookup_tokens"),
    ('{"schema": 1, "profiles": [{"device": "cpu", "dtype": "float32", "drafter_sha256": "x", "gemv": "yes", '
     '"buckets": [{"max_batch": 1, "steps": 3, "topk": 1, "draft_tokens": 4}]}]}', "profiles[0].gemv"),
])
def test_a_broken_profiles_file_is_named_with_its_field_and_a_fix(tmp_path, text, field):
    path = tmp_path / "p.json"
    path.write_text(text)
    with pytest.raises(EagleLabError) as err:
        read_profiles(path)
    assert err.value.file == str(path) and err.value.hint
    if field:
        assert err.value.field == field
    json.dumps(str(err.value))  # a message, not an object


def test_a_gpu_without_a_profile_takes_one_of_its_family_and_says_so(tmp_path):
    """An H100 has no shipped profile; the H200's stands in (the same Hopper chips: on an H100 its batch-8 tree
    served 1.64x where the default chain gave 1.46x, one session), named as such. Other families, a CPU, another dtype
    or a drafter's own profile for the device itself never borrow."""
    from eaglelab.draft_registry import TreeFlags, Where, tree_note
    from eaglelab.engine.runtime.spec_config import SpecConfig
    from eaglelab.profiles import gpu_family

    assert [gpu_family(d) for d in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA GH200 480GB", "NVIDIA H100 PCIe",
                                    "NVIDIA A100-SXM4-80GB", "NVIDIA A10", "NVIDIA L40S", "cpu")] == \
        ["Hopper", "Hopper", "Hopper", "Hopper", "Ampere", None, None, None]
    shipped = shipped_drafter_dir()
    h100 = find_profile("NVIDIA H100 80GB HBM3", "bfloat16", shipped, tmp_path)
    assert h100 is not None and h100.device == "NVIDIA H200" and h100.stands_in_for == "NVIDIA H100 80GB HBM3"
    assert h100.bucket(8).label == "4 steps, topk 4, 12 draft tokens, lookup 8"
    assert h100 == find_profile("NVIDIA H200", "bfloat16", shipped, tmp_path)  # the same profile, found for another
    assert "stands_in_for" not in h100.to_json()
    assert find_profile("NVIDIA H200", "bfloat16", shipped, tmp_path).stands_in_for == ""
    assert find_profile("NVIDIA A100-SXM4-80GB", "bfloat16", shipped, tmp_path) is None
    assert find_profile("NVIDIA H100 80GB HBM3", "float16", shipped, tmp_path) is None
    note = tree_note(SpecConfig("eagle3", num_steps=5, topk=4, num_draft_tokens=24, lookup_tokens=16), TreeFlags(),
                     h100, Where("NVIDIA H100 80GB HBM3", "bfloat16", 1))
    assert "on NVIDIA H200, bfloat16" in note and "none measured on NVIDIA H100 80GB HBM3 itself" in note, note
    assert "Hopper GPU's stands in" in note and "`eaglelab tune` measures its own" in note
    sha = drafter_digest(shipped)  # a tune on the H100 writes its own, which then wins over the H200's
    own = _profile(sha, device="NVIDIA H100 80GB HBM3", buckets=tuple(BucketChoice(b, 3, 1, 4, "tuned") for b in
                                                                      (1, 8, 32)))
    write_profile(cache_profile_path(tmp_path, sha), own)
    assert find_profile("NVIDIA H100 80GB HBM3", "bfloat16", shipped, tmp_path) == own


def test_a_gpu_profile_without_a_batch_size_borrows_its_familys_bucket_for_it(tmp_path):
    """A tune at batch 1 alone writes one bucket; batch 8 and 32 then take the family's buckets (measured at those
    batch sizes on an H200), not batch 1's large tree (on an H100: 1.75x served at batch 8 on batch 1's tree,
    1.92x on the H200's batch-8 tree), and say where they were measured. Nothing lent is ever written back."""
    from eaglelab.bench.setup import tree_notes
    from eaglelab.draft_registry import DraftChoice, TreeFlags, Where, tree_note
    from eaglelab.engine.runtime.spec_config import SpecConfig

    shipped = shipped_drafter_dir()
    sha = drafter_digest(shipped)
    h100 = "NVIDIA H100 80GB HBM3"
    own = _profile(sha, device=h100, buckets=(BucketChoice(1, 5, 4, 24, "2.52x tuned here", lookup_tokens=16),))
    write_profile(cache_profile_path(tmp_path, sha), own)
    found = find_profile(h100, "bfloat16", shipped, tmp_path)
    assert found is not None and found.device == h100 and found.stands_in_for == ""
    assert found.bucket(1) == own.buckets[0] and found.bucket(1).measured_on == ""
    assert [(found.bucket(b).label, found.bucket(b).measured_on) for b in (8, 32)] == [
        ("4 steps, topk 4, 12 draft tokens, lookup 8", "NVIDIA H200"), ("2 steps, topk 1, 3 draft tokens", "NVIDIA H200")]
    assert found.bucket(4).max_batch == 8, "a batch between buckets takes the next one up, lent or not"
    assert found.to_json() == own.to_json(), "lent buckets are never written as this GPU's"
    note = tree_note(SpecConfig("eagle3", num_steps=4, topk=4, num_draft_tokens=12, lookup_tokens=8), TreeFlags(),
                     found, Where(h100, "bfloat16", 8))
    assert "measured best for batch <= 8 on NVIDIA H200" in note and "lent by the Hopper profile" in note, note
    assert "has no tree measured for batch 8" in note and "`eaglelab tune --batch-sizes 8`" in note, note
    assert "lent" not in tree_note(SpecConfig("eagle3", num_steps=5, topk=4, num_draft_tokens=24), TreeFlags(), found,
                                   Where(h100, "bfloat16", 1))
    lines = tree_notes(DraftChoice("eagle3", None, None, profile=found), (1, 8))
    assert len(lines) == 1 and "measured on NVIDIA H200 (lent by its family)" in lines[0], lines
    # a tune at 8 and 32 later fills them: nothing is lent then
    write_profile(cache_profile_path(tmp_path, sha), _profile(sha, device=h100, buckets=(
        own.buckets[0], BucketChoice(8, 4, 4, 12, "tuned"), BucketChoice(32, 2, 1, 3, "tuned"))))
    assert all(not b.measured_on for b in find_profile(h100, "bfloat16", shipped, tmp_path).buckets)
    # the H200 itself and a GPU of no family lend nothing and borrow nothing
    assert all(not b.measured_on for b in find_profile("NVIDIA H200", "bfloat16", shipped, tmp_path).buckets)
    a10 = _profile(sha, device="NVIDIA A10", buckets=(BucketChoice(1, 3, 1, 4, "tuned"),))
    write_profile(cache_profile_path(tmp_path, sha), a10)
    assert find_profile("NVIDIA A10", "bfloat16", shipped, tmp_path) == a10
