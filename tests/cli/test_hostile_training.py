"""Hostile inputs to capture, train, distill, synthesize, trace and the acceptance guard, round 2 (issue
#39): each case ended in a traceback, a hang, a wrong OK or the user's data lost before its fix."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from eaglelab.acceptance_guard import AcceptanceMeasurement, BaselineError, compare, read_baseline, write_baseline

SETTINGS = {"model": "m", "draft_shape": "eagle3", "prompts": "abc", "max_new_tokens": 32}


# ---- the acceptance guard ------------------------------------------------------------------------------


def measured(mean: float, positions: tuple[float, ...], steps: int = 40) -> AcceptanceMeasurement:
    return AcceptanceMeasurement(mean, positions, None, steps, dict(SETTINGS))


@pytest.mark.parametrize("field, value", [("mean_accept_len", "NaN"), ("mean_accept_len", "Infinity"),
                                          ("per_position", "[NaN, 0.1]"), ("per_position", "[1.5]"),
                                          ("mean_accept_len", "-1"), ("accept_rate", "NaN")])
def test_a_baseline_that_is_not_a_number_is_refused_not_a_pass_forever(tmp_path, field, value) -> None:
    """Before: a NaN baseline made every change NaN, NaN < -tolerance is False: the guard passed any drafter."""
    path = tmp_path / "b.json"
    write_baseline(path, measured(1.5, (0.4, 0.1)))
    text = path.read_text()
    obj = json.loads(text)
    obj[field] = "@@"
    path.write_text(json.dumps(obj).replace('"@@"', value))
    with pytest.raises(BaselineError, match="b.json") as info:
        read_baseline(path)
    assert field in str(info.value) and "--eaglelab-update-baseline" in str(info.value)


def test_a_measurement_that_is_not_a_number_regresses_and_is_never_written(tmp_path) -> None:
    base = measured(1.5, (0.4, 0.1))
    assert compare(measured(math.nan, (0.4, 0.1)), base, "b.json").regressed
    assert compare(measured(1.5, (math.nan, 0.1)), base, "b.json").regressed
    for bad in (measured(math.nan, (0.4,)), measured(1.0, (), steps=0)):
        with pytest.raises(BaselineError, match="nothing written"):
            write_baseline(tmp_path / "b.json", bad)
        assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("tolerance", [math.nan, -0.1, math.inf, "0.1"])
def test_a_tolerance_that_would_disable_the_guard_is_refused(tolerance) -> None:
    base = measured(1.5, (0.4, 0.1))
    with pytest.raises(BaselineError, match="tolerance"):
        compare(measured(1.0, (0.0, 0.0)), base, "b.json", tolerance=tolerance)


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_baseline_path_that_is_not_a_file_is_refused_without_blocking(tmp_path, kind) -> None:
    path = tmp_path / "b.json"
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    with pytest.raises(BaselineError, match="not a regular file"):
        read_baseline(path)


# ---- capture, train: the user's data and outputs ----------------------------------------------------------

import subprocess  # noqa: E402

import torch  # noqa: E402

from eaglelab.engine.errors import EagleLabError  # noqa: E402
from tests.cli.hostile_inputs import assert_handled, flat, Inputs, make_inputs, run_cli  # noqa: E402
from tests.conftest import add_word_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> Inputs:
    inputs = make_inputs(tmp_path_factory.mktemp("hostile_training"))
    add_word_tokenizer(inputs.target, vocab=96)
    return inputs


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")


def answers(path: Path, first: int, n: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 7}", "response": f"w{i + 9} w{i + 3} w5"}) + "\n"
                            for i in range(first, first + n)))
    return path


def capture_argv(valid: Inputs, out: Path, prompts: Path) -> list[str]:
    return ["capture", "--model", str(valid.target), "--out", str(out), "--prompts-file", str(prompts), "--device", "cpu",
            "--layer-ids", "0,1,2", "--draft-vocab-size", "32"]


def train_argv(valid: Inputs, out: Path, *extra: str) -> list[str]:
    return ["train", "--data", str(valid.data), "--model", str(valid.target), "--out", str(out), "--max-steps", "1",
            "--draft-vocab-size", "32", "--ttt-length", "2", "--max-length", "16", "--device", "cpu",
            "--checkpoint-every", "0", *extra]


def refused(outcome, argv, *said: str) -> str:
    assert_handled(outcome, argv)
    err = flat(outcome.err)
    assert outcome.rc == 2, err
    for text in said:
        assert text in err, err
    assert "found:" in err and "expected:" in err and "what to do:" in err, err
    return err


def test_capture_into_an_out_with_other_prompts_does_not_relabel_its_samples(valid, tmp_path, capsys) -> None:
    """Before: the second capture kept sample 0 (the answer to 'w0 w7') and rewrote prompts.jsonl, so the
    sample was listed under 'w20 w27'; both captures said 0."""
    out = tmp_path / "data"
    first = run_cli(capture_argv(valid, out, answers(tmp_path / "a.jsonl", 0, 3)), capsys)
    assert first.rc == 0, first.err
    before = (out / "prompts.jsonl").read_text()
    argv = capture_argv(valid, out, answers(tmp_path / "b.jsonl", 20, 4))
    refused(run_cli(argv, capsys), argv, "prompt 0 differs from the one its sample answers", "'w20 w27'")
    assert (out / "prompts.jsonl").read_text() == before
    more = run_cli(capture_argv(valid, out, answers(tmp_path / "c.jsonl", 0, 5)), capsys)  # the same first 3, then 2 more
    assert more.rc == 0 and "kept 3 from before" in flat(more.err + more.out)


def test_capture_refuses_an_out_whose_samples_have_no_manifest(valid, tmp_path, capsys) -> None:
    out = tmp_path / "data"
    (out / "rows_0-2000").mkdir(parents=True)
    torch.save({"input_ids": torch.zeros(3)}, out / "rows_0-2000" / "data_0.ckpt")
    argv = capture_argv(valid, out, answers(tmp_path / "a.jsonl", 0, 2))
    refused(run_cli(argv, capsys), argv, "holds samples but no manifest.json")


def test_two_captures_into_one_out_do_not_interleave(valid, tmp_path, capsys) -> None:
    """Before: nothing stopped a second capture writing the same sample files as the first (both exit 0)."""
    from eaglelab.engine.formats.safe_write import LOCK_NAME

    out = tmp_path / "data"
    out.mkdir()
    other = subprocess.Popen(["sleep", "60"])  # stands in for the first capture, still running
    try:
        (out / LOCK_NAME).write_text(f"{other.pid} capture\n")
        argv = capture_argv(valid, out, answers(tmp_path / "a.jsonl", 0, 2))
        refused(run_cli(argv, capsys), argv, "another eaglelab command is writing into this directory", str(other.pid))
        assert not (out / "prompts.jsonl").exists()
    finally:
        other.kill()
        other.wait()
    outcome = run_cli(argv, capsys)  # its writer is gone: the stale lock is taken over, and released at the end
    assert outcome.rc == 0, outcome.err
    assert not (out / LOCK_NAME).exists()


@pytest.mark.parametrize("content, said", [
    (b"hello \xff\xfe world\n", "is not UTF-8 text (line 1)"),  # before: exit 3, UnicodeDecodeError
    (b'{"prompt": "w1 \\ud800 w2", "response": "w3"}\n', "holds a lone surrogate"),  # before: exit 3, TypeError
    (b'{"prompt": "w1", "response": "w3 \\udcff"}\n', "holds a lone surrogate"),
    (b'{"turns": {"a": 1}}\n', "has no prompt"),  # before: exit 3, KeyError
    (b'{"turns": "abc"}\n', "has no prompt"),  # before: the prompt 'a'
    (b'[1, 2]\n', "has no prompt"),
])
def test_a_prompts_file_that_is_not_text_is_refused_by_line(valid, tmp_path, capsys, content, said) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_bytes(content)
    argv = capture_argv(valid, tmp_path / "data", prompts)
    refused(run_cli(argv, capsys), argv, said, str(prompts))


def test_a_prompts_file_that_is_a_fifo_is_refused_unopened(valid, tmp_path, capsys) -> None:
    """Before: reading it blocked for ever."""
    from eaglelab.engine.training.prompt_corpus import read_corpus

    fifo = tmp_path / "p.jsonl"
    os.mkfifo(fifo)
    argv = capture_argv(valid, tmp_path / "data", fifo)
    refused(run_cli(argv, capsys), argv, "a FIFO (named pipe)")
    with pytest.raises(EagleLabError, match="FIFO"):
        read_corpus(fifo)


def test_train_refuses_layer_ids_it_would_write_into_a_broken_drafter(valid, tmp_path, capsys) -> None:
    """Before: SpecForge's default ids for the 4-layer target, [1, 1, 0], trained, were written, and the
    saved drafter was reported with 'error: duplicated ids' after exit 0."""
    argv = train_argv(valid, tmp_path / "out")
    refused(run_cli(argv, capsys), argv, "--layer-ids", "a layer twice")
    assert not (tmp_path / "out").exists()
    assert run_cli(train_argv(valid, tmp_path / "out", "--layer-ids", "0,1,2"), capsys).rc == 0


def test_train_never_moves_a_drafter_that_cannot_run_into_out(valid, tmp_path) -> None:
    from eaglelab.engine.formats.draft_export import save_draft_checkpoint
    from eaglelab.engine.model.config import ModelConfig
    from eaglelab.training_jobs import write_checked

    out = tmp_path / "out"
    good = read_inputs_drafter(valid)

    def write_without_lm_head(staging: Path) -> None:
        save_draft_checkpoint(staging, good[0], {k: v for k, v in good[1].items() if k != "lm_head.weight"})

    with pytest.raises(EagleLabError, match="cannot run: nothing was written"):
        write_checked(out, ModelConfig.from_json(valid.target / "config.json"), write_without_lm_head)
    assert not any(out.iterdir())


def read_inputs_drafter(valid: Inputs) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    return json.loads((valid.drafter / "config.json").read_text()), load_file(valid.drafter / "model.safetensors")


@pytest.mark.parametrize("files", [{"mine.safetensors": b"x"}, {"config.json": b"{}", "model.safetensors": b"x"}])
def test_train_out_holding_a_users_weights_is_refused(valid, tmp_path, capsys, files) -> None:
    """Before: a user's *.safetensors in --out passed the check and was read with the new drafter; a drafter
    train did not write (no eaglelab_training.json) was overwritten."""
    out = tmp_path / "out"
    out.mkdir()
    for name, data in files.items():
        (out / name).write_bytes(data)
    argv = train_argv(valid, out, "--layer-ids", "0,1,2")
    refused(run_cli(argv, capsys), argv, "--out")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == files


# ---- a full disk ---------------------------------------------------------------------------------------------


@pytest.fixture
def full_disk(tmp_path) -> Path:
    """A 96 KiB tmpfs (root and mount needed; skipped elsewhere: the ENOSPC test below runs everywhere)."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mnt)],
                                           capture_output=True, timeout=30).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_train_onto_a_full_disk_is_exit_2_and_leaves_no_half_file(valid, full_disk, capsys) -> None:
    """Before: safetensors' SafetensorError 'No space left on device' was exit 3 (an internal error)."""
    argv = train_argv(valid, full_disk / "out", "--layer-ids", "0,1,2")
    refused(run_cli(argv, capsys), argv, "the disk is full", "model.safetensors")
    assert not [p for p in full_disk.rglob("*") if p.is_file()]


