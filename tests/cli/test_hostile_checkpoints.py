"""Hostile drafter and target checkpoints, round 2 (issue #39): each case ended in a wrong OK, an internal
error or a hang before its fix. A drafter that cannot run is refused while it is read (exit 2 naming the
file, the field, what was found and expected, and what to do), so every command that reads drafters
(check-wiring's static pass, run, bench, train --init-from) refuses it the same way."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglelab.engine.errors import CheckpointError, ConfigError, EagleLabError
from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint
from tests.cli.hostile_inputs import Inputs, assert_handled, copy_tree, make_inputs, run_cli


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> Inputs:
    return make_inputs(tmp_path_factory.mktemp("hostile_checkpoints"))


@pytest.fixture
def drafter(valid, tmp_path) -> Path:
    return copy_tree(valid.drafter, tmp_path / "drafter")


def weights(d: Path) -> Path:
    return d / "model.safetensors"


def rewrite(d: Path, **changes) -> None:
    tensors = load_file(weights(d))
    for name, fn in changes.items():
        tensors[name.replace("__", ".")] = fn(tensors[name.replace("__", ".")]).contiguous()
    save_file(tensors, str(weights(d)))


def wiring_exit_2(argv: list[str], capsys, *said: str) -> dict:
    outcome = run_cli(argv + ["--json"], capsys)
    assert_handled(outcome, argv + ["--json"])
    out = json.loads(outcome.out)
    assert out["exit_code"] == 2 and out["verdict"] == "error", out
    for text in said:
        assert text in out["error"], out["error"]
    assert "found:" in out["error"] and "expected:" in out["error"] and "what to do:" in out["error"], out["error"]
    return out


# ---- the index decides which copy of a tensor is read ----------------------------------------------------


def test_a_stale_duplicate_inside_a_listed_shard_is_not_read(drafter) -> None:
    """Before: both shards were listed, every tensor of each was read, and the zeroed lm_head of the shard
    read last overrode the one the index's weight_map names (check-wiring then said WIRING OK)."""
    tensors = load_file(weights(drafter))
    real = tensors.pop("lm_head.weight")
    save_file(tensors | {"lm_head.weight": torch.zeros_like(real)}, str(drafter / "model-00002.safetensors"))
    save_file({"lm_head.weight": real}, str(drafter / "model-00001.safetensors"))
    weights(drafter).unlink()
    weight_map = {k: "model-00002.safetensors" for k in tensors} | {"lm_head.weight": "model-00001.safetensors"}
    (drafter / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    ck = read_draft_checkpoint(drafter)
    assert ck.tensors["lm_head.weight"].file.name == "model-00001.safetensors"
    assert torch.equal(ck.load_tensor("lm_head.weight"), real)


def test_the_target_loader_reads_each_tensor_from_the_shard_the_index_names(valid, tmp_path) -> None:
    from eaglelab.engine.formats.loader import read_tensors, safetensors_files

    target = copy_tree(valid.target, tmp_path / "target")
    tensors = load_file(weights(target))
    real = tensors["model.norm.weight"]
    save_file(tensors | {"model.norm.weight": torch.zeros_like(real)}, str(target / "b.safetensors"))
    save_file({"model.norm.weight": real}, str(target / "a.safetensors"))
    weights(target).unlink()
    weight_map = {k: "b.safetensors" for k in tensors} | {"model.norm.weight": "a.safetensors"}
    (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    file, handle = read_tensors(safetensors_files(target))["model.norm.weight"]
    assert file.name == "a.safetensors" and torch.equal(handle.get_tensor("model.norm.weight"), real)


def test_two_copies_of_a_tensor_without_an_index_are_refused(drafter) -> None:
    save_file({"fc.weight": torch.zeros_like(load_file(weights(drafter))["fc.weight"])}, str(drafter / "old.safetensors"))
    with pytest.raises(CheckpointError, match="stored twice") as info:
        read_draft_checkpoint(drafter)
    assert info.value.field == "fc.weight" and "old.safetensors" in str(info.value.found)


def test_an_index_naming_a_tensor_its_shard_lacks_is_refused(drafter) -> None:
    names = list(load_file(weights(drafter)))
    (drafter / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: "model.safetensors" for n in names} | {"extra.weight": "model.safetensors"}}))
    with pytest.raises(CheckpointError, match="do not hold") as info:
        read_draft_checkpoint(drafter)
    assert info.value.field == "weight_map" and "extra.weight" in str(info.value.found)


