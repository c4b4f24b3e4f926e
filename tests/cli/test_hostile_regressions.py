"""One test per case of the hostile-input sweep (issue "no traceback, no hang, no wrong OK, nothing of
the user's lost"): each failed before the fix. Tiny inputs from ``hostile_inputs``; where a command
would load the real model, the test shows that it refuses before loading anything."""

from __future__ import annotations

import http.server
import json
import math
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eaglelab.engine.errors import CheckpointError, EagleLabError
from eaglelab.errors import INTERNAL_ERROR_EXIT
from tests.cli.hostile_inputs import assert_handled, copy_tree, flat, Inputs, make_inputs, run_cli


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> Inputs:
    return make_inputs(tmp_path_factory.mktemp("hostile_regressions"))


def drafter_with(valid: Inputs, tmp_path: Path, **config) -> Path:
    work = copy_tree(valid.drafter, tmp_path / "drafter")
    cfg = json.loads((work / "config.json").read_text())
    cfg.update(config)
    (work / "config.json").write_text(json.dumps(cfg))
    return work


def set_tensor(drafter: Path, name: str, fn) -> None:
    file = next(drafter.glob("*.safetensors"))
    tensors = load_file(file)
    tensors[name] = fn(tensors[name]).contiguous()
    save_file(tensors, str(file))


def wiring_json(argv: list[str], capsys) -> dict:
    outcome = run_cli(argv + ["--json"], capsys)
    assert_handled(outcome, argv + ["--json"])
    return json.loads(outcome.out)


# ---- drafter configs and weights ---------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, said", [
    ("rope_theta", "abc", "must be a number"),
    ("rms_norm_eps", math.nan, "must be a finite number"),
    ("draft_vocab_size", 100_000, "larger than the vocabulary"),
    ("rope_scaling", {"rope_type": "linear", "factor": "x"}, "must be a number"),
])
def test_bad_drafter_config_field_is_exit_2_naming_it(valid, tmp_path, capsys, field, value, said) -> None:
    out = wiring_json(["check-wiring", str(drafter_with(valid, tmp_path, **{field: value}))], capsys)
    assert out["verdict"] == "error" and out["exit_code"] == 2 and "config.json" in out["file"]
    assert said in out["error"] and out["field"].startswith(field)


@pytest.mark.parametrize("value", [3.5, [["nested"]], {"a": 1}])
def test_architectures_of_any_type_do_not_crash(valid, tmp_path, capsys, value) -> None:
    wiring_json(["check-wiring", str(drafter_with(valid, tmp_path, architectures=value))], capsys)
    wiring_json(["check-wiring", str(valid.drafter), "--target", str(drafter_with(valid, tmp_path, architectures=value) / "config.json")], capsys)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_drafter_weights_are_not_wiring_ok(valid, tmp_path, capsys, value) -> None:
    work = copy_tree(valid.drafter, tmp_path / "drafter")
    set_tensor(work, "fc.weight", lambda t: t.index_fill(0, torch.tensor([0]), value))
    out = wiring_json(["check-wiring", str(work)], capsys)
    assert out["exit_code"] == 2 and out["field"] == "fc.weight" and "non-finite" in out["error"]


def test_d2t_stored_as_float_is_refused(valid, tmp_path, capsys) -> None:
    work = copy_tree(valid.drafter, tmp_path / "drafter")
    set_tensor(work, "d2t", lambda t: t.float())
    out = wiring_json(["check-wiring", str(work)], capsys)
    assert out["exit_code"] == 2 and out["field"] == "d2t" and "integers" in out["error"]


def test_a_stale_shard_the_index_does_not_list_is_not_read(valid, tmp_path, capsys) -> None:
    """Before: every *.safetensors was read, and a leftover file overrode the indexed weights."""
    from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint

    work = copy_tree(valid.drafter, tmp_path / "drafter")
    real = next(work.glob("*.safetensors"))
    (work / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: real.name for k in load_file(real)}}))
    save_file({"fc.weight": torch.full_like(load_file(real)["fc.weight"], math.nan)}, str(work / "old-export.safetensors"))
    ck = read_draft_checkpoint(work)
    assert ck.weight_files == (real,)
    assert torch.equal(ck.load_tensor("fc.weight"), load_file(real)["fc.weight"])
    assert wiring_json(["check-wiring", str(work)], capsys)["exit_code"] == 4  # static checks pass; not checked numerically


