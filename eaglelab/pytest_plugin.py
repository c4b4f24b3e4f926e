"""pytest fixtures for guarding EAGLE-3 drafters in other projects' test suites.

Registered through the ``pytest11`` entry point, so installing eaglelab makes them available::

    def test_my_drafter_is_lossless(eaglelab_spec_run):
        run = eaglelab_spec_run(["Name three rivers."], draft="path/to/drafter", max_new_tokens=32)
        assert run.identical_to_plain          # greedy speculation changed nothing
        assert run.mean_accept_len >= 2.0      # and it still accepts enough

    def test_my_drafter_wiring(eaglelab_check_wiring):
        report = eaglelab_check_wiring("path/to/drafter", data="path/to/specforge_data")
        assert report["verdict"] == "ok", report

Nothing heavy is imported until a fixture is used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("eaglelab")
    group.addoption("--eaglelab-model", default="default", help="target model for eaglelab fixtures")
    group.addoption("--eaglelab-device", default="cpu", help="device for eaglelab fixtures")


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


@pytest.fixture
def eaglelab_spec_run(eaglelab_target) -> Callable[..., SpecRun]:
    """Run prompts greedily with a drafter and without, on the same target; record the events."""
    from eaglelab.engine.runtime.drafters import Eagle3Proposer, NgramDrafter
    from eaglelab.engine.model.eagle3 import load_eagle3
    from eaglelab.engine.runtime.generate import Engine
    from eaglelab.engine.runtime.spec_config import SpecConfig
    from eaglelab.probes.bus import ProbeBus

    target = eaglelab_target

    def run(prompts: list[str], draft: str = "ngram", steps: int = 3, topk: int = 1,
            draft_tokens: int = 0, attention_mode: str = "decode", max_new_tokens: int = 32) -> SpecRun:
        tok = target.tokenizer
        ids = [tok.chat_ids(p) for p in prompts]
        if draft == "ngram":
            spec = SpecConfig("ngram", num_steps=steps, attention_mode=attention_mode)
            drafter = NgramDrafter(spec)
        else:
            spec = SpecConfig("eagle3", num_steps=steps, topk=topk, num_draft_tokens=draft_tokens,
                              attention_mode=attention_mode)
            net, taps, _ = load_eagle3(draft, target.model)
            drafter = Eagle3Proposer(net, spec, taps)
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
