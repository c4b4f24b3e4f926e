"""`eaglelab.compare` (the incident examples' side-by-side runs): one runner for all the prompts of a measurement,
so a GPU run captures its graphs once, not once a prompt; the rows still hold each prompt's own run."""

from __future__ import annotations

import argparse

from eaglelab.compare import measure, plain_baseline
from eaglelab.engine.runtime.runner import EagerRunner
from eaglelab.session import add_engine_args, build_session


def test_a_measurement_builds_one_runner_for_all_its_prompts(tiny_dir):
    p = argparse.ArgumentParser()
    add_engine_args(p)
    session = build_session(p.parse_args(["--model", str(tiny_dir), "--device", "cpu", "--draft", "ngram"]),
                            log=lambda m: None)
    made: list[tuple] = []

    def factory(spec, drafter):  # stands in for the CUDA-graph runner factory a GPU session has
        made.append(spec.enabled)
        return EagerRunner(session.target.model, None)

    session.runner_factory = factory
    prompts = [[1, 5, 9, 4], [2, 7, 3], [8, 6, 5, 4, 3]]
    base = plain_baseline(session, prompts, 6)
    assert made == [False]
    row = measure(session, "ngram", session.spec, session.drafter, prompts, 6, base)
    assert made == [False, True]
    assert row.identical_to_plain and row.output_difference is None and len(base.tokens) == 3


def test_the_table_says_where_a_bf16_run_parted_from_plain_greedy(tiny_dir):
    """The `output` row shows the output check's text (as `run`'s summary does), not a bare "DIFFERS"."""
    from dataclasses import replace

    from rich.console import Console

    from eaglelab.compare import output_difference, table

    p = argparse.ArgumentParser()
    add_engine_args(p)
    session = build_session(p.parse_args(["--model", str(tiny_dir), "--device", "cpu", "--draft", "ngram"]),
                            log=lambda m: None)
    prompts = [[1, 5, 9, 4]]
    base = plain_baseline(session, prompts, 6)
    row = measure(session, "ngram", session.spec, session.drafter, prompts, 6, base)
    text, _ = output_difference([[1, 2, 9]], [[1, 2, 3]], "bfloat16", 4)
    parted = replace(row, label="parted", output_difference=text)
    assert not parted.identical_to_plain
    console = Console(width=400, record=True)
    console.print(table([row, parted], "t"))
    shown = console.export_text()
    assert "identical to plain greedy" in shown and "the first 2 of 3 tokens match" in shown
