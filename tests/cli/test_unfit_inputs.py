"""Inputs that cannot be checked or captured at all end in exit 2 with a message naming the file and
field, what was found, what was expected and what to do; never a traceback. Each case runs through
both ways of running the target: in memory and layer-streamed (``--stream``), for ``check-wiring``
and ``capture``. Also: ``capture --stream`` writes the samples ``capture`` writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eaglelab.engine.formats.draft_export import speculators_config
from eaglelab.engine.formats.specforge_data import list_samples, read_sample
from tests.cli.hostile_inputs import Inputs, assert_handled, copy_tree, make_inputs, run_cli
from tests.conftest import add_word_tokenizer, shard_checkpoint

PATHS = {"in-memory": [], "streamed": ["--stream"]}


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # rich wraps at the terminal width: keep each message on one line


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> Inputs:
    inputs = make_inputs(tmp_path_factory.mktemp("unfit"))
    add_word_tokenizer(inputs.target, vocab=96)
    return inputs


@pytest.fixture(scope="module")
def sharded(valid, tmp_path_factory) -> Path:
    """The valid target split in 3 shards with their model.safetensors.index.json."""
    return shard_checkpoint(copy_tree(valid.target, tmp_path_factory.mktemp("sharded") / "target"), 3)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "answers.jsonl"
    rows = [{"prompt": f"w{i} w{i + 7} w{i + 3}", "response": " ".join(f"w{(i * 5 + k) % 80 + 6}" for k in range(4 + i))}
            for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _flat(text: str) -> str:
    return " ".join(text.split())


def _assert_exit_2(outcome, argv, *said: str) -> str:
    """Exit 2, no traceback, and a message holding ``said``, what was found and what to do."""
    assert_handled(outcome, argv)
    err = _flat(outcome.err)
    assert outcome.rc == 2, f"exit {outcome.rc} for {argv}:\n{outcome.out[-2000:]}\n{err}"
    for text in said:
        assert text in err, f"{text!r} not in: {err}"
    assert "found:" in err and "expected:" in err and "what to do:" in err, err
    return err


# ---- drafters made for another target: check-wiring --------------------------------------------------------


def _drafter(valid: Inputs, tmp_path: Path, **config) -> Path:
    work = copy_tree(valid.drafter, tmp_path / "drafter")
    cfg = json.loads((work / "config.json").read_text()) | config
    (work / "config.json").write_text(json.dumps(cfg))
    return work


def _short_d2t(valid: Inputs, tmp_path: Path) -> Path:
    from safetensors.torch import load_file, save_file

    work = copy_tree(valid.drafter, tmp_path / "drafter")
    file = next(work.glob("*.safetensors"))
    tensors = load_file(str(file))
    tensors["d2t"] = tensors["d2t"][:20].contiguous()
    save_file(tensors, str(file))
    return work


def _speculators(valid: Inputs, tmp_path: Path, ids: list[int]) -> Path:
    """A speculators-format (vLLM convention) drafter config, config only."""
    cfg = json.loads((valid.drafter / "config.json").read_text())
    work = tmp_path / "spec_drafter"
    work.mkdir()
    (work / "config.json").write_text(json.dumps(speculators_config(cfg, aux_layer_ids=ids)))
    return work


UNFIT = {  # case -> (make the drafter, the field named, words of the message)
    "hidden size": (lambda v, t: _drafter(v, t, target_hidden_size=128), "target_hidden_size", ("does not fit the target", "found: 128", "64")),
    "target vocabulary": (lambda v, t: _drafter(v, t, vocab_size=200), "vocab_size", ("does not fit the target", "found: 200", "96")),
    "draft vocabulary": (lambda v, t: _drafter(v, t, draft_vocab_size=16), "lm_head.weight", ("cannot run", "shape [32, 64]", "[16, 64]", "re-export")),
    "d2t length": (_short_d2t, "d2t", ("cannot run", "shape [20]", "[32]", "re-export")),
    "SGLang ids >= layers": (lambda v, t: _drafter(v, t, eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1, 4]}),
                             "eagle_config.eagle_aux_hidden_state_layer_ids", ("name no layer", "[0, 1, 4] (sglang convention)", "4 layers")),
    "vLLM ids >= layers": (lambda v, t: _speculators(v, t, [1, 2, 4]), "eagle_aux_hidden_state_layer_ids",
                           ("name no layer", "[1, 2, 4] (vllm convention)", "4 layers")),
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("case", list(UNFIT))
def test_check_wiring_refuses_a_drafter_made_for_another_target(valid, tmp_path, capsys, case, path):
    make, field, said = UNFIT[case]
    drafter = make(valid, tmp_path)
    argv = ["check-wiring", str(drafter), "--target", str(valid.target), "--data", str(valid.data), *PATHS[path]]
    err = _assert_exit_2(run_cli(argv, capsys), argv, f"field '{field}'", *said)
    assert str(drafter) in err


@pytest.mark.parametrize("case", ["hidden size", "SGLang ids >= layers"])
def test_the_tap_search_refuses_a_drafter_made_for_another_target_before_loading_it(valid, tmp_path, capsys, case):
    make, field, said = UNFIT[case]
    argv = ["check-wiring", str(make(valid, tmp_path)), "--target", str(valid.target), "--search", "--stream"]
    _assert_exit_2(run_cli(argv, capsys), argv, f"field '{field}'", *said)


# ---- damaged sharded targets: check-wiring and capture ------------------------------------------------------


def _truncated(sharded: Path, tmp_path: Path) -> tuple[Path, str]:
    work = copy_tree(sharded, tmp_path / "target")
    shard = sorted(work.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[:-100])
    return work, shard.name


def _no_index(sharded: Path, tmp_path: Path) -> tuple[Path, str]:
    work = copy_tree(sharded, tmp_path / "target")
    (work / "model.safetensors.index.json").unlink()
    return work, "model.safetensors.index.json"


def _missing_shard(sharded: Path, tmp_path: Path) -> tuple[Path, str]:
    work = copy_tree(sharded, tmp_path / "target")
    shard = sorted(work.glob("model-*.safetensors"))[2]
    shard.unlink()
    return work, "model.safetensors.index.json"


DAMAGED = {  # case -> (damage the target, words of the message besides the file named)
    "truncated shard": (_truncated, ("is truncated: shorter than its safetensors header says", "100 missing")),
    "no index for several shards": (_no_index, ("several safetensors shards but no index", "3 shards")),
    "index names a missing shard": (_missing_shard, ("names shard files that are not in the directory",
                                                     "model-00003-of-00003.safetensors", "expected:")),
}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("case", list(DAMAGED))
def test_check_wiring_refuses_a_damaged_sharded_target(valid, sharded, tmp_path, capsys, case, path):
    damage, said = DAMAGED[case]
    target, named = damage(sharded, tmp_path)
    argv = ["check-wiring", str(valid.drafter), "--target", str(target), "--data", str(valid.data), *PATHS[path]]
    _assert_exit_2(run_cli(argv, capsys), argv, f"{target}/{named}", *said)


def _capture(target: Path, out: Path, prompts_file: Path, *extra: str) -> list[str]:
    return ["capture", "--model", str(target), "--out", str(out), "--prompts-file", str(prompts_file), "--batch-size", "2",
            "--device", "cpu", "--dtype", "float32", "--draft-vocab-size", "32", "--layer-ids", "0,1,2", *extra]


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("case", list(DAMAGED))
def test_capture_refuses_a_damaged_sharded_target(sharded, prompts_file, tmp_path, capsys, case, path):
    damage, said = DAMAGED[case]
    target, named = damage(sharded, tmp_path)
    argv = _capture(target, tmp_path / "out", prompts_file, *PATHS[path])
    _assert_exit_2(run_cli(argv, capsys), argv, f"{target}/{named}", *said)
    assert not list_samples(tmp_path / "out") if (tmp_path / "out").exists() else True


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("ids, convention, hf", [("0,1,4", "sglang", "[1, 2, 5]"), ("1,2,4", "vllm", "[1, 2, 4]")])
def test_capture_refuses_layer_ids_beyond_the_target(valid, prompts_file, tmp_path, capsys, ids, convention, hf, path):
    argv = _capture(valid.target, tmp_path / "out", prompts_file, *PATHS[path])
    argv[argv.index("--layer-ids") + 1] = ids
    argv += ["--convention", convention]
    _assert_exit_2(run_cli(argv, capsys), argv, "'--layer-ids'", f"HF indices {hf}", "1..3", "4-layer target", "config.json")
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_capture_stream_needs_the_responses(valid, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("w1 w2 w3\nw4 w5\n")
    argv = _capture(valid.target, tmp_path / "out", prompts, "--stream")
    _assert_exit_2(run_cli(argv, capsys), argv, "--stream needs the target's responses", "0 of 2 prompts with a response")


# ---- capture --stream writes what capture writes ---------------------------------------------------------------


def test_capture_stream_writes_the_in_memory_capture(sharded, prompts_file, tmp_path, capsys):
    """The same sharded target and given responses: equal samples (states within 1e-6, float32)."""
    for name, extra in PATHS.items():
        argv = _capture(sharded, tmp_path / name, prompts_file, *extra)
        outcome = run_cli(argv, capsys)
        assert outcome.rc == 0, outcome.err
    mem, st = (list_samples(tmp_path / name) for name in ("in-memory", "streamed"))
    assert len(mem) == len(st) == 5
    for a, b in zip(map(read_sample, mem), map(read_sample, st)):
        assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.loss_mask, b.loss_mask)
        assert int(a.loss_mask.sum()) >= 5  # the given response and its end-of-turn token
        assert (a.aux_hidden_state - b.aux_hidden_state).abs().max().item() < 1e-6
        assert (a.hidden_state - b.hidden_state).abs().max().item() < 1e-6
    manifests = [json.loads((tmp_path / name / "manifest.json").read_text()) for name in ("in-memory", "streamed")]
    assert manifests[0]["counts"] == manifests[1]["counts"] and manifests[0]["self_distillation"] is False
    assert "weights_sha256" in manifests[0]["target"] and "weights_digest" in manifests[1]["target"]
