"""The prompt sets ``eaglelab bench --figures`` measures: every MT-bench first turn, one set per category, and
held-out code prompts (HumanEval's, evenly spread). Both are evaluation sets only: ``eaglelab prompts`` and
``eaglelab synthesize`` drop any training prompt sharing a 13-word window with either.

Example: with the packaged question.jsonl, :func:`figure_sets` gives eight sets of 10 (writing, roleplay,
reasoning, math, coding, extraction, stem, humanities, in the file's order) and one ``code`` set of
``code_prompts`` HumanEval problems, each asked as "Complete this Python function:" and the problem's prompt.
"""

from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

CODE_PREFIX = "Complete this Python function:\n\n"  # as benchmarks/drafter_acceptance.py asks HumanEval
CODE_SET = "code"


@dataclass(frozen=True)
class PromptSet:
    """Prompts measured together and reported as one line: ``kind`` is "category" (an MT-bench category; the
    categories together make MT-bench as a whole) or "code"."""

    name: str
    kind: str
    texts: tuple[str, ...]


def mtbench_categories(questions_file: str | Path | None = None) -> list[PromptSet]:
    """Every MT-bench first turn, one set per category, in the order the file first names each category."""
    from eaglelab.bench.harness import mtbench_questions

    by: dict[str, list[str]] = {}
    for turn, category in mtbench_questions(10**9, questions_file):  # n beyond the file: every question
        by.setdefault(category, []).append(turn)
    return [PromptSet(c, "category", tuple(ts)) for c, ts in by.items()]


def humaneval_prompts(n: int, problems_file: str | Path | None = None) -> list[str]:
    """``n`` HumanEval problems spread evenly over the file (all of them when ``n`` is larger), as code requests."""
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.engine.formats.assets import HUMANEVAL_PROBLEMS, asset_path

    path = Path(problems_file) if problems_file else asset_path(HUMANEVAL_PROBLEMS)
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            probs = [str(json.loads(line)["prompt"]) for line in f if line.strip()]
    except (OSError, EOFError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise EagleLabError(f"not a HumanEval problems file ({type(exc).__name__}: {exc})", file=path,
                            expected='gzip JSON lines, each with a "prompt" field',
                            hint="pass --humaneval HumanEval.jsonl.gz, or leave it out for the packaged one") from None
    if not probs:
        raise EagleLabError("no problems", file=path, expected='gzip JSON lines, each with a "prompt" field')
    n = max(1, min(n, len(probs)))
    return [CODE_PREFIX + probs[i * len(probs) // n] for i in range(n)]


def figure_sets(questions_file: str | Path | None = None, code_prompts: int = 40,
                problems_file: str | Path | None = None) -> list[PromptSet]:
    """The MT-bench categories, then the code set (none when ``code_prompts`` is 0)."""
    sets = mtbench_categories(questions_file)
    if code_prompts > 0:
        sets.append(PromptSet(CODE_SET, "code", tuple(humaneval_prompts(code_prompts, problems_file))))
    return sets


def add_figures_args(group: argparse._ArgumentGroup) -> None:
    """The flags of ``--figures`` (a hook in ``eaglelab bench``)."""
    group.add_argument("--figures", action="store_true",
                       help="speculative vs plain (as `run` decodes here) on every MT-bench first turn per category "
                            "and on held-out HumanEval code prompts, per batch size, with issue 40's goals marked "
                            "met / not met; --json OUT also writes OUT's .md table (default batch sizes 1,8,32)")
    group.add_argument("--code-prompts", type=int, default=40, metavar="N",
                       help="with --figures: HumanEval problems in the code set, spread evenly (0: no code set)")
    group.add_argument("--humaneval", default=None, metavar="FILE",
                       help="with --figures: a HumanEval.jsonl.gz (default: the packaged one)")