# ---- SpecForge data ------------------------------------------------------------------------------------------


def test_a_sample_with_no_tokens_is_exit_2(valid, tmp_path, capsys) -> None:
    from eaglelab.engine.formats.specforge_data import list_samples

    data = copy_tree(valid.data, tmp_path / "data")
    first = list_samples(data)[0]
    sample = torch.load(first, weights_only=True)
    torch.save({k: v[..., :0, :] if v.dim() == 3 else v[:0] for k, v in sample.items()}, first)
    out = wiring_json(["check-wiring", str(valid.drafter), "--data", str(data), "--target", str(valid.target)], capsys)
    assert out["exit_code"] == 2 and "no tokens" in out["error"] and out["field"] == "input_ids"


def test_a_sample_with_nan_states_is_refused(valid, tmp_path) -> None:
    from eaglelab.engine.formats.specforge_data import list_samples, read_sample

    data = copy_tree(valid.data, tmp_path / "data")
    first = list_samples(data)[0]
    sample = torch.load(first, weights_only=True)
    sample["aux_hidden_state"][0, 0, 0] = math.nan
    torch.save(sample, first)
    with pytest.raises(CheckpointError, match="non-finite"):
        read_sample(first)


def test_a_file_that_is_not_a_training_checkpoint_is_refused(tmp_path) -> None:
    """``train --resume FILE`` on anything else: a message naming the file (it was a traceback)."""
    from eaglelab.engine.formats.validate import load_tensor_dict
    from eaglelab.engine.training.train import CHECKPOINT_KEYS

    text = tmp_path / "notes.pt"
    text.write_bytes(b"hello")
    wrong = tmp_path / "list.pt"
    torch.save([1, 2, 3], wrong)
    partial = tmp_path / "partial.pt"
    torch.save({"model": {}}, partial)
    for path, said in ((text, "cannot be read"), (wrong, "is not a training checkpoint"), (partial, "keys missing")):
        with pytest.raises(CheckpointError, match=said) as err:
            load_tensor_dict(path, what="a training checkpoint", required=CHECKPOINT_KEYS)
        assert str(path) in str(err.value)


def test_a_diverged_drafter_is_never_written(tmp_path) -> None:
    from eaglelab.training_jobs import check_finite

    net = torch.nn.Linear(2, 2)
    with torch.no_grad():
        net.weight[0, 0] = math.nan
    with pytest.raises(EagleLabError, match="training diverged"):
        check_finite(net, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


# ---- records -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("line", [
    '{"type":"step","index":9,"kind":"spec","phase_ms":{"verify":Infinity},"accept_len":[2]}',
    '{"type":"step","index":9,"kind":"spec","phase_ms":{"verify":NaN},"accept_len":[2]}',
    '{"type":"run_started","model":["a","list"],"model_digest":"d","device":"cpu","dtype":"float32","batch_size":1,'
    '"spec":{},"model_config":{},"versions":{}}',
    '{"type":["step"],"index":1}',
    '{"type":"step","index":9,"kind":"spec","phase_ms":{},"num_draft_tokens":1000000000000000000000000000000}',
])
def test_damaged_record_lines_are_skipped_not_fatal(valid, tmp_path, capsys, line) -> None:
    from eaglelab.cmd_tui import app_kwargs
    from eaglelab.cli import build_parser
    from eaglelab.probes.record import read_record
    from eaglelab.tui.model import RunModel

    path = tmp_path / "run.jsonl"
    path.write_text(valid.record.read_text() + line + "\n")
    assert read_record(path).skipped_lines == 1
    for argv in (["report", str(path), "--json"], ["report", str(path)]):
        outcome = run_cli(argv, capsys)
        assert_handled(outcome, argv)
        assert outcome.rc == 0
    app_kwargs(build_parser().parse_args(["tui", str(path)]))
    model = RunModel()
    model.apply_all(read_record(path).events)
    assert model.view() is not None


def test_report_json_never_prints_nan(valid, tmp_path, capsys) -> None:
    from eaglelab.cmd_report import finite_json

    assert finite_json({"a": [math.nan, 1.0, {"b": math.inf}]}) == {"a": [None, 1.0, {"b": None}]}
    outcome = run_cli(["report", str(valid.record), "--json"], capsys)
    json.loads(outcome.out, parse_constant=lambda name: pytest.fail(f"{name} in --json output"))


