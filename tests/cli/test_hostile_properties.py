"""Property tests: valid configs, weights, data, records, logs and flags, mutated by hypothesis, never
crash the CLI. Each mutated input must end in exit 0, 1 or 2 with no traceback and no internal error
(``--json`` still printing one JSON object), within a bounded time (a hang detector, not a speed test).

The number of examples scales with ``EAGLELAB_HOSTILE_SCALE`` (default 1; docs/reliability.md
quotes a sweep at a larger scale). Every input tried is counted and printed at the end of the
module (``pytest -s``).
"""

from __future__ import annotations

import json
import math
import os
import signal
import struct
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from eaglelab.cli import build_parser
from eaglelab.engine.errors import EagleLabError
from eaglelab.flags import RULES, validate
from tests.cli.hostile_inputs import Inputs, assert_handled, copy_tree, make_inputs, run_cli

SCALE = max(1, int(os.environ.get("EAGLELAB_HOSTILE_SCALE", "1")))
HANG_S = 60  # one CLI call on a tiny input takes well under a second; this only catches hangs
TRIED: Counter[str] = Counter()


def _settings(examples: int):
    return settings(max_examples=examples * SCALE, deadline=None, derandomize=SCALE == 1,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large])


class Hang(BaseException):
    """Raised by the alarm; a BaseException so the CLI's guard cannot turn it into an exit code."""


@contextmanager
def bounded(seconds: int = HANG_S) -> Iterator[None]:
    def ring(signum: int, frame: Any) -> None:
        raise Hang(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> Inputs:
    return make_inputs(tmp_path_factory.mktemp("hostile_valid"))


@pytest.fixture(scope="module", autouse=True)
def count_report() -> Iterator[None]:
    yield
    total = sum(TRIED.values())
    print(f"\nhostile inputs tried: {total} ({', '.join(f'{k} {v}' for k, v in sorted(TRIED.items()))})")
    out = os.environ.get("EAGLELAB_HOSTILE_COUNT_FILE")
    if out:
        Path(out).write_text(json.dumps({"total": total, **TRIED}))


def check(argv: list[str], capsys, kind: str) -> None:
    TRIED[kind] += 1
    with bounded():
        outcome = run_cli(argv, capsys)
    assert_handled(outcome, argv)


# ---- hostile values ----------------------------------------------------------------------------------

SPECIAL = [math.nan, math.inf, -math.inf, 0, -1, 1, 2**31, 2**63, 10**30, -(10**30), 1e-300, 1e308, 0.5, "", "abc",
           "1", "nan", True, False, None, "\udcff", "x" * 5000]
scalars = st.one_of(st.sampled_from(SPECIAL), st.integers(), st.floats(), st.text(max_size=12))
json_values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                           max_leaves=8)


def dump(obj: Any) -> str:
    """JSON as a careless tool writes it: NaN and Infinity allowed, lone surrogates escaped."""
    return json.dumps(obj, allow_nan=True)


@st.composite
def mutated_json(draw, original: dict) -> dict:
    """``original`` with a few fields set to hostile values, deleted, or nested objects broken."""
    obj = json.loads(json.dumps(original))
    for _ in range(draw(st.integers(1, 3))):
        holder = obj
        if isinstance(obj.get("eagle_config"), dict) and draw(st.booleans()):
            holder = obj["eagle_config"]
        keys = sorted(holder) + ["new_field"]
        key = draw(st.sampled_from(keys))
        if draw(st.integers(0, 4)) == 0:
            holder.pop(key, None)
        else:
            holder[key] = draw(json_values)
    return obj


@st.composite
def corrupted_bytes(draw, data: bytes) -> bytes:
    """Truncated, bit-flipped, spliced or replaced bytes."""
    how = draw(st.sampled_from(["truncate", "flip", "splice", "replace", "empty", "length"]))
    if how == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))]
    if how == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            at = draw(st.integers(0, min(len(out) - 1, 4096)))
            out[at] ^= draw(st.integers(1, 255))
        return bytes(out)
    if how == "splice":
        at = draw(st.integers(0, len(data)))
        return data[:at] + draw(st.binary(min_size=1, max_size=64)) + data[at:]
    if how == "length":  # a safetensors header length that lies
        return struct.pack("<Q", draw(st.sampled_from([0, 1, 7, 2**32, 2**63, len(data) * 2]))) + data[8:]
    if how == "empty":
        return b""
    return draw(st.binary(max_size=256))


# ---- drafter configs -------------------------------------------------------------------------------------


@_settings(60)
@given(data=st.data())
def test_mutated_drafter_config(valid: Inputs, tmp_path_factory, capsys, data) -> None:
    original = json.loads((valid.drafter / "config.json").read_text())
    work = copy_tree(valid.drafter, tmp_path_factory.getbasetemp() / "cfg_case")
    (work / "config.json").write_text(dump(data.draw(mutated_json(original))))
    with_target = data.draw(st.booleans())
    argv = ["check-wiring", str(work), "--json"] + (["--target", str(valid.target / "config.json")] if with_target else [])
    check(argv, capsys, "drafter configs")


