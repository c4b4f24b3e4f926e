"""Incident 2 replayed on a Kimi-K2.5-shaped pair: an MLA drafter trained by eaglelab, served four ways.

From the directory ``benchmarks/kimi_target.py --out DIR`` writes (``DIR/target``, ``DIR/train_prompts.jsonl``,
``DIR/heldout_prompts.jsonl``), this script

1. distills the target's own answers to the training prompts and trains an MLA EAGLE-3 drafter on them with the
   real CLI (``eaglelab distill``, then ``eaglelab train --online --layout mla`` for ``--train-s`` seconds), at
   SpecForge's default aux ids for the target's depth (= SGLang's default taps, ``hs[2, L//2, L-3]``), written in
   SGLang's ``Eagle3DeepseekV2ForCausalLM`` layout;
2. serves it four ways, as ``examples/incident_wiring.py`` does for SmolLM2: healthy; the embedding tap added
   (SGLang id -1 pushed in, the deepest tap pushed out); off by one (every id + 1); the healthy config read with
   vLLM's convention (ids as layer inputs). Each is measured against plain greedy decoding of the held-out prompts
   in the same process: mean accepted length, accept rate, tok/s, speedup; the healthy one must reproduce plain
   greedy decoding token for token (float32 by default, so that holds exactly);
3. runs ``eaglelab check-wiring`` on each served config three ways: static (``--no-search``), against a little
   data captured from the target (``--data``), and the data-free tap search (``--target``, on the held-out texts);
   reads its ``--json`` object: exit code, verdict, conclusion, fix and the taps the search recovered;
4. writes ``DIR/incident2.json`` and prints a markdown table.

The CLI steps run in this process (``eaglelab.cli.main``: the same parser and code as the shell command, without
a Python start-up and a target load per step); their own progress lines go to stderr.

    PYTHONPATH=. python benchmarks/kimi_incident.py --work DIR --device cuda        # ~4.5 min on one H200
    PYTHONPATH=. python benchmarks/kimi_incident.py --work DIR --small --device cpu # tiny target: a CPU test

Everything goes under ``DIR/incident2/`` (the script's own folder). A drafter trained there after the target was
written is reused (the serving and checks run again); ``--retrain``, or a newer target, trains afresh (the folder is
emptied first).
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import sys
import time
from contextlib import redirect_stdout
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from examples.incident_wiring import IDS_FIELD, Served, config_copy, served_taps

MODES = ("static", "data", "search")
EXIT_MEANING = {0: "ok", 1: "wrong", 2: "could not check", 4: "inconclusive"}  # check-wiring's documented codes


@dataclass(frozen=True)
class Sizes:
    """How much of everything one run does (the GPU defaults, or ``--small``)."""

    distill_prompts: int
    distill_tokens: int
    train_batch: int
    train_max_steps: int | None  # None: --train-steps (the LR schedule's length) or --time-limit stops training
    draft_vocab: int
    prompts: int  # held-out prompts measured (and scored by the tap search: at least 6 for its verdict)
    max_new_tokens: int
    capture_prompts: int
    capture_tokens: int


GPU = Sizes(distill_prompts=4096, distill_tokens=128, train_batch=16, train_max_steps=None, draft_vocab=8192,
            prompts=8, max_new_tokens=96, capture_prompts=4, capture_tokens=48)
SMALL = Sizes(distill_prompts=24, distill_tokens=16, train_batch=4, train_max_steps=4, draft_vocab=64,
              prompts=8, max_new_tokens=8, capture_prompts=2, capture_tokens=8)


@dataclass(frozen=True)
class CheckRun:
    """One ``eaglelab check-wiring`` run on one served config."""

    mode: str  # "static" | "data" | "search"
    argv: list[str]
    exit_code: int
    verdict: str  # the JSON's "ok" | "mismatch" | "inconclusive" | "error" ("no JSON" when it printed none)
    conclusion: str  # why, in the command's words (an error's message)
    fix: dict[str, Any] | None  # the first change it proposes: {"file", "field", "current", "new"}
    found_hf: list[int] | None  # search: the taps under which the drafter predicts the target best
    found_sglang_ids: list[int] | None  # the same, as the search writes them in SGLang ids


def main(argv: list[str] | None = None) -> dict:
    """Run the whole replay; returns what ``DIR/incident2.json`` holds."""
    args = _args(argv)
    sizes = SMALL if args.small else GPU
    work = Path(args.work)
    target, heldout = _inputs(work)
    out = work / "incident2"
    started = time.perf_counter()
    drafter, training = train_drafter(args, sizes, target, work / "train_prompts.jsonl", out)
    session = _session(args, sizes, target, drafter)
    tok = session.target.tokenizer
    prompt_texts = _heldout_texts(heldout, args.prompts or sizes.prompts)
    prompts = [tok.chat_ids(p) for p in prompt_texts]
    served = serve_four_ways(drafter, out / "served")
    rows, baseline = measure_all(session, served, prompts, args.max_new_tokens or sizes.max_new_tokens)
    if rows[0].output_difference:  # in float32 an alarm (compare.output_difference says so); in bf16 a note
        _say(f"healthy: {rows[0].output_difference}")
    texts = write_texts(out / "texts.jsonl", prompt_texts, baseline.tokens, tok)
    data = capture_data(args, sizes, target, texts, out / "data")
    checks = {s.label: [check(s, mode, args, target, data, texts) for mode in MODES] for s in served}
    result = record(args, sizes, target, drafter, training, session, served, rows, baseline, checks,
                    time.perf_counter() - started)
    (work / "incident2.json").write_text(json.dumps(result, indent=2))
    print(markdown(result))
    print(f"\nwrote {work / 'incident2.json'}", file=sys.stderr)
    return result


# ---- 1. distill and train ------------------------------------------------------------------------------


def train_drafter(args: argparse.Namespace, sizes: Sizes, target: Path, prompts: Path, out: Path) -> tuple[Path, dict]:
    """The target's greedy answers (``eaglelab distill``), then ``eaglelab train --online --layout mla`` on them for
    ``--train-s`` seconds at SpecForge's default ids; a drafter already there is reused unless ``--retrain``."""
    drafter = out / "drafter"
    fresh = (drafter / "config.json").is_file() and (drafter / "config.json").stat().st_mtime > (
        target / "config.json").stat().st_mtime
    if fresh and not args.retrain:
        _say(f"reusing the drafter trained before: {drafter} (--retrain trains it again)")
        return drafter, _training_record(drafter, reused=True)
    if out.is_dir():  # this script's own folder: a drafter, data and distill shards of an older target or run
        shutil.rmtree(out)
    distill = out / "distill"
    cli(["distill", "--prompts", str(prompts), "--out", str(distill), "--model", str(target),
         "--limit", str(sizes.distill_prompts), "--max-new-tokens", str(sizes.distill_tokens),
         "--batch-size", "512", "--device", args.device])
    total = sizes.train_max_steps or args.train_steps  # the LR schedule's length: --time-limit may stop it before
    cli(["train", "--online", "--data", str(distill), "--model", str(target), "--layout", "mla", "--out", str(drafter),
         "--checkpoint-dir", str(out / "train_checkpoints"), "--checkpoint-every", "1000000", "--seed", "0", "--time-limit", str(args.train_s), "--epochs", "1000", "--total-steps", str(total),
         "--warmup-ratio", "0.02", "--lr", str(args.lr),
         "--batch-size", str(sizes.train_batch), "--max-length", "512", "--draft-vocab-size", str(sizes.draft_vocab),
         "--log-every", "20", "--device", args.device])
    return drafter, _training_record(drafter, reused=False)