@pytest.mark.parametrize("shard", ["../elsewhere.safetensors", "/tmp/x.safetensors", "sub/../model.safetensors", ".."])
def test_an_index_entry_pointing_outside_the_folder_is_refused(drafter, capsys, shard) -> None:
    """Before: ``../x`` passed the 'shard exists' check, no file in the folder matched, the drafter read as
    config-only and check-wiring gave its static verdict without a weight."""
    (drafter.parent / "elsewhere.safetensors").write_bytes(weights(drafter).read_bytes())
    names = list(load_file(weights(drafter)))
    (drafter / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n in names}}))
    out = wiring_exit_2(["check-wiring", str(drafter)], capsys, "outside the checkpoint's directory")
    assert out["field"] == "weight_map" and out["file"].endswith("model.safetensors.index.json")


def test_an_empty_index_does_not_hide_the_weights(drafter, capsys) -> None:
    (drafter / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {}}))
    wiring_exit_2(["check-wiring", str(drafter)], capsys, "lists no tensors")


# ---- drafters that cannot run ------------------------------------------------------------------------------


def test_a_drafter_without_lm_head_is_an_error_finding(drafter, valid, capsys) -> None:
    tensors = load_file(weights(drafter))
    del tensors["lm_head.weight"]
    save_file(tensors, str(weights(drafter)))
    errors = [f for f in read_draft_checkpoint(drafter).validate() if f.severity == "error"]
    assert [(f.field, f.code) for f in errors] == [("lm_head.weight", "tensor_missing")]
    outcome = run_cli(["check-wiring", str(drafter), "--target", str(valid.target), "--json"], capsys)
    assert_handled(outcome, ["--json"])
    assert outcome.rc != 0 and json.loads(outcome.out)["verdict"] != "ok"


CANNOT_RUN = "stored in a type a drafter cannot run with"


@pytest.mark.parametrize("name, convert, found, said", [
    ("fc.weight", lambda t: (t * 100).long(), "I64", CANNOT_RUN),
    ("fc.weight", lambda t: t.to(torch.float8_e4m3fn), "F8_E4M3", CANNOT_RUN),  # before: exit 3 (isfinite of float8)
    ("norm.weight", lambda t: t > 0, "BOOL", CANNOT_RUN),
    ("lm_head.weight", lambda t: t.to(torch.int8), "I8", CANNOT_RUN),
    ("t2d", lambda t: t.float(), "F32", "must hold a bool mask"),
])
def test_weights_of_a_type_a_drafter_cannot_run_with_are_refused(drafter, capsys, name, convert, found, said) -> None:
    rewrite(drafter, **{name.replace(".", "__"): convert})
    out = wiring_exit_2(["check-wiring", str(drafter)], capsys, said)
    assert out["field"] == name and f"found: {found}" in out["error"]


def test_float8_values_are_checked_for_non_finite_values_not_crashed_on() -> None:
    from eaglelab.engine.formats.validate import check_finite_tensor

    check_finite_tensor(torch.ones(4).to(torch.float8_e4m3fn), "x", "w")  # before: NotImplementedError
    with pytest.raises(CheckpointError, match="non-finite"):
        check_finite_tensor(torch.tensor([1.0, float("nan")]).to(torch.float8_e4m3fn), "x", "w")


# ---- files that are not files ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "model.safetensors.index.json"])
@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_drafter_file_that_is_a_fifo_or_a_directory_is_named_never_opened(drafter, capsys, name, kind) -> None:
    """Before: a FIFO config.json or index blocked the reader for ever; a FIFO shard blocked inside safetensors
    (no signal could end it); a directory shard read as 'No such device (os error 19)'."""
    path = drafter / name
    path.unlink(missing_ok=True)
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    said = "a FIFO (named pipe)" if kind == "fifo" else "a directory"
    out = wiring_exit_2(["check-wiring", str(drafter)], capsys, said, "expected: a regular file")
    assert out["file"] == str(path)


def test_a_target_whose_config_or_shard_is_a_fifo_is_refused(valid, tmp_path) -> None:
    from eaglelab.engine.formats.loader import read_tensors, resolve_model_dir, safetensors_files

    target = copy_tree(valid.target, tmp_path / "target")
    weights(target).unlink()
    os.mkfifo(weights(target))
    with pytest.raises(CheckpointError, match="FIFO"):
        read_tensors(safetensors_files(target))
    (target / "config.json").unlink()
    os.mkfifo(target / "config.json")
    with pytest.raises(ConfigError, match="FIFO"):
        resolve_model_dir(target)


def test_every_refusal_here_is_a_user_error(drafter) -> None:
    """The refusals are EagleLabErrors (exit 2), never an OSError without a field or an internal error."""
    os.mkfifo(drafter / "model.safetensors.index.json")
    with pytest.raises(EagleLabError) as info:
        read_draft_checkpoint(drafter)
    assert info.value.field == "weight_map" and info.value.expected == "a regular file"