def test_a_record_killed_mid_run_is_reported_as_unfinished(valid, tmp_path, capsys) -> None:
    path = tmp_path / "killed.jsonl"
    lines = valid.record.read_text().splitlines()
    path.write_text("\n".join(line for line in lines if '"run_finished"' not in line) + "\n")
    out = json.loads(run_cli(["report", str(path), "--json"], capsys).out)
    assert out["details"]["finished"] is False and any("did not finish" in n for n in out["notes"])
    done = json.loads(run_cli(["report", str(valid.record), "--json"], capsys).out)
    assert done["details"]["finished"] is True and not any("did not finish" in n for n in done["notes"])


def test_tui_refuses_an_empty_record_instead_of_waiting(tmp_path, capsys) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    outcome = run_cli(["tui", str(empty)], capsys)
    assert outcome.rc == 2 and "holds no events" in flat(outcome.err)


# ---- flags, refused before the model loads ---------------------------------------------------------------------


@pytest.mark.parametrize("argv, said", [
    (["run", "", "--raw"], "PROMPT"),
    (["run", "hi", "--max-new-tokens", "1000000000000"], "--max-new-tokens"),
    (["run", "\udcff\udcfe"], "not valid UTF-8"),
    (["run", "hi", "--temperature", "nan"], "--temperature"),
    (["bench", "--prompts", "0"], "--prompts"),
    (["capture", "--prompts", "-3", "--out", "OUT"], "--prompts"),
    (["capture", "--draft-vocab-size", "0", "--out", "OUT"], "--draft-vocab-size"),
    (["report", "FILE", "--decode-ms", "-5"], "--decode-ms"),
    (["wait-ready", "http://[::1"], "not a valid URL"),
    (["wait-ready", "http://localhost:99999"], "not a valid URL"),
    (["wait-ready", "http://localhost:1", "--interval", "nan"], "--interval"),
    (["wait-ready", "http://localhost:1", "--timeout", "nan"], "--timeout"),
    (["check-wiring", "DRAFT", "--samples", "0"], "--samples"),
])
def test_bad_flag_values_are_exit_2_before_any_work(no_model, capsys, argv, said) -> None:
    outcome = run_cli(argv, capsys)
    assert outcome.rc == 2 and said in flat(outcome.err) and "Traceback" not in outcome.err


def test_prompt_past_the_context_window_is_refused(valid) -> None:
    """A prompt longer than max_position_embeddings ran for minutes; now: exit 2 with the numbers."""
    import eaglelab.engine.formats.loader as loader

    from eaglelab.engine.runtime.limits import check_context

    target = loader.load_target(str(valid.target), device="cpu", dtype="float32", with_tokenizer=False)
    with pytest.raises(EagleLabError, match="longer than the model's context window"):
        check_context(target.config, 300, 1)
    with pytest.raises(EagleLabError, match=r"use --max-new-tokens 56 or less"):
        check_context(target.config, 200, 100)
    check_context(target.config, 200, 56)


def test_a_kv_cache_larger_than_memory_is_refused_before_allocating() -> None:
    from eaglelab.engine.runtime.limits import available_bytes, check_memory

    free = available_bytes(torch.device("cpu"))
    if free is None:
        pytest.skip("no /proc/meminfo here")
    with pytest.raises(EagleLabError, match="not enough memory for the KV cache"):
        check_memory(free * 2, torch.device("cpu"), "the KV cache")
    check_memory(1 << 20, torch.device("cpu"), "the KV cache")


# ---- outputs: nothing of the user's lost ---------------------------------------------------------------------


def test_record_refuses_a_file_that_is_not_a_record(no_model, tmp_path, capsys) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    outcome = run_cli(["run", "hi", "--record", str(notes)], capsys)
    assert outcome.rc == 2 and "not an eaglelab run record" in flat(outcome.err)
    assert notes.read_text() == "my notes\n"
    outcome = run_cli(["run", "hi", "--record", str(notes), "--force"], capsys)  # --force never takes a foreign file
    assert outcome.rc == 2 and notes.read_text() == "my notes\n"