def _training_record(drafter: Path, reused: bool) -> dict:
    """What the drafter's own eaglelab_training.json says about its training, and its ids and architecture."""
    config = json.loads((drafter / "config.json").read_text())
    record = {"dir": str(drafter), "reused": reused, "architectures": config.get("architectures"),
              "sglang_ids": config["eagle_config"][IDS_FIELD]}
    prov = drafter / "eaglelab_training.json"
    if prov.is_file():
        record["training"] = json.loads(prov.read_text())
    return record


# ---- 2. serve four ways, measure ------------------------------------------------------------------------


def serve_four_ways(draft_dir: Path, work: Path) -> list[Served]:
    """The trained config (SGLang), the embedding added (SGLang), every id + 1 (SGLang), the trained config read
    by vLLM. The served copies link the trained weights: only the ids (or the engine reading them) change."""
    config = json.loads((draft_dir / "config.json").read_text())
    ids = list(config["eagle_config"][IDS_FIELD])

    def with_ids(new: list[int], name: str) -> Path:
        edited = json.loads(json.dumps(config))
        edited["eagle_config"][IDS_FIELD] = new
        return config_copy(draft_dir, work / name, edited)

    embedded, shifted = [-1, *ids[:-1]], [i + 1 for i in ids]  # fc takes 3 states: the deepest one drops out
    return [
        Served("healthy", draft_dir, "sglang"),
        Served("embedding tap added", with_ids(embedded, "embedding"), "sglang"),
        Served("off by one", with_ids(shifted, "off_by_one"), "sglang"),
        Served("read by vLLM", draft_dir, "vllm"),
    ]


