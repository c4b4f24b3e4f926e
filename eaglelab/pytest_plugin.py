"""pytest fixtures for guarding EAGLE-3 drafters in other projects' test suites.

Registered through the ``pytest11`` entry point, so installing eaglelab makes them available::

    def test_my_drafter_is_lossless(eaglelab_spec_run):
        run = eaglelab_spec_run(["Name three rivers."], draft="path/to/drafter", max_new_tokens=32)
        assert run.identical_to_plain          # greedy speculation changed nothing
        assert run.mean_accept_len >= 2.0      # and it still accepts enough

    def test_my_drafter_wiring(eaglelab_check_wiring):
        report = eaglelab_check_wiring("path/to/drafter", data="path/to/specforge_data")
        assert report["verdict"] == "ok", report

    @pytest.mark.eaglelab_acceptance(draft="default", baseline="acceptance/smollm2.json")
    def test_my_drafter_still_accepts(eaglelab_acceptance):
        eaglelab_acceptance()   # fails with a figure-by-figure diff when acceptance regressed

``draft`` takes what ``eaglelab run --draft`` takes: "default", "ngram" or a drafter directory.
``--eaglelab-update-baseline`` (re)writes baselines; a missing baseline is written on first run.

Nothing heavy is imported until a fixture is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("eaglelab")
    group.addoption("--eaglelab-model", default="default", help="target model for eaglelab fixtures")
    group.addoption("--eaglelab-device", default="cpu", help="device for eaglelab fixtures")
    group.addoption("--eaglelab-update-baseline", action="store_true",
                    help="write the measured acceptance as the new baseline instead of comparing")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "eaglelab_acceptance(baseline, draft='default', prompts=None, steps=None, topk=None, draft_tokens=None, "
        "max_new_tokens=32, tolerance=0.05, mean_tolerance=0.1): settings for the eaglelab_acceptance fixture "
        "(tree settings left None: eaglelab run's defaults)",
    )


@dataclass
class SpecRun:
    """The outcome of one speculative run and its plain-decoding baseline."""

    tokens: list[list[int]]
    plain_tokens: list[list[int]]
    mean_accept_len: float | None
    accept_lens: list[list[int]]
    events: list[Any] = field(default_factory=list)

    @property
    def identical_to_plain(self) -> bool:
        return self.tokens == self.plain_tokens


@pytest.fixture(scope="session")
def eaglelab_target(pytestconfig: pytest.Config):
    """The target model named by --eaglelab-model (float32), loaded once per session."""
    from eaglelab.engine.formats.loader import load_target

    return load_target(pytestconfig.getoption("--eaglelab-model"), device=pytestconfig.getoption("--eaglelab-device"))


def drafter_for(target, model: str, draft: str, steps: int | None = None, topk: int | None = None,
                draft_tokens: int | None = None, attention_mode: str = "decode", batch: int = 1):
    """(spec, drafter) for a ``--draft``-style name ("default" | "ngram" | a drafter directory), from the drafter
    registry that ``eaglelab run`` asks; steps/topk/draft_tokens left None take its tree defaults (the device
    profile's tree for ``batch`` rows where the drafter has one for this device and dtype)."""
    from eaglelab.devices import profile_device
    from eaglelab.draft_registry import TreeFlags, Where, choose_drafter

    where = Where(profile_device(target.device), str(target.dtype).replace("torch.", ""), batch)
    choice = choose_drafter(draft, model, target.model, TreeFlags(steps, topk, draft_tokens),
                            modes=dict(attention_mode=attention_mode), field="draft", where=where)
    if choice.kind == "none":
        raise ValueError("draft='none' measures nothing: name a drafter ('default', 'ngram' or a directory)")
    return choice.spec, choice.drafter()


@pytest.fixture
def eaglelab_spec_run(eaglelab_target, pytestconfig: pytest.Config) -> Callable[..., SpecRun]:
    """Run prompts greedily with a drafter and without, on the same target; record the events."""
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.probes.bus import ProbeBus

    target = eaglelab_target
    model = pytestconfig.getoption("--eaglelab-model")

    def run(prompts: list[str], draft: str = "ngram", steps: int | None = None, topk: int | None = None,
            draft_tokens: int | None = None, attention_mode: str = "decode", max_new_tokens: int = 32) -> SpecRun:
        tok = target.tokenizer
        ids = [tok.chat_ids(p) for p in prompts]
        spec, drafter = drafter_for(target, model, draft, steps, topk, draft_tokens, attention_mode, len(ids))
        bus = ProbeBus()
        events: list[Any] = []
        bus.subscribe(events.append)
        eos = tok.eos_token_ids
        spec_out = Engine(target.model, eos_token_ids=eos, drafter=drafter, spec=spec, observer=bus).generate(
            ids, max_new_tokens)
        plain = Engine(target.model, eos_token_ids=eos).generate(ids, max_new_tokens)
        return SpecRun(spec_out.tokens, plain.tokens, spec_out.mean_accept_len, spec_out.accept_lens, events)

    return run


@pytest.fixture
def eaglelab_acceptance(eaglelab_target, request: pytest.FixtureRequest):
    """``check(**settings) -> Comparison | None``: measure a drafter's acceptance (greedy, each prompt
    alone) and compare it with the baseline JSON; fails the test with a figure-by-figure diff when
    the mean accepted length or any per-position acceptance fell by more than the tolerance.

    Settings come from keyword arguments, else from the test's ``eaglelab_acceptance`` marker:
    ``baseline`` (a path, relative to the test file), ``draft`` ("default" | "ngram" | directory),
    ``prompts`` (default: :data:`eaglelab.acceptance_guard.DEFAULT_PROMPTS`), ``steps``, ``topk``,
    ``draft_tokens``, ``max_new_tokens``, ``tolerance`` (per position), ``mean_tolerance``.
    Without a baseline file, or with ``--eaglelab-update-baseline``, it writes one and returns None.
    """
    marker = request.node.get_closest_marker("eaglelab_acceptance")
    defaults = dict(marker.kwargs) if marker else {}
    if marker and marker.args:
        defaults.setdefault("baseline", marker.args[0])
    config = request.config

    def check(**settings: Any):
        from eaglelab import acceptance_guard as guard

        opts = {**defaults, **settings}
        if "baseline" not in opts:
            raise ValueError("eaglelab_acceptance needs baseline=PATH (in the marker or the call)")
        path = Path(opts.pop("baseline"))
        path = path if path.is_absolute() else Path(request.path).parent / path
        tol = opts.pop("tolerance", guard.DEFAULT_TOLERANCE)
        mean_tol = opts.pop("mean_tolerance", guard.DEFAULT_MEAN_TOLERANCE)
        now = measure_acceptance(eaglelab_target, config.getoption("--eaglelab-model"), **opts)
        baseline = None if config.getoption("--eaglelab-update-baseline") else guard.read_baseline(path)
        if baseline is None:
            guard.write_baseline(path, now)
            request.node.warn(pytest.PytestWarning(f"eaglelab: acceptance baseline written to {path}"))
            return None
        comparison = guard.compare(now, baseline, path, tolerance=tol, mean_tolerance=mean_tol)
        if comparison.regressed:
            pytest.fail(comparison.diff(), pytrace=False)
        return comparison

    return check


def measure_acceptance(target, model: str, *, draft: str = "default", prompts: list[str] | None = None,
                       steps: int | None = None, topk: int | None = None, draft_tokens: int | None = None,
                       max_new_tokens: int = 32):
    """Greedy acceptance of ``draft`` on ``prompts`` (each alone, chat-templated), with its settings (the tree
    flags left None take ``eaglelab run``'s defaults: :func:`eaglelab.draft_registry.tree_defaults`)."""
    from eaglelab import acceptance_guard as guard
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.probes.acceptance import AcceptanceStats
    from eaglelab.probes.bus import ProbeBus
    from eaglelab.probes.events import Step

    prompts = list(prompts or guard.DEFAULT_PROMPTS)
    spec, drafter = drafter_for(target, model, draft, steps, topk, draft_tokens)
    stats = AcceptanceStats()
    bus = ProbeBus()
    bus.subscribe(lambda e: stats.observe_step(e) if isinstance(e, Step) else None)
    engine = Engine(target.model, eos_token_ids=target.tokenizer.eos_token_ids, drafter=drafter, spec=spec, observer=bus)
    for prompt in prompts:
        engine.generate([target.tokenizer.chat_ids(prompt)], max_new_tokens)
    if stats.mean_accept_len is None:
        raise ValueError("no verify step ran: raise max_new_tokens")
    settings = {
        "model": f"{target.name} {target.digest}".strip(),
        "draft": draft,
        "draft_shape": f"{spec.algorithm}, {spec.num_steps} steps, topk {spec.topk}, {spec.draft_tokens} tokens"
                       + (f", lookup {spec.lookup_tokens}" if spec.lookup_tokens else ""),
        "prompts": guard.prompts_digest(prompts),
        "prompt_count": len(prompts),
        "max_new_tokens": max_new_tokens,
        "dtype": str(target.model.embed_tokens.weight.dtype).replace("torch.", ""),
        "device": str(target.device),
    }
    return guard.AcceptanceMeasurement(
        mean_accept_len=stats.mean_accept_len, per_position=stats.per_position_rate(spec.max_depth),
        accept_rate=stats.accept_rate, verify_steps=stats.row_cycles, settings=settings,
    )


@pytest.fixture
def eaglelab_check_wiring() -> Callable[..., dict]:
    """``check(draft_dir, data=None, target=None, serving=None) -> dict``: the JSON report of
    ``eaglelab check-wiring`` (verdict, slots, expected_ids, ...)."""
    import json
    import subprocess
    import sys

    def check(draft_dir: str, data: str | None = None, target: str | None = None, serving: str | None = None) -> dict:
        cmd = [sys.executable, "-m", "eaglelab", "check-wiring", str(draft_dir), "--json"]
        if data:
            cmd += ["--data", str(data)]
        if target:
            cmd += ["--target", str(target)]
        if serving:
            cmd += ["--serving", serving]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        try:
            report = json.loads(proc.stdout)
        except json.JSONDecodeError:
            raise AssertionError(f"check-wiring printed no JSON (exit {proc.returncode}): {proc.stderr[-2000:]}") from None
        report["exit_code"] = proc.returncode
        return report

    return check
