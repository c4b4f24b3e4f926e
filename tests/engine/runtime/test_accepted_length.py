"""The accepted length has one definition: the tokens a verify step appends to the output, the bonus
included, cut after the first EOS and at ``max_new_tokens`` (SGLang drops the accepted tokens past a
finished request's EOS and counts the rest, EOS included).

Worked example: the drafter proposes 4 tokens, the target accepts all 4 and adds a bonus (5 tokens),
but the 3rd accepted token is EOS: the accepted length is 3, not 5, and the row ends.

Invariant: the prefill commits the first token, every later token comes from a verify, so per row
``1 + sum(accepted lengths) == generated tokens``.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglelab.engine.runtime.drafters import NgramDrafter
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.engine.runtime.tree import chain_tree
from eaglelab.probes.acceptance import AcceptanceStats
from eaglelab.probes.bus import ProbeBus
from eaglelab.probes.events import Step
from tests.conftest import random_model, tiny_config

TARGET = random_model(tiny_config(num_hidden_layers=3), seed=5)
REPEATS = [[20, 21, 22, 23, 24] * 4]  # the n-gram drafter accepts long runs on this


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(eos_at=st.integers(0, 15), limit=st.integers(1, 20), steps=st.integers(1, 5))
def test_accepted_lengths_sum_to_the_output(eos_at, limit, steps):
    free = Engine(TARGET).generate(REPEATS, 20).tokens[0]
    eos = (free[eos_at],)
    spec = SpecConfig("ngram", num_steps=steps)
    bus = ProbeBus()
    events: list = []
    bus.subscribe(events.append)
    out = Engine(TARGET, eos_token_ids=eos, drafter=NgramDrafter(spec), spec=spec, observer=bus).generate(
        REPEATS, limit)
    plain = Engine(TARGET, eos_token_ids=eos).generate(REPEATS, limit)
    assert out.tokens == plain.tokens
    flat = [a for cycle in out.accept_lens for a in cycle]
    assert 1 + sum(flat) == len(out.tokens[0])
    assert all(1 <= a <= steps + 1 for a in flat)
    stats = AcceptanceStats()
    for e in events:
        if isinstance(e, Step):
            stats.observe_step(e)
    assert stats.accepted_tokens == sum(flat)  # the events carry the same definition


class OracleDrafter:
    """Proposes the target's own greedy continuation (known in advance): every draft is accepted."""

    target_taps: tuple[int, ...] = ()
    net = None  # no network: it runs on the host

    def __init__(self, spec: SpecConfig, future: list[int]) -> None:
        self.spec, self.future = spec, future

    def begin(self, st, prompt_ids, aux, runner) -> None:
        pass

    def propose(self, st, runner):
        n = int(st.n_out[0])  # tokens out so far; the root is future[n - 1]
        k = self.spec.num_steps
        ahead = (self.future[n: n + k] + [0] * k)[:k]
        return chain_tree(torch.cat([st.root[:, None], torch.tensor([ahead])], dim=1))

    def commit(self, st, acc, aux, runner) -> None:
        pass


def test_eos_inside_an_accepted_run_is_counted_up_to_eos():
    """5 draft steps all accepted: cycles commit 6 tokens each; an EOS as the 3rd token of the 2nd
    cycle makes that cycle's accepted length 3 and ends the row."""
    free = Engine(TARGET).generate([[7, 8, 9]], 30).tokens[0]
    spec = SpecConfig("ngram", num_steps=5)
    full = Engine(TARGET, drafter=OracleDrafter(spec, free), spec=spec).generate([[7, 8, 9]], 30)
    assert full.tokens[0] == free and full.accept_lens[:2] == [[6], [6]]
    eos = free[1 + 6 + 2]  # 1 from prefill, 6 from cycle 1, then the 3rd token of cycle 2
    first = free.index(eos)
    out = Engine(TARGET, eos_token_ids=(eos,), drafter=OracleDrafter(spec, free), spec=spec).generate([[7, 8, 9]], 30)
    assert out.tokens[0] == free[: first + 1] and out.stop_reasons == ["eos"]
    assert first == 9, "the EOS token must not appear earlier in this seed's output"
    assert out.accept_lens == [[6], [3]]
    assert 1 + sum(a for c in out.accept_lens for a in c) == len(out.tokens[0])