def _session(args: argparse.Namespace, sizes: Sizes, target: Path, drafter: Path) -> Any:
    """The target and the trained drafter, loaded as ``eaglelab run`` loads them: a chain of ``--steps`` drafts
    (SGLang's DeepSeek default: 3 steps, top-1, 4 tokens verified), CUDA graphs on CUDA, no torch.compile."""
    from eaglelab.session import add_engine_args, build_session

    p = argparse.ArgumentParser()
    add_engine_args(p)
    ns = p.parse_args(["--model", str(target), "--draft", str(drafter), "--device", args.device, "--dtype", args.dtype,
                       "--steps", str(args.steps), "--topk", "1", "--draft-tokens", str(args.steps + 1), "--no-compile",
                       "--max-new-tokens", str(args.max_new_tokens or sizes.max_new_tokens)])
    return build_session(ns, log=_say)


def measure_all(session: Any, served: list[Served], prompts: list[list[int]], max_new_tokens: int) -> tuple[list, Any]:
    """Plain greedy decoding of the prompts, then each served config against it, in this process."""
    from eaglelab.compare import measure, plain_baseline
    from eaglelab.engine.runtime.drafters import Eagle3Drafter

    baseline = plain_baseline(session, prompts, max_new_tokens)
    _say(f"plain greedy: {baseline.tokens_per_s:.1f} tok/s over {len(prompts)} prompts")
    net = session.drafter.net  # the trained weights; only what the serving engine taps changes
    rows = []
    for s in served:
        taps = served_taps(s, session.target.config.num_layers)
        row = measure(session, s.label, session.spec, Eagle3Drafter(net, session.spec, taps), prompts,
                      max_new_tokens, baseline)
        _say(f"{s.label}: taps hs{list(taps)}, accepted length {_fmt(row.accept_len)}, "
             f"{row.tokens_per_s:.1f} tok/s ({row.tokens_per_s / row.plain_tokens_per_s:.2f}x)")
        rows.append(row)
    return rows, baseline


# ---- 3. check-wiring --------------------------------------------------------------------------------------


