"""This machine's GEMV tilings kept between processes (eaglelab/gemv_cache.py): a shape tuned once is taken
untimed by the next process on the same setup (so its compiled phases are the same graphs, and the compile cache
hits), never on another setup; a profile's tilings win; a bad or unwritable cache never stops a run.

The kernel and the timer are stood in as in test_gemv_presets.py (no GPU needed)."""

from __future__ import annotations

import json

import pytest
import torch

from eaglelab import gemv_cache as C
from eaglelab.engine.model import gemv as G
from eaglelab.profiles import DeviceProfile, GemvTilings
from tests.engine.model.test_gemv_presets import W_K, W_N, _Gemv, _PdlGemv, _xw, kernel  # noqa: F401 - a fixture

CPU = torch.device("cpu")


def _fresh(said: list[str], path, profile=None, dtype=torch.float16, pdl: bool = False):
    gemv = (_PdlGemv if pdl else _Gemv)(said)
    C.prepare(gemv, profile, CPU, dtype, said.append, path=path)
    return gemv


@torch.no_grad()
def test_a_shape_tuned_in_one_process_is_taken_untimed_by_the_next(kernel, tmp_path):
    path = tmp_path / C.FILE_NAME
    said: list[str] = []
    first = _fresh(said, path)
    x, w, b = _xw(1)
    first(x, w, b)
    assert len(kernel) == len(G.candidates(1)) + 1  # tuned: every candidate and F.linear timed
    saved = json.loads(path.read_text())
    assert saved["schema"] == 1 and len(saved["entries"]) == 1
    assert saved["entries"][0]["measured_on"] == first.environment(CPU, torch.float16)
    kernel.clear()
    second = _fresh(said, path)
    assert any(s.startswith(f"GEMV tilings for 1 shapes from this machine's cache {path}") for s in said), said
    second(x, w, b)
    assert kernel == [], "the cached shape is not timed again"
    assert second.chosen == first.chosen


@torch.no_grad()
def test_a_batchs_verify_bucket_past_64_rows_is_cached_and_read_back(kernel, tmp_path):
    """A verify at batch 8 (160 rows: bucket 256) tuned beside a decode: the next process reads both back (a
    cache holding a bucket past 64 was once refused whole as malformed, and every shape tuned again)."""
    path = tmp_path / C.FILE_NAME
    said: list[str] = []
    first = _fresh(said, path)
    for rows in (1, 160):
        x, w, b = _xw(rows)
        first(x, w, b)
    assert {key[2] for key in first.chosen} == {1, 256}
    kernel.clear()
    second = _fresh(said, path)
    assert any(s.startswith(f"GEMV tilings for 2 shapes from this machine's cache {path}") for s in said), said
    assert not any("not used" in s for s in said), said
    for rows in (1, 160):
        x, w, b = _xw(rows)
        second(x, w, b)
    assert kernel == [] and second.chosen == first.chosen


@torch.no_grad()
def test_another_setup_does_not_take_the_cached_tilings(kernel, tmp_path):
    path = tmp_path / C.FILE_NAME
    x, w, b = _xw(1)
    _fresh([], path, dtype=torch.float16)(x, w, b)
    kernel.clear()
    other = _fresh([], path, dtype=torch.bfloat16)  # another dtype: another setup
    other(x, w, b)
    assert len(kernel) == len(G.candidates(1)) + 1
    assert len(json.loads(path.read_text())["entries"]) == 2  # each setup keeps its own


@torch.no_grad()
def test_dependent_launches_keep_a_cache_entry_of_their_own(kernel, tmp_path):
    """A --pdl process's choices (timed in dependent launches) go to an entry of their own: a plain process does not
    take them, a later --pdl one does."""
    path = tmp_path / C.FILE_NAME
    x, w, b = _xw(1)
    _fresh([], path, pdl=True)(x, w, b)
    kernel.clear()
    _fresh([], path)(x, w, b)
    assert len(kernel) == len(G.candidates(1)) + 1, "a plain process tunes its own"
    entries = json.loads(path.read_text())["entries"]
    assert [e["measured_on"].get("launches") for e in entries] == [G.DEPENDENT, None]
    kernel.clear()
    again = _fresh([], path, pdl=True)
    again(x, w, b)
    assert kernel == [] and again.chosen == {(W_N, W_K, 1): G.candidates(1)[0]}


