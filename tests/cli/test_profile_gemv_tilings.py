"""GEMV tilings in device profiles (eaglelab/profiles.py): the shipped H200 profile carries the tunings its bench
measured, they round-trip through tune's writer into the GEMV, and a malformed table is refused by file and field."""

from __future__ import annotations

import json

import pytest
import torch

from eaglelab.draft_registry import shipped_drafter_dir
from eaglelab.engine.errors import EagleLabError
from eaglelab.engine.model import gemv as G
from eaglelab.profiles import (SHIPPED_NAME, BucketChoice, DeviceProfile, GemvTilings, adopt_gemv_tilings,
                               find_profile, gemv_tilings_of, read_profiles, write_profile)

H200 = {"gpu": "NVIDIA H200", "dtype": "bfloat16", "torch": "2.11.0+cu130", "triton": "3.6.0"}


def test_the_shipped_h200_profile_carries_the_benchs_tilings_at_batch_1_8_and_32(tmp_path):
    """The 30 shapes `eaglelab bench --figures` tuned on an H200 with split tilings' K shares added by the compiled
    reader (h200_2026-12-06g): SmolLM2's qkv [576 -> 960], o, gate-up, down and head, the drafter's fc [1152 -> 960]
    and head [576 -> 12288], in the row buckets of batch 1, 8 and 32."""
    h200 = find_profile("NVIDIA H200", "bfloat16", shipped_drafter_dir(), tmp_path)
    t = h200.gemv_tilings
    assert t is not None and dict(t.measured_on) == dict(H200, split_k=G.SHARES_READ)
    table = dict(t.chosen)
    assert len(table) == 30 and {m for _, _, m in table} == {1, 4, 8, 32, 64}
    assert table[(960, 576, 1)] == (8, 256, 2, 2, 4)  # "GEMV [576 -> 960] M<=1: block_n 8, block_k 256, split_k 2, ..."
    assert table[(49152, 576, 1)] == (0, 0, 0, 0, 0)  # the head at one row: F.linear
    assert table[(576, 1536, 32)] == (16, 256, 6, 4, 1)  # down at a verify's 24 rows: K in 6 shares
    assert table[(960, 1152, 32)] == (16, 128, 4, 4, 3)
    assert find_profile("cpu", "float32", shipped_drafter_dir(), tmp_path).gemv_tilings is None


def test_the_shipped_h200_tilings_are_taken_only_where_the_reader_adds_the_shares(tmp_path, monkeypatch):
    """On the setup they were measured on, a GEMV adds nothing to tune for those shapes while gemv.SHARES is on; with
    it off (shares added in the kernel, timed another way) it takes none of them and says why."""
    monkeypatch.setattr(G, "tuning_environment", lambda device, dtype: dict(H200))
    h200 = find_profile("NVIDIA H200", "bfloat16", shipped_drafter_dir(), tmp_path)
    taken = _Gemv()
    assert adopt_gemv_tilings(taken, h200, torch.device("cpu"), torch.bfloat16) is None
    assert taken.preset == {k: G.GemvConfig(*v) for k, v in h200.gemv_tilings.chosen}
    monkeypatch.setattr(G, "SHARES", False)
    refused = _Gemv()
    why = adopt_gemv_tilings(refused, h200, torch.device("cpu"), torch.bfloat16)
    assert why is not None and "shares added by the reader" in why and not refused.preset, why


class _Gemv(G.TritonGemv):
    def __init__(self):
        super().__init__()
        self.reason = None