def test_a_sample_onto_a_full_disk_leaves_no_truncated_sample(full_disk) -> None:
    """Before: torch's zip writer failed with 'unexpected pos' (exit 3) and left a truncated data_0.ckpt that
    a resumed capture kept as done."""
    from eaglelab.engine.formats.specforge_data import write_sample

    sample = {"input_ids": torch.zeros(64, dtype=torch.long), "hidden_state": torch.zeros(1, 64, 512)}
    with pytest.raises(EagleLabError, match="the disk is full") as info:
        write_sample(full_disk / "data", 0, sample)
    assert info.value.file.endswith("data_0.ckpt")
    assert not [p for p in full_disk.rglob("*") if p.is_file()]


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"),
                                   RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")])
def test_every_writer_names_a_full_disk(tmp_path, monkeypatch, error) -> None:
    """ENOSPC simulated (no tmpfs needed): each output writer turns it into exit 2 naming the file."""
    from eaglelab.engine.formats import safe_write
    from eaglelab.engine.formats.draft_export import save_draft_checkpoint
    from eaglelab.engine.training.capture import write_manifest
    from eaglelab.engine.training.distill import write_shard

    def full(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise error

    real = safe_write.write_atomic
    monkeypatch.setattr(safe_write, "write_atomic", lambda path, write, **kw: real(path, full, **kw))
    writers = [lambda: write_manifest(tmp_path / "d", {"a": 1}),
               lambda: write_shard(tmp_path / "s" / "shard_0.safetensors", [(0, [1], [2], True)]),
               lambda: save_draft_checkpoint(tmp_path / "dr", {"architectures": ["LlamaForCausalLMEagle3"]},
                                             {"fc.weight": torch.zeros(2)})]
    for write in writers:
        with pytest.raises(EagleLabError, match="the disk is full"):
            write()
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_disk_full_error_from_a_library_is_a_user_error(capsys) -> None:
    from argparse import Namespace

    from eaglelab.errors import run_guarded

    def fails(args):
        raise RuntimeError("Error while serializing: I/O error: No space left on device (os error 28)")

    assert run_guarded(fails, Namespace()) == 2
    assert "the disk is full" in capsys.readouterr().err


# ---- the context window --------------------------------------------------------------------------------------


def test_train_cuts_samples_at_the_targets_context_window(valid, tmp_path, capsys) -> None:
    """Before: --max-length 2048 trained positions past the tiny target's 256-token window, without a word."""
    out = run_cli(train_argv(valid, tmp_path / "out", "--layer-ids", "0,1,2", "--max-length", "5000"), capsys)
    assert out.rc == 0, out.err
    assert "samples cut at 256 tokens, the target's context window" in flat(out.err)
    record = json.loads((tmp_path / "out" / "eaglelab_training.json").read_text())
    assert record["train_config"]["max_length"] == 256


def test_trace_refuses_a_prompt_past_the_context_window(valid, tmp_path, capsys) -> None:
    """Before: only `run` checked; trace profiled a generation past the window."""
    prompt = " ".join(f"w{i % 80}" for i in range(300))  # 300 words of the word tokenizer: past 256
    argv = ["trace", prompt, "--model", str(valid.target), "--draft", "none", "--device", "cpu",
            "--logdir", str(tmp_path / "tb"), "--max-new-tokens", "4"]
    outcome = run_cli(argv, capsys)
    assert_handled(outcome, argv)
    assert outcome.rc == 2 and "context window" in flat(outcome.err), flat(outcome.err)


# ---- properties: any bytes as a prompts file, any JSON as a shard index -------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PROPERTY = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
json_lines = st.lists(st.one_of(
    st.binary(max_size=40),
    st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
                           st.sampled_from(["\ud800", "w1 w2", ""])),
                 lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["prompt", "text", "turns", "response", "x"]), c, max_size=3),
                 max_leaves=6).map(lambda v: json.dumps(v).encode())), max_size=5)