@torch.no_grad()
def test_a_device_profiles_tilings_win_over_the_cache(kernel, tmp_path):
    path = tmp_path / C.FILE_NAME
    here = G.TritonGemv().environment(CPU, torch.float16)  # as the GEMV keys it (its split_k included)
    C.write(path, [GemvTilings.of({(W_N, W_K, 1): (16, 256, 1, 4, 3)}, here)])
    profile = DeviceProfile("cpu", "float16", "0" * 64, (), gemv_tilings=GemvTilings.of({(W_N, W_K, 1): (8, 512, 1, 4, 3)},
                                                                                       here))
    gemv = _fresh([], path, profile=profile)
    x, w, b = _xw(1)
    gemv(x, w, b)
    assert kernel == [] and gemv.chosen == {(W_N, W_K, 1): G.GemvConfig(8, 512, 1, 4, 3)}


@torch.no_grad()
@pytest.mark.parametrize("text", ["{not json", json.dumps({"schema": 7, "entries": []}),
                                  json.dumps({"schema": 1, "entries": [{"measured_on": {}, "chosen": []}]})])
def test_a_cache_that_cannot_be_read_is_set_aside_and_replaced(kernel, tmp_path, text):
    path = tmp_path / C.FILE_NAME
    path.write_text(text)
    said: list[str] = []
    gemv = _fresh(said, path)
    assert any(s.startswith("GEMV tilings cache not used") and str(path) in s for s in said), said
    x, w, b = _xw(1)
    gemv(x, w, b)  # tuned as without a cache
    assert len(kernel) == len(G.candidates(1)) + 1
    assert [dict(e.chosen) for e in C.read(path)] == [{k: tuple(v) for k, v in gemv.chosen.items()}]


@torch.no_grad()
def test_a_cache_that_cannot_be_written_is_said_once_and_the_run_goes_on(kernel, tmp_path):
    path = tmp_path / "taken"
    path.mkdir()  # a directory where the file should be
    said: list[str] = []
    gemv = _fresh(said, path)
    for rows in (1, 8):
        x, w, b = _xw(rows)
        gemv(x, w, b)
    assert sum("not kept in" in s for s in said) == 1 and len(gemv.chosen) == 2


def test_merging_keeps_each_setup_and_the_newest_choice_last():
    a = {"gpu": "A", "dtype": "bfloat16", "torch": "2.11", "triton": "3.6"}
    b = dict(a, gpu="B")
    old = [GemvTilings.of({(1, 2, 1): (8, 512, 1, 4, 3), (3, 4, 1): (0, 0, 0, 0, 0)}, a), GemvTilings.of({}, b)]
    got = C.merged(old, GemvTilings.of({(1, 2, 1): (16, 256, 1, 4, 3)}, a))
    assert [dict(e.measured_on)["gpu"] for e in got] == ["B", "A"]
    assert dict(got[-1].chosen) == {(1, 2, 1): (16, 256, 1, 4, 3), (3, 4, 1): (0, 0, 0, 0, 0)}


def test_the_cache_lives_in_the_eaglelab_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLELAB_CACHE", str(tmp_path))
    assert C.cache_path() == tmp_path / "gemv_tilings.json"


def test_a_gpu_torch_cannot_name_gets_no_cache(monkeypatch, tmp_path):
    """No driver to name the GPU: the profile's tilings are still offered, the cache is neither read nor kept."""
    def unnamed(device, dtype):
        raise RuntimeError("Found no NVIDIA driver on your system")

    monkeypatch.setattr(G, "tuning_environment", unnamed)
    path = tmp_path / C.FILE_NAME
    path.write_text("{not json")
    said: list[str] = []
    gemv = _Gemv(said)
    C.prepare(gemv, None, torch.device("cuda"), torch.bfloat16, said.append, path=path)
    assert gemv.on_tuned is None and said == []
