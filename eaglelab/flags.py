"""Flag values checked before any model loads: counts, finite numbers, text, and output paths.

argparse checks a flag's type (``--steps x`` is refused); this layer checks its value, so
``--max-new-tokens 0``, ``--interval nan`` or ``--prompts -3`` end in a message naming the flag,
what was found and what is expected (exit 2) instead of a traceback, a hang or a silent default.
One table, :data:`RULES`, keyed by the argparse destination; a rule applies to every command that
has the flag unless it names commands. Output paths are checked here too, before the work starts:
a run that took an hour must not fail at its last step because ``--out`` is a file.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from eaglelab.engine.errors import EagleLabError

MAX_COUNT = 1_000_000  # any count flag above this is a typo, and would allocate or loop without end
MAX_TOKENS = 1 << 20  # --max-new-tokens and friends: further bounded by the model's context window
MAX_SEED = (1 << 63) - 1


@dataclass(frozen=True)
class Rule:
    """What a flag's value must be: an int or a finite float within [low, high] (``low_open``: > low)."""

    kind: str  # "int" | "float"
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    commands: tuple[str, ...] = ()  # empty: every command that has the flag

    def expected(self) -> str:
        lo = "" if self.low is None else f"{'>' if self.low_open else '>='} {_num(self.low)}"
        hi = "" if self.high is None else f"<= {_num(self.high)}"
        kind = "an integer" if self.kind == "int" else "a finite number"
        return " ".join(p for p in (kind, lo, "and" if lo and hi else "", hi) if p)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _count(low: int = 1, high: int = MAX_COUNT, *commands: str) -> Rule:
    return Rule("int", low, high, commands=commands)


def _real(low: float | None = None, high: float | None = None, *, low_open: bool = False) -> Rule:
    return Rule("float", low, high, low_open)


RULES: dict[str, Rule] = {
    "max_new_tokens": _count(1, MAX_TOKENS),
    "max_tokens": _count(2, MAX_TOKENS),
    "max_length": _count(2, MAX_TOKENS),
    "max_prompt_tokens": _count(1, MAX_TOKENS),
    "new_tokens": _count(1, MAX_TOKENS),
    "micro_context": _count(1, MAX_TOKENS),
    "steps": _count(1, 64),
    "topk": _count(1, 64),
    "draft_tokens": _count(0, 4096),
    "top_k": _count(0, MAX_COUNT),
    "tp": _count(1, 4096),
    "samples": _count(),
    "prompts": _count(1, MAX_COUNT, "capture", "bench"),
    "repeats": _count(),
    "batch_size": _count(1, 65536),
    "epochs": _count(),
    "ttt_length": _count(1, 64),
    "draft_vocab_size": _count(1, 1 << 24),
    "intermediate_size": _count(1, 1 << 20),
    "max_size_mb": _real(0.0, 1e6, low_open=True),
    "max_steps": _count(),
    "total_steps": _count(),
    "checkpoint_every": _count(0),
    "log_every": _count(),
    "eval_every": _count(0),
    "eval_samples": _count(),
    "count": _count(),
    "min_words": _count(1, 10_000),
    "limit": _count(),
    "top": _count(),
    "time_limit": _real(0.0, 365 * 24 * 3600.0, low_open=True),
    "seed": _count(0, MAX_SEED),
    "temperature": _real(0.0, 100.0),
    "top_p": _real(0.0, 1.0, low_open=True),
    "timeout": _real(0.0, 7 * 24 * 3600.0, low_open=True),
    "interval": _real(0.0, 3600.0, low_open=True),
    "decode_ms": _real(0.0, 1e6, low_open=True),
    "expected_accept_len": _real(0.0, 1e4, low_open=True),
    "hbm_tbps": _real(0.0, 1e3, low_open=True),
    "speed": _real(0.0, 1e6),
    "lr": _real(0.0, 10.0, low_open=True),
    "step_decay": _real(0.0, 1.0, low_open=True),
    "target_temperature": _real(0.0, 100.0, low_open=True),
    "warmup_ratio": _real(0.0, 1.0),
    "max_grad_norm": _real(0.0, 1e6, low_open=True),
    "weight_decay": _real(0.0, 10.0),
}


def flag_name(dest: str) -> str:
    """``max_new_tokens`` -> ``--max-new-tokens`` (positionals: upper case)."""
    return dest.upper() if dest in _POSITIONALS else "--" + dest.replace("_", "-")