def write_texts(path: Path, prompts: list[str], answers: list[list[int]], tok: Any) -> Path:
    """The held-out prompts with the target's own greedy answers: the texts the search scores, the data's prompts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"prompt": p, "response": tok.decode(a)}) for p, a in zip(prompts, answers)]
    path.write_text("\n".join(lines) + "\n")
    return path


def capture_data(args: argparse.Namespace, sizes: Sizes, target: Path, texts: Path, out: Path) -> Path:
    """SpecForge-format data from the target at the default ids: what ``check-wiring --data`` matches slots against."""
    if not (out / "manifest.json").is_file():
        cli(["capture", "--model", str(target), "--out", str(out), "--prompts-file", str(texts),
             "--prompts", str(sizes.capture_prompts), "--max-new-tokens", str(sizes.capture_tokens),
             "--max-length", "512", "--batch-size", str(sizes.capture_prompts), "--draft-vocab-size",
             str(sizes.draft_vocab), "--device", args.device, "--dtype", args.dtype])
    return out


def check(s: Served, mode: str, args: argparse.Namespace, target: Path, data: Path, texts: Path) -> CheckRun:
    """``eaglelab check-wiring ... --json`` on one served config, as a user would run it; its JSON object is read."""
    argv = ["check-wiring", str(s.config_dir), "--target", str(target), "--serving", s.serving, "--json"]
    argv += {"static": ["--no-search"],
             "data": ["--data", str(data), "--device", args.device, "--dtype", args.dtype, "--max-tokens", "64"],
             "search": ["--texts", str(texts), "--samples", str(len(texts.read_text().splitlines())),
                        "--device", args.device, "--dtype", args.dtype]}[mode]
    rc, text = cli(argv, capture=True)
    run = read_check(mode, argv, rc, text)
    _say(f"check-wiring {mode:6s} {s.config_dir.name} --serving {s.serving}: exit {rc}; {run.verdict}"
         + (f"; search found hs{run.found_hf}" if run.found_hf else ""))
    return run


def read_check(mode: str, argv: list[str], rc: int, stdout: str) -> CheckRun:
    """One run from the object ``check-wiring --json`` prints (its stdout's last line): the verdict, the conclusion
    (an error's message), the first fix (the search's own, or the data/static report's first of ``fixes``), and
    for the search its best taps (``best_hf_indices``, and ``expected_ids`` in SGLang ids). Output that is not
    such an object (an internal error's exit) is kept as verdict "no JSON" with its last line."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    try:
        out = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        out = None
    if not isinstance(out, dict) or "verdict" not in out:
        return CheckRun(mode, argv, rc, "no JSON", lines[-1].strip() if lines else f"(exit {rc}, no output)",
                        None, None, None)
    fix = out.get("fix") or next(iter(out.get("fixes") or ()), None)
    found = out.get("best_hf_indices")
    return CheckRun(mode, argv, rc, out["verdict"], out.get("conclusion") or out.get("error") or "",
                    None if fix is None else {k: fix[k] for k in ("file", "field", "current", "new")},
                    found, out["expected_ids"]["sglang"] if found is not None else None)


# ---- 4. the record -------------------------------------------------------------------------------------------


def record(args, sizes, target, drafter, training, session, served, rows, baseline, checks, seconds) -> dict:
    """Everything measured, as one JSON-ready dict."""
    from eaglelab.engine.formats.conventions import hf_indices_to_ids, ids_for_engine

    num_layers = session.target.config.num_layers
    summary = target.parent / "target_summary.json"
    configs = []
    for s, row in zip(served, rows):
        ids, _ = ids_for_engine(json.loads((s.config_dir / "config.json").read_text()), s.serving)
        hf = list(served_taps(s, num_layers))
        runs = checks[s.label]
        configs.append({
            "label": s.label, "config_dir": str(s.config_dir), "serving": s.serving, "config_ids": list(ids or ()),
            "hf_indices": hf, "sglang_ids": list(hf_indices_to_ids(hf, "sglang")),
            "accept_len": row.accept_len, "accept_rate": row.accept_rate, "tokens_per_s": row.tokens_per_s,
            "plain_tokens_per_s": row.plain_tokens_per_s, "speedup": row.tokens_per_s / row.plain_tokens_per_s,
            "verify_graph": row.verify_graph, "identical_to_plain": row.identical_to_plain,
            "output_difference": row.output_difference, "cause": row.cause, "verdicts": list(row.verdicts),
            "check_wiring": {r.mode: asdict(r) | {"meaning": EXIT_MEANING.get(r.exit_code, "?")} for r in runs},
            "search_found_hf": runs[MODES.index("search")].found_hf,
            "search_found_sglang_ids": runs[MODES.index("search")].found_sglang_ids,
        })
    return {
        "target": {"dir": str(target), "architecture": session.target.config.architecture, "num_layers": num_layers,
                   "hidden_size": session.target.config.hidden_size, "vocab_size": session.target.config.vocab_size,
                   "notes": list(session.notes),
                   "summary": json.loads(summary.read_text()) if summary.is_file() else None},
        "drafter": training,
        "settings": {"device": session.device_label, "dtype": session.dtype_name, "small": args.small,
                     "train_s": args.train_s, "steps": args.steps, "topk": 1, "draft_tokens": args.steps + 1,
                     "prompts": len(baseline.tokens), "max_new_tokens": args.max_new_tokens or sizes.max_new_tokens,
                     "cuda_graphs": session.spec.cuda_graphs, "compile": session.spec.compile},
        "plain": {"tokens_per_s": baseline.tokens_per_s, "decode_ms": baseline.decode_ms},
        "configs": configs,
        "seconds": seconds,
        "command": "PYTHONPATH=. python benchmarks/kimi_incident.py " + " ".join(sys.argv[1:] if args.argv is None
                                                                                 else args.argv),
    }


def markdown(result: dict) -> str:
    """The table the docs take: one row per served config."""
    s = result["settings"]
    head = (f"Incident 2 on a {result['target']['num_layers']}-layer {result['target']['architecture']} target, MLA "
            f"drafter, {s['device']} {s['dtype']}, chain of {s['steps']}, {s['prompts']} held-out prompts x "
            f"{s['max_new_tokens']} tokens; plain {result['plain']['tokens_per_s']:.1f} tok/s\n\n")
    cols = ("config", "served ids (engine)", "taps: SGLang ids / hs", "accept len", "accept rate", "tok/s", "speedup",
            "check-wiring exit static / --data / search", "search found (SGLang ids / hs)")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for c in result["configs"]:
        cw = c["check_wiring"]
        found = "-" if c["search_found_hf"] is None else f"{c['search_found_sglang_ids']} / hs{c['search_found_hf']}"
        lines.append("| " + " | ".join([
            c["label"],
            f"{c['config_ids']} ({c['serving']})", f"{c['sglang_ids']} / hs{c['hf_indices']}",
            _fmt(c["accept_len"]), _fmt(c["accept_rate"], "{:.0%}"), f"{c['tokens_per_s']:.1f}",
            f"{c['speedup']:.2f}x", " / ".join(str(cw[m]["exit_code"]) for m in MODES), found]) + " |")
    return head + "\n".join(lines)


# ---- plumbing ---------------------------------------------------------------------------------------------


def cli(argv: list[str], capture: bool = False) -> Any:
    """``eaglelab ARGV`` in this process. Without ``capture`` a failure stops the run (exit 2, the CLI's message
    already printed); with it, (exit code, stdout) comes back."""
    from eaglelab.cli import main as eaglelab

    _say("$ eaglelab " + " ".join(argv))
    if not capture:
        rc = eaglelab(argv)
        if rc != 0:
            raise SystemExit(f"`eaglelab {argv[0]}` failed (exit {rc}): see its message above")
        return rc
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = eaglelab(argv)
    return rc, buf.getvalue()


def _inputs(work: Path) -> tuple[Path, Path]:
    """DIR/target and DIR/heldout_prompts.jsonl (and train_prompts.jsonl), or an exit naming what is missing."""
    need = {"target/config.json": "the target (HF directory)", "train_prompts.jsonl": "the training prompts",
            "heldout_prompts.jsonl": "the held-out prompts"}
    for rel, what in need.items():
        if not (work / rel).is_file():
            raise SystemExit(f"error: {work / rel}: no such file ({what}); write DIR with "
                             f"`python benchmarks/kimi_target.py --out {work}` first")
    return work / "target", work / "heldout_prompts.jsonl"


def _heldout_texts(path: Path, n: int) -> list[str]:
    from eaglelab.engine.training.prompt_corpus import read_corpus

    texts = [r["prompt"] for r in read_corpus(path)][:n]
    if len(texts) < 6:
        raise SystemExit(f"error: {path}: {len(texts)} prompts; the tap search needs at least 6 texts")
    return texts


def _fmt(x: float | None, spec: str = "{:.2f}") -> str:
    return "-" if x is None else spec.format(x)


_T0 = time.perf_counter()


def _say(msg: str) -> None:
    print(f"[kimi_incident {time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True, metavar="DIR", help="benchmarks/kimi_target.py's --out")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="float32",
                   help="serving and check dtype (default float32: speculation must equal plain greedy token for token)")
    p.add_argument("--train-s", type=float, default=120.0, help="drafter training budget in seconds (default 120)")
    p.add_argument("--train-steps", type=int, default=2000,
                   help="the LR schedule's length in steps (cosine to 0 there); --train-s stops it sooner (default 2000)")
    p.add_argument("--lr", type=float, default=3e-4, help="drafter learning rate (default 3e-4: a short run)")
    p.add_argument("--steps", type=int, default=3, help="draft steps per cycle, a chain (default 3)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per held-out prompt (default 96; 8 --small)")
    p.add_argument("--prompts", type=int, default=None, help="held-out prompts measured and searched (default 8; >= 6)")
    p.add_argument("--retrain", action="store_true", help="train again even if DIR/incident2/drafter exists")
    p.add_argument("--small", action="store_true", help="a tiny target on the CPU: a few training steps, 8 tokens")
    args = p.parse_args(argv)
    args.argv = argv
    if args.small:  # a tiny target's matrices: one thread beats several (16x on a busy 2-core machine)
        import torch

        torch.set_num_threads(1)
    if args.device == "auto":
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


if __name__ == "__main__":
    main(sys.argv[1:])