@_settings(40)
@given(data=st.data())
def test_mutated_target_config(valid: Inputs, tmp_path_factory, capsys, data) -> None:
    original = json.loads((valid.target / "config.json").read_text())
    work = tmp_path_factory.getbasetemp() / "target_cfg_case"
    work.mkdir(exist_ok=True)
    (work / "config.json").write_text(dump(data.draw(mutated_json(original))))
    check(["check-wiring", str(valid.drafter), "--target", str(work / "config.json"), "--json"], capsys, "target configs")


# ---- drafter weights -------------------------------------------------------------------------------------

BAD_TENSORS = {
    "nan": lambda t: torch.full_like(t.float(), math.nan),
    "inf": lambda t: torch.full_like(t.float(), -math.inf),
    "float16": lambda t: t.half(),
    "int": lambda t: t.long() if not t.is_floating_point() else t.to(torch.int32),
    "bool": lambda t: t != 0,
    "float": lambda t: t.float(),
    "empty": lambda t: t.reshape(-1)[:0],
    "scalar": lambda t: t.reshape(-1)[:1].reshape(()),
    "transposed": lambda t: t.t().contiguous() if t.dim() == 2 else t[None],
    "bigger": lambda t: torch.cat([t, t]),
    "huge_values": lambda t: t.float() * 1e38 if t.is_floating_point() else t + 2**40,
}


@_settings(40)
@given(data=st.data())
def test_mutated_drafter_weights(valid: Inputs, tmp_path_factory, capsys, data) -> None:
    work = copy_tree(valid.drafter, tmp_path_factory.getbasetemp() / "weights_case")
    file = next(work.glob("*.safetensors"))
    if data.draw(st.booleans()):
        file.write_bytes(data.draw(corrupted_bytes(file.read_bytes())))
    else:
        tensors = load_file(file)
        for _ in range(data.draw(st.integers(1, 2))):
            name = data.draw(st.sampled_from(sorted(tensors)))
            how = data.draw(st.sampled_from(sorted(BAD_TENSORS) + ["delete", "extra"]))
            if how == "delete":
                tensors.pop(name)
            elif how == "extra":
                tensors["midlayer.extra.weight"] = torch.randn(3, 3)
            else:
                tensors[name] = BAD_TENSORS[how](tensors[name]).contiguous()
        save_file(tensors, str(file))
    check(["check-wiring", str(work), "--target", str(valid.target / "config.json"), "--json"], capsys, "drafter weights")


# ---- SpecForge data -------------------------------------------------------------------------------------


@_settings(30)
@given(data=st.data())
def test_mutated_training_data(valid: Inputs, tmp_path_factory, capsys, data) -> None:
    work = copy_tree(valid.data, tmp_path_factory.getbasetemp() / "data_case")
    files = sorted(work.rglob("data_*.ckpt"))
    file = data.draw(st.sampled_from(files))
    if data.draw(st.booleans()):
        file.write_bytes(data.draw(corrupted_bytes(file.read_bytes())))
    else:
        sample = torch.load(file, weights_only=True)
        key = data.draw(st.sampled_from(sorted(sample) + ["extra"]))
        how = data.draw(st.sampled_from(sorted(BAD_TENSORS) + ["delete", "list", "string", "none", "tokens0"]))
        if how == "delete":
            sample.pop(key, None)
        elif how in ("list", "string", "none"):
            sample[key] = {"list": [1, 2, 3], "string": "abc", "none": None}[how]
        elif how == "tokens0":
            sample = {k: v[..., :0, :] if v.dim() == 3 else v[:0] for k, v in sample.items()}
        elif key in sample:
            sample[key] = BAD_TENSORS[how](sample[key])
        torch.save(sample, file)
    argv = ["check-wiring", str(valid.drafter), "--data", str(work), "--target", str(valid.target), "--json"]
    check(argv, capsys, "training data")


# ---- run records ----------------------------------------------------------------------------------------


@st.composite
def mutated_json_line(draw, line: str) -> str:
    try:
        obj = json.loads(line)
    except ValueError:  # an earlier mutation broke the line already
        return line
    holder: Any = obj
    path = draw(st.lists(st.integers(0, 7), max_size=2))
    for step in path:  # walk into a nested dict or list, if there is one
        children = list(holder.items()) if isinstance(holder, dict) else list(enumerate(holder)) if isinstance(holder, list) else []
        nested = [(k, v) for k, v in children if isinstance(v, (dict, list)) and v]
        if not nested:
            break
        holder = nested[step % len(nested)][1]
    if isinstance(holder, dict) and holder:
        holder[draw(st.sampled_from(sorted(holder)))] = draw(json_values)
    elif isinstance(holder, list) and holder:
        holder[draw(st.integers(0, len(holder) - 1))] = draw(json_values)
    return dump(obj)