_POSITIONALS = {"prompt", "url", "file", "record", "draft_dir", "logdir"}


def check_value(dest: str, value: Any, rule: Rule) -> None:
    """Raise :class:`EagleLabError` when ``value`` breaks ``rule``."""
    name = flag_name(dest)
    if rule.kind == "float" and not math.isfinite(value):
        raise EagleLabError("must be a finite number", field=name, found=value, expected=rule.expected())
    too_low = rule.low is not None and (value <= rule.low if rule.low_open else value < rule.low)
    if too_low or (rule.high is not None and value > rule.high):
        raise EagleLabError("out of range", field=name, found=value, expected=rule.expected())


def int_list(text: str, field: str, least: int = 1) -> tuple[int, ...]:
    """A comma list of integers >= ``least`` (``--batch-sizes 1,8,32``), sorted, without repeats."""
    try:
        vals = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise EagleLabError("expected a comma list of integers", field=field, found=text) from None
    if not vals or vals[0] < least:
        raise EagleLabError(f"values must be >= {least}", field=field, found=text)
    return vals


def check_text(dest: str, value: str) -> None:
    """Text a user typed must be valid Unicode (a non-UTF-8 byte arrives as a lone surrogate)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise EagleLabError("is not valid UTF-8 text", field=flag_name(dest),
                            found=f"byte {value[exc.start]!r} at character {exc.start}",
                            hint="pass the text in UTF-8 (check the terminal's or the file's encoding)") from None


def validate(args: argparse.Namespace) -> None:
    """Check every flag of the parsed command line; raises :class:`EagleLabError` on the first bad one."""
    command = getattr(args, "command", None) or ""
    for dest, value in sorted(vars(args).items()):
        if isinstance(value, str):
            check_text(dest, value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, str):
                    check_text(dest, item)
        rule = RULES.get(dest)
        if rule is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue  # no rule, unset, or another command's flag of the same name (distill --prompts FILE)
        if rule.commands and command not in rule.commands:
            continue
        check_value(dest, value, rule)
    for check in OUTPUT_CHECKS.get(command, ()):
        check(args)
    for check in COMMAND_CHECKS.get(command, ()):
        check(args)


# ---- output paths, checked before the work starts ----------------------------------------------------


def _record_output(args: argparse.Namespace) -> None:
    if getattr(args, "record", None):
        from eaglelab.probes.record import check_record_output

        check_record_output(args.record, mode="replace" if args.force else "new")


def _dir_output(dest: str) -> Callable[[argparse.Namespace], None]:
    def check(args: argparse.Namespace) -> None:
        value = getattr(args, dest, None)
        if value:
            check_output_dir(value, flag_name(dest))

    return check


def check_output_dir(path: str | Path, flag: str) -> None:
    """An output directory: absent (it will be made) or a directory; its nearest existing parent writable."""
    import os

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise EagleLabError("is a file, not a directory", file=path, field=flag, expected="a directory (new or existing)",
                            hint="pick another path; eaglelab does not overwrite your files")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise EagleLabError("cannot be written here", file=parent, field=flag, found="no write permission",
                            hint="pick a directory you can write to")


def _file_output(dest: str) -> Callable[[argparse.Namespace], None]:
    """An output file written at the end of a run (bench's and tune's --json): checked before the run."""
    def check(args: argparse.Namespace) -> None:
        value = getattr(args, dest, None)
        if value and Path(value).is_dir():
            raise EagleLabError("is a directory", file=value, field=flag_name(dest), expected="a .json file",
                                hint=f"name a file, e.g. {flag_name(dest)} {args.command}.json")
        if value:
            check_output_dir(Path(value).parent, flag_name(dest))

    return check


def _bench_json(args: argparse.Namespace) -> None:
    """bench's --json replaces a report an earlier bench wrote; any other file is the user's: refused unless --force."""
    _file_output("json")(args)
    path = Path(args.json) if args.json else None
    if path is None or not path.exists() or (path.is_file() and path.stat().st_size == 0):
        return
    from eaglelab.probes.file_kind import file_kind, is_special

    if is_special(path):  # a FIFO is never opened: reading it would block until a writer came
        raise EagleLabError(f"is {file_kind(path)}", file=path, field="--json", expected="a .json file",
                            hint="name a file, e.g. --json bench.json")
    found = _bench_report_kind(path)
    if found is not None and not args.force:
        raise EagleLabError("is not a report an earlier `eaglelab bench` wrote: refusing to overwrite it", file=path,
                            field="--json", found=found, expected='a new file, or a bench JSON ("schema": "eaglelab.bench/...")',
                            hint="name a new file, or pass --force to replace this one")


def _bench_report_kind(path: Path) -> str | None:
    """None for a bench report (bench may replace it); else what the file holds instead."""
    import json

    try:
        with path.open("rb") as fh:
            obj = json.loads(fh.read(64 * 2**20))
    except (OSError, ValueError) as exc:
        return f"not JSON ({type(exc).__name__})"
    schema = obj.get("schema") if isinstance(obj, dict) else None
    if isinstance(schema, str) and schema.startswith("eaglelab.bench/"):
        return None
    return f'JSON without "schema": "eaglelab.bench/..." ({type(obj).__name__})'


def _corpus_out(args: argparse.Namespace) -> None:
    """prompts and synthesize write DIR/prompts.jsonl.gz and DIR/manifest.json: an earlier corpus there is kept
    unless --force (the user may have spent hours synthesizing it)."""
    check_output_dir(args.out, "--out")
    out = Path(args.out)
    held = [n for n in ("prompts.jsonl.gz", "manifest.json") if (out / n).exists()]
    if held and not args.force:
        raise EagleLabError("already holds a prompt corpus: refusing to overwrite it", file=out / held[0], field="--out",
                            found=", ".join(held), expected="a new directory, or one without prompts.jsonl.gz and manifest.json",
                            hint="pick another --out, or pass --force to replace this corpus")


def _appended_record(args: argparse.Namespace) -> None:
    """tune writes --record as it measures, appending as RecordWriter does."""
    if args.record:
        from eaglelab.probes.record import check_record_output

        check_record_output(args.record, mode="append")


def _train_out(args: argparse.Namespace) -> None:
    check_output_dir(args.out, "--out")
    out = Path(args.out)
    if not out.is_dir():
        return
    ours = {"config.json", "model.safetensors", "eaglelab_training.json", "checkpoints", TRAIN_STAGING}
    foreign = sorted(p.name for p in out.iterdir() if p.name not in ours)  # a user's *.safetensors would mix in
    if foreign:
        raise EagleLabError("holds files that are not a drafter's", file=out, field="--out",
                            found=", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else ""),
                            expected="a new directory, or one an earlier `eaglelab train` wrote",
                            hint="pick a new directory: train writes config.json and model.safetensors there")
    if ((out / "config.json").exists() or (out / "model.safetensors").exists()) and not (out / "eaglelab_training.json").exists():
        raise EagleLabError("holds a drafter that `eaglelab train` did not write", file=out, field="--out",
                            found="config.json / model.safetensors without eaglelab_training.json",
                            expected="a new directory, or one an earlier `eaglelab train` wrote",
                            hint="pick a new directory: training would overwrite this drafter")


TRAIN_STAGING = ".eaglelab-partial"  # where train writes the drafter before checking it (see training_jobs.save)


OUTPUT_CHECKS: dict[str, tuple[Callable[[argparse.Namespace], None], ...]] = {
    "run": (_record_output, _dir_output("tensorboard")),
    "trace": (_dir_output("logdir"),),
    "capture": (_dir_output("out"),),
    "train": (_train_out, _dir_output("tensorboard"), _dir_output("checkpoint_dir")),
    "prompts": (_corpus_out,),
    "synthesize": (_corpus_out,),
    "tune": (_appended_record, _file_output("json")),
    "bench": (_bench_json,),
    "distill": (_dir_output("out"),),
}


# ---- values that only make sense together ---------------------------------------------------------------


def _run_prompt(args: argparse.Namespace) -> None:
    if args.raw and not args.prompt:
        raise EagleLabError("is empty: with --raw there is nothing to feed the model", field="PROMPT", found='""',
                            hint="give a prompt, or drop --raw to send an empty user message through the chat template")


def _train_init_from(args: argparse.Namespace) -> None:
    """--init-from is read after the data and the target loaded: a wrong path is refused before that."""
    if args.init_from:
        from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint

        read_draft_checkpoint(args.init_from)


COMMAND_CHECKS: dict[str, tuple[Callable[[argparse.Namespace], None], ...]] = {
    "run": (_run_prompt,),
    "train": (_train_init_from,),
}