def test_tunes_tilings_round_trip_through_the_profile_into_the_gemv(tmp_path, monkeypatch):
    """What a tune's GEMV chose is written with the setup it ran on; read back, a GEMV on the same setup takes
    exactly those choices; on another torch it takes none and says so."""
    tuned = _Gemv()
    tuned.chosen = {(960, 576, 1): G.GemvConfig(8, 512, 1, 4, 3), (3072, 576, 64): G.LINEAR}
    monkeypatch.setattr(G, "tuning_environment", lambda device, dtype: dict(H200, dtype=str(dtype)[6:]))
    tilings = gemv_tilings_of(tuned, torch.device("cpu"), torch.bfloat16)
    path = tmp_path / "p.json"
    write_profile(path, DeviceProfile("NVIDIA H200", "bfloat16", "a" * 64, (BucketChoice(1, 5, 4, 24),),
                                      gemv_tilings=tilings))
    assert json.loads(path.read_text())["profiles"][0]["gemv_tilings"]["chosen"][0] == {
        "n": 960, "k": 576, "rows_bucket": 1, "block_n": 8, "block_k": 512, "split_k": 1, "num_warps": 4,
        "num_stages": 3}
    (profile,) = read_profiles(path)
    assert profile.gemv_tilings == tilings
    fresh = _Gemv()
    assert adopt_gemv_tilings(fresh, profile, torch.device("cpu"), torch.bfloat16) is None
    assert fresh.preset == tuned.chosen
    other = _Gemv()
    why = adopt_gemv_tilings(other, profile, torch.device("cpu"), torch.float16)
    assert why.startswith(f"GEMV tilings from the device profile in {path} not used, measured with dtype bfloat16 "
                          "(here float16)") and other.preset == {}
    assert gemv_tilings_of(_Gemv(), torch.device("cpu"), torch.bfloat16) is None, "nothing tuned: nothing written"


def _with(tilings) -> str:
    return json.dumps({"schema": 1, "profiles": [{
        "device": "NVIDIA H200", "dtype": "bfloat16", "drafter_sha256": "x",
        "buckets": [{"max_batch": 1, "steps": 3, "topk": 1, "draft_tokens": 4}], "gemv_tilings": tilings}]})


GOOD = {"n": 960, "k": 576, "rows_bucket": 1, "block_n": 8, "block_k": 512, "split_k": 1, "num_warps": 4,
        "num_stages": 3}
AT = "profiles[0].gemv_tilings"


@pytest.mark.parametrize("tilings, field", [
    ([GOOD], AT),
    ({"measured_on": H200, "chosen": [GOOD], "extra": 1}, f"{AT}.extra"),
    ({"measured_on": {k: v for k, v in H200.items() if k != "triton"}, "chosen": [GOOD]}, f"{AT}.measured_on.triton"),
    ({"measured_on": dict(H200, torch=2.11), "chosen": [GOOD]}, f"{AT}.measured_on.torch"),
    ({"measured_on": H200, "chosen": {"960": GOOD}}, f"{AT}.chosen"),
    ({"measured_on": H200, "chosen": [dict(GOOD, block_m=16)]}, f"{AT}.chosen[0].block_m"),
    ({"measured_on": H200, "chosen": [{k: v for k, v in GOOD.items() if k != "split_k"}]}, f"{AT}.chosen[0].split_k"),
    ({"measured_on": H200, "chosen": [dict(GOOD, block_n="8")]}, f"{AT}.chosen[0].block_n"),
    ({"measured_on": H200, "chosen": [dict(GOOD, num_warps=True)]}, f"{AT}.chosen[0].num_warps"),
    ({"measured_on": H200, "chosen": [dict(GOOD, rows_bucket=3)]}, f"{AT}.chosen[0].rows_bucket"),
    ({"measured_on": H200, "chosen": [dict(GOOD, rows_bucket=512)]}, f"{AT}.chosen[0].rows_bucket"),
    ({"measured_on": H200, "chosen": [dict(GOOD, block_n=0)]}, f"{AT}.chosen[0]"),
    ({"measured_on": H200, "chosen": [GOOD, GOOD]}, f"{AT}.chosen[1]"),
    ({"measured_on": dict(H200, launches=1), "chosen": [GOOD]}, f"{AT}.measured_on.launches"),
    ({"measured_on": dict(H200, pdl="yes"), "chosen": [GOOD]}, f"{AT}.measured_on.pdl"),
])
def test_a_malformed_tilings_table_is_refused_naming_the_file_and_field(tmp_path, tilings, field):
    path = tmp_path / SHIPPED_NAME
    path.write_text(_with(tilings))
    with pytest.raises(EagleLabError) as err:
        read_profiles(path)
    assert (err.value.file, err.value.field) == (str(path), field) and err.value.hint
    assert err.value.expected