def test_record_refuses_an_existing_record_unless_forced(no_model, valid, tmp_path, capsys) -> None:
    from eaglelab.flags import validate
    from eaglelab.cli import build_parser
    from eaglelab.probes.record import RecordWriter, read_record

    old = copy_tree(valid.record.parent, tmp_path / "runs") / valid.record.name
    before = old.read_text()
    outcome = run_cli(["run", "hi", "--record", str(old)], capsys)
    assert outcome.rc == 2 and "already holds a run" in flat(outcome.err) and old.read_text() == before
    validate(build_parser().parse_args(["run", "hi", "--record", str(old), "--force"]))  # allowed with --force
    with RecordWriter(old, mode="replace") as writer:  # what --force does: start the record over
        assert writer.lines_written == 0
    assert read_record(old).events == [] and read_record(old).schema_version == 1


@pytest.mark.parametrize("make", ["file", "foreign_dir"])
def test_train_out_is_checked_before_training(no_model, valid, tmp_path, capsys, make) -> None:
    out = tmp_path / "out"
    if make == "file":
        out.write_text("not a directory")
    else:
        out.mkdir()
        (out / "thesis.tex").write_text("years of work")
    outcome = run_cli(["train", "--data", str(valid.data), "--out", str(out)], capsys)
    assert outcome.rc == 2 and "--out" in flat(outcome.err)
    assert (out.read_text() if make == "file" else (out / "thesis.tex").read_text()) in ("not a directory", "years of work")


# ---- servers ---------------------------------------------------------------------------------------------------


def test_a_server_answering_any_html_page_is_not_ready() -> None:
    from eaglelab.probes.readiness import probe_models

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = b"<html><body>It works!</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        answer = probe_models(f"http://127.0.0.1:{httpd.server_address[1]}/v1/models", 2.0)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert not answer.ok and answer.status == 200 and "not an OpenAI /v1/models answer" in answer.detail


def test_a_long_log_line_without_separators_is_read_in_one_pass() -> None:
    """40k characters took 43 s: the pair regex backtracked over the whole rest of the line from every
    letter. Pairs are now read by one split and one partition per piece, and lines are cut at
    MAX_LINE_CHARS; the property tests' hang detector bounds the time."""
    from eaglelab.probes.sglang_log import MAX_LINE_CHARS, _pairs, parse_line

    item = parse_line("Decode batch, " + "a" * 400_000)
    assert item is not None and item.raw == {}
    assert _pairs("a" * 100 + ", accept len: 2.5, #token: 7, 12 x: 3") == {"accept len": "2.5", "#token": "7", "x": "3"}
    nan = parse_line("Prefill batch, #new-seq: nan, #new-token: inf, token usage: -inf, accept len: 2")
    assert (nan.new_seq, nan.new_token, nan.token_usage) == (None, None, None)  # found by the property sweep
    cut = parse_line("Decode batch, accept len: 2.5, " + "b" * (2 * MAX_LINE_CHARS) + ", #token: 7")
    assert cut.accept_len == 2.5 and cut.num_token is None  # read up to MAX_LINE_CHARS only


# ---- the guard ---------------------------------------------------------------------------------------------------


def test_an_unexpected_exception_is_a_short_internal_error_report(monkeypatch, capsys, valid) -> None:
    import eaglelab.cmd_report as cmd_report

    def broken(args):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(cmd_report, "run", broken)
    outcome = run_cli(["report", str(valid.record)], capsys)
    err = flat(outcome.err)
    assert outcome.rc == INTERNAL_ERROR_EXIT not in (0, 1, 2)
    assert "internal error: ZeroDivisionError: boom" in err and "eaglelab report" in err and "versions: eaglelab" in err
    assert "please report it" in err and "--debug" in err and "Traceback" not in outcome.err
    outcome = run_cli(["report", str(valid.record), "--json"], capsys)
    assert json.loads(outcome.out)["exit_code"] == INTERNAL_ERROR_EXIT
    with pytest.raises(ZeroDivisionError):
        run_cli(["report", str(valid.record), "--debug"], capsys)


def test_check_wiring_json_on_unusable_input_is_a_json_error_and_exit_2(tmp_path, capsys) -> None:
    outcome = run_cli(["check-wiring", str(tmp_path / "missing"), "--json"], capsys)
    obj = json.loads(outcome.out)
    assert outcome.rc == 2 and obj["verdict"] == "error" and obj["exit_code"] == 2