@PROPERTY
@given(lines=json_lines, suffix=st.sampled_from([".jsonl", ".txt"]))
def test_any_prompts_file_is_read_or_refused_by_name(tmp_path, lines, suffix) -> None:
    from eaglelab.cmd_capture import read_prompts_file

    path = tmp_path / f"p{suffix}"
    path.write_bytes(b"\n".join(lines))
    try:
        pairs = read_prompts_file(str(path))
    except EagleLabError as exc:
        assert exc.file == str(path)
        return
    for prompt, response in pairs:  # whatever is accepted, a tokenizer can encode
        assert prompt and prompt.encode("utf-8") and (response is None or response.encode("utf-8") is not None)


@PROPERTY
@given(weight_map=st.one_of(st.none(), st.integers(), st.lists(st.text(max_size=4), max_size=2),
                            st.dictionaries(st.sampled_from(["fc.weight", "lm_head.weight", "x"]),
                                            st.one_of(st.sampled_from(["model.safetensors", "../model.safetensors", "",
                                                                       "/etc/passwd", "a/b", "missing.safetensors"]),
                                                      st.integers()), max_size=3)))
def test_any_shard_index_is_read_or_refused_by_name(valid, tmp_path_factory, weight_map) -> None:
    from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint
    from tests.cli.hostile_inputs import copy_tree

    drafter = copy_tree(valid.drafter, tmp_path_factory.mktemp("index") / "drafter")
    (drafter / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    try:
        ck = read_draft_checkpoint(drafter)
    except EagleLabError as exc:
        assert exc.file and exc.field
        return
    assert all(info.file.parent == drafter for info in ck.tensors.values())