def test_a_well_formed_table_reads_and_serialises_sorted(tmp_path):
    """Buckets up to the rows the kernel takes (256: a batch's verify in blocks of 64 rows) read back; 512 is
    refused above, saying the range."""
    path = tmp_path / SHIPPED_NAME
    later = dict(GOOD, n=3072, block_n=0, block_k=0, split_k=0, num_warps=0, num_stages=0)
    verify = dict(GOOD, rows_bucket=G.KERNEL_ROWS, block_n=16, block_k=128)
    path.write_text(_with({"measured_on": H200, "chosen": [later, verify, GOOD]}))
    (p,) = read_profiles(path)
    assert p.gemv_tilings == GemvTilings.of({(960, 576, 1): (8, 512, 1, 4, 3), (960, 576, 256): (16, 128, 1, 4, 3),
                                             (3072, 576, 1): (0,) * 5}, H200)
    assert p.to_json()["gemv_tilings"]["chosen"] == [GOOD, verify, later]
    path.write_text(_with({"measured_on": H200, "chosen": [dict(GOOD, rows_bucket=512)]}))
    with pytest.raises(EagleLabError, match=r"a power of two up to 256 \(1, 2, 4, \.\.\., 256"):
        read_profiles(path)


def test_tilings_timed_in_dependent_launches_round_trip_and_stay_apart(tmp_path, monkeypatch):
    """A --pdl tune's tilings record their launches; read back, a --pdl GEMV on the same setup takes them and a
    plain one does not (nor the other way round: the shipped profiles, which record none, are plain launches')."""
    monkeypatch.setattr(G, "tuning_environment", lambda device, dtype: dict(H200, dtype=str(dtype)[6:]))
    tuned = _Gemv()
    tuned.pdl = True
    tuned.chosen = {(960, 576, 1): G.GemvConfig(8, 512, 1, 4, 3), (3072, 576, 32): G.GemvConfig(16, 128, 1, 4, 3)}
    tilings = gemv_tilings_of(tuned, torch.device("cpu"), torch.bfloat16)
    assert dict(tilings.measured_on) == dict(H200, launches=G.DEPENDENT, split_k=G.SHARES_READ)
    path = tmp_path / "p.json"
    write_profile(path, DeviceProfile("NVIDIA H200", "bfloat16", "a" * 64, (BucketChoice(1, 5, 4, 24),),
                                      pdl=True, gemv_tilings=tilings))
    assert json.loads(path.read_text())["profiles"][0]["gemv_tilings"]["measured_on"]["launches"] == G.DEPENDENT
    (profile,) = read_profiles(path)
    assert profile.gemv_tilings == tilings
    dependent, plain = _Gemv(), _Gemv()
    dependent.pdl = True
    assert adopt_gemv_tilings(dependent, profile, torch.device("cpu"), torch.bfloat16) is None
    assert dependent.preset == tuned.chosen
    why = adopt_gemv_tilings(plain, profile, torch.device("cpu"), torch.bfloat16)
    assert "measured with launches dependent (PDL) (here plain)" in why and plain.preset == {}
    h200 = find_profile("NVIDIA H200", "bfloat16", shipped_drafter_dir(), tmp_path)
    why = adopt_gemv_tilings(dependent, h200, torch.device("cpu"), torch.bfloat16)
    assert "launches plain (here dependent (PDL))" in why


def test_tilings_timed_with_the_kernel_adding_its_shares_are_retuned_while_the_reader_adds_them(monkeypatch):
    """Tilings recorded before ``gemv.SHARES`` (no ``split_k`` in measured_on: split tilings timed with their shares
    added in the kernel, as the shipped profiles were) are not taken while the compiled reader adds the shares (a
    split tiling costs less there, so another may now be the fastest): the GEMV tunes and says why. With ``SHARES``
    off they are taken as before."""
    monkeypatch.setattr(G, "tuning_environment", lambda device, dtype: dict(H200, dtype=str(dtype)[6:]))
    old = DeviceProfile("NVIDIA H200", "bfloat16", "a" * 64, (BucketChoice(1, 5, 4, 24),),
                        gemv_tilings=GemvTilings.of({(576, 1536, 32): (16, 128, 4, 4, 3)}, H200))
    gemv = _Gemv()
    why = adopt_gemv_tilings(gemv, old, torch.device("cpu"), torch.bfloat16)
    assert "measured with split_k shares added in the kernel (here shares added by the reader)" in why
    assert gemv.preset == {}
    monkeypatch.setattr(G, "SHARES", False)
    gemv = _Gemv()
    assert adopt_gemv_tilings(gemv, old, torch.device("cpu"), torch.bfloat16) is None
    assert gemv.preset == {(576, 1536, 32): G.GemvConfig(16, 128, 4, 4, 3)}