@st.composite
def mutated_lines(draw, lines: list[str], json_lines: bool) -> list[str]:
    lines = list(lines)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1)) if lines else 0
        how = draw(st.sampled_from(["value", "value", "delete", "duplicate", "truncate", "garbage", "long", "swap"]))
        if not lines:
            lines.append(draw(st.text(max_size=40)))
        elif how == "value" and json_lines:
            lines[i] = draw(mutated_json_line(lines[i]))
        elif how == "value":
            line = lines[i]
            at = line.find(":", draw(st.integers(0, max(len(line) - 1, 0))))
            lines[i] = line[: at + 1] + " " + draw(st.sampled_from(["nan", "inf", "-1", "1e999", "True", "", "x" * 200]))
        elif how == "delete":
            lines.pop(i)
        elif how == "duplicate":
            lines.insert(i, lines[i])
        elif how == "truncate":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        elif how == "garbage":
            lines.insert(i, draw(st.text(max_size=80)))
        elif how == "long":
            lines.insert(i, draw(st.sampled_from(["Decode batch, ", "", "{", "[2025-06-01 10:00:00 TP0] "])) +
                         draw(st.sampled_from(["a", "a:", ",", "#", " "])) * draw(st.integers(1000, 60000)))
        else:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
    return lines


@_settings(80)
@given(data=st.data())
def test_mutated_run_record(valid: Inputs, tmp_path_factory, capsys, data) -> None:
    from eaglelab.cmd_tui import app_kwargs
    from eaglelab.probes.record import read_record
    from eaglelab.tui.model import RunModel

    lines = valid.record.read_text().splitlines()
    work = tmp_path_factory.getbasetemp() / "record_case.jsonl"
    work.write_text("\n".join(data.draw(mutated_lines(lines, json_lines=True))) + "\n", errors="surrogatepass")
    check(["report", str(work), "--json"], capsys, "run records")
    check(["report", str(work)], capsys, "run records")
    args = build_parser().parse_args(["tui", str(work)])
    try:  # what `eaglelab tui` does before the app starts: refuse, or hand over events the model can fold
        app_kwargs(args)
    except EagleLabError:
        return
    model = RunModel()
    model.apply_all(read_record(work).events)
    model.view()


# ---- SGLang logs ----------------------------------------------------------------------------------------


@_settings(60)
@given(data=st.data())
def test_mutated_sglang_log(valid: Inputs, tmp_path_factory, capsys, data) -> None:
    lines = valid.log.read_text().splitlines()
    work = tmp_path_factory.getbasetemp() / "case.log"
    work.write_text("\n".join(data.draw(mutated_lines(lines, json_lines=False))) + "\n", errors="surrogatepass")
    check(["report", str(work), "--json"], capsys, "SGLang logs")


# ---- flags ----------------------------------------------------------------------------------------------

FLAG_VALUES = ["nan", "NaN", "inf", "-inf", "-1", "0", "1", "-0", "1e309", "1e-320", "99999999999999999999", "3.5",
               "0x10", " ", "", "1_000", "\udcff", "2", "8", "0.5"]
COMMAND_ARGS = {
    "run": ["hi"], "trace": ["hi", "LOGDIR"], "bench": [], "wait-ready": ["http://127.0.0.1:9"], "report": ["FILE"],
    "check-wiring": ["DRAFT"], "tui": ["RECORD"], "capture": ["--out", "OUT"], "train": ["--data", "DATA", "--out", "OUT"],
    "prompts": ["--out", "OUT"], "distill": ["--prompts", "P", "--out", "OUT"],
}


def _numeric_flags(command: str) -> list[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return sorted(a.option_strings[-1] for a in sub.choices[command]._actions
                  if a.dest in RULES and a.option_strings)


@_settings(150)
@given(data=st.data())
def test_flag_values_are_refused_or_sane(tmp_path_factory, data) -> None:
    """Whatever a user types, a number reaching a command is finite and within its rule (argparse or the
    flag layer refuse the rest, with exit 2); checked without running the command."""
    command = data.draw(st.sampled_from(sorted(COMMAND_ARGS)))
    flags = _numeric_flags(command)
    chosen = data.draw(st.lists(st.sampled_from(flags), min_size=1, max_size=3, unique=True)) if flags else []
    argv = [command, *COMMAND_ARGS[command]]
    for flag in chosen:
        argv += [flag + "=" + data.draw(st.sampled_from(FLAG_VALUES))]
    TRIED["flag sets"] += 1
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        assert exc.code == 2
        return
    try:
        validate(args)
    except EagleLabError:
        return
    for dest, rule in RULES.items():
        value = getattr(args, dest, None)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (rule.commands and command not in rule.commands):
            continue
        assert math.isfinite(value), (argv, dest, value)
        assert rule.low is None or value >= rule.low, (argv, dest, value)
        assert rule.high is None or value <= rule.high, (argv, dest, value)
