"""``eaglelab prompts``: build the training prompts offline, never from the benchmarks.

Mixes conversational requests of the eight chat kinds (writing, role-play, reasoning, maths, coding,
extraction, STEM, humanities; the largest share), self-instruct seed topics, templated tasks, Python's
reference manual and the docstrings of the standard library and installed packages; deduplicates them; drops every prompt that shares a 13-word
window with an MT-bench question or a HumanEval problem. Writes DIR/prompts.jsonl.gz and
DIR/manifest.json (sources, counts, the overlap check). The answers come later, from the target
itself: ``eaglelab distill``.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``prompts`` subcommand."""
    p = subparsers.add_parser(
        "prompts", help="build training prompts offline (deduplicated, never MT-bench or HumanEval)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--out", required=True, metavar="DIR", help="where prompts.jsonl.gz and manifest.json go")
    p.add_argument("--force", action="store_true", help="replace a corpus already in --out (refused without it)")
    p.add_argument("--count", type=int, default=50_000, metavar="N", help="number of prompts (default 50000)")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build and write the prompts; 0 on success."""
    from rich.console import Console

    from eaglelab.engine.training import prompt_corpus as pc

    console = Console(stderr=True, highlight=False)
    with console.status("reading the evaluation sets (MT-bench, HumanEval) for the overlap check ..."):
        overlap = pc.OverlapIndex.from_texts(pc.evaluation_texts())
    with console.status("importing the standard library and installed packages for their docstrings ...") as st:
        pc._doc_entries()
        corpus = pc.build_corpus(args.count, overlap, seed=args.seed,
                                 progress=lambda n: st.update(f"picked {n}/{args.count} prompts ..."))
    path = pc.write_corpus(corpus, args.out, overlap, extra={"packages": pc.package_versions()})
    console.print(f"wrote {len(corpus.prompts)} prompts to {path} ({path.stat().st_size / 2**20:.1f} MiB)")
    console.print("  by source: " + ", ".join(f"{k} {v}" for k, v in corpus.counts.items()))
    console.print(f"  removed {corpus.duplicates} duplicates and "
                  f"{sum(corpus.overlaps.values())} prompts overlapping {' / '.join(overlap.names)}")
    return 0
