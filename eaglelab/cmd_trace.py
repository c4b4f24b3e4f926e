"""``eaglelab trace --logdir DIR [run options] PROMPT``: a torch.profiler trace of one run.

Each phase of the loop is a ``record_function`` range named as the events name it (``prefill``,
``decode``, ``draft``, ``verify``, ``accept``, ``draft_extend``). The trace is written by
``tensorboard_trace_handler``; TensorBoard shows it through its PyTorch profiler plugin
(``torch-tb-profiler``, a dependency: Overview, Operator and Trace views of DIR); it opens in Perfetto /
chrome://tracing, and carries ``distributedInfo`` so Holistic Trace Analysis accepts it.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import json
from pathlib import Path

from eaglelab.session import add_engine_args, build_session


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="write a torch.profiler trace of one run, a range per phase",
                       description="Profile one generation; open the trace in Perfetto, TensorBoard or HTA.")
    p.add_argument("prompt")
    p.add_argument("--logdir", required=True, help="where the trace goes (tensorboard --logdir DIR)")
    add_engine_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

    err = Console(stderr=True, highlight=False)
    session = build_session(args, log=lambda m: err.print(f"[dim]{m}[/]"))
    ids = session.target.tokenizer.chat_ids(args.prompt)
    from eaglelab.engine.runtime.limits import check_context

    check_context(session.target.config, len(ids), args.max_new_tokens)  # before the profiler starts
    bus, finish = session.observer(always=True)  # an observer turns the per-phase ranges on
    engine = session.engine(observer=bus)
    logdir = Path(args.logdir)
    logdir.mkdir(parents=True, exist_ok=True)
    before = set(logdir.glob("*.json*"))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if session.target.device.type == "cuda" else [])
    with profile(activities=activities, on_trace_ready=tensorboard_trace_handler(str(logdir)), record_shapes=False):
        result = engine.generate([ids], args.max_new_tokens, session.sampling, session.generator())
    finish()
    written = sorted(set(logdir.glob("*.json*")) - before)
    for path in written:
        add_distributed_info(path, rank=0, world_size=session.target.model.tp.world_size if session.target.model.tp else 1)
    err.print(f"{result.generated_tokens} tokens, {result.tokens_per_second:.1f} tok/s (profiler on)")
    for path in written:
        err.print(f"trace: {path}  (Perfetto: ui.perfetto.dev; tensorboard --logdir {logdir}, PYTORCH_PROFILER tab)")
    if written and importlib.util.find_spec("torch_tb_profiler") is None:
        err.print("[yellow]TensorBoard shows this trace only with its PyTorch profiler plugin, which is not installed "
                  "here: pip install torch-tb-profiler (Perfetto opens the file as is)[/]")
    return 0 if written else 1


def add_distributed_info(path: Path, rank: int, world_size: int) -> None:
    """Make sure the trace names its rank (HTA groups traces by ``distributedInfo.rank``)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        trace = json.load(f)
    if "distributedInfo" not in trace:
        trace["distributedInfo"] = {"backend": "none", "rank": rank, "world_size": world_size}
        with opener(path, "wt") as f:
            json.dump(trace, f)
