"""engine.sampling: SamplingParams validation, temperature/top-k/top-p filtering, sampling."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglelab.engine.runtime.sampling import SamplingParams, probs_from_logits, sample


def _logits(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen) * 3.0


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
    ],
)
def test_invalid_params_raise_naming_the_field(kwargs: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        SamplingParams(**kwargs)


def test_greedy_property() -> None:
    assert SamplingParams().greedy
    assert not SamplingParams(temperature=0.7).greedy


def test_greedy_is_one_hot_of_argmax() -> None:
    logits = _logits(0, (3, 4, 11))
    probs = probs_from_logits(logits, SamplingParams(temperature=0.0, top_k=3))
    assert probs.dtype == torch.float32
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))
    assert torch.equal(probs.sum(-1), torch.ones(3, 4))
    assert int((probs > 0).sum()) == 12


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    vocab=st.integers(2, 40),
    temperature=st.floats(0.1, 3.0),
    top_k=st.integers(0, 45),
    top_p=st.floats(0.05, 1.0),
)
def test_filtered_probs_match_definition(seed: int, vocab: int, temperature: float, top_k: int, top_p: float) -> None:
    """Kept set = the top-k logits, then the minimal nucleus of the renormalised top-k probs."""
    logits = _logits(seed, (5, vocab)).to(torch.float64).to(torch.float32)
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    probs = probs_from_logits(logits, params)
    assert probs.shape == (5, vocab) and probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(5), atol=1e-5, rtol=0)
    assert bool((probs >= 0).all())
    for row in range(5):
        expected = _reference_probs(logits[row].tolist(), temperature, top_k, top_p)
        torch.testing.assert_close(probs[row], torch.tensor(expected), atol=1e-5, rtol=1e-4)


def _reference_probs(logits: list[float], temperature: float, top_k: int, top_p: float) -> list[float]:
    """Slow reference: sort, cut at k, softmax, cut at the minimal nucleus, renormalise."""
    import math

    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    if 0 < top_k < len(logits):
        order = order[:top_k]
    exps = {i: math.exp((logits[i] - logits[order[0]]) / temperature) for i in order}
    total = sum(exps.values())
    kept, mass = [], 0.0
    for i in order:
        if mass >= top_p and top_p < 1.0:
            break
        kept.append(i)
        mass += exps[i] / total
    norm = sum(exps[i] for i in kept)
    out = [0.0] * len(logits)
    for i in kept:
        out[i] = exps[i] / norm
    return out


def test_top_k_keeps_exactly_k() -> None:
    logits = _logits(1, (7, 50))
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=5))
    assert torch.equal((probs > 0).sum(-1), torch.full((7,), 5))
    top5 = torch.topk(logits, 5, dim=-1).indices
    assert bool((probs.gather(-1, top5) > 0).all())


def test_top_p_keeps_minimal_nucleus() -> None:
    """probs (0.5, 0.3, 0.15, 0.05): top_p 0.8 keeps 2 tokens, 0.81 keeps 3, 0.5 keeps 1."""
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    for top_p, kept in [(0.8, 2), (0.81, 3), (0.5, 1), (0.49, 1), (0.96, 4), (1.0, 4)]:
        probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=top_p))
        assert int((probs > 0).sum()) == kept, top_p
        assert float(probs.sum()) == pytest.approx(1.0)
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.8))
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_temperature_sharpens() -> None:
    logits = torch.tensor([2.0, 1.0, 0.0])
    cold = probs_from_logits(logits, SamplingParams(temperature=0.5))
    hot = probs_from_logits(logits, SamplingParams(temperature=2.0))
    torch.testing.assert_close(cold, torch.softmax(logits / 0.5, -1))
    assert float(cold[0]) > float(hot[0])


def test_sample_shape_and_support() -> None:
    probs = torch.zeros(4, 3, 6)
    probs[..., 2] = 0.5
    probs[..., 4] = 0.5
    tokens = sample(probs, torch.Generator().manual_seed(0))
    assert tokens.shape == (4, 3) and tokens.dtype == torch.long
    assert bool(((tokens == 2) | (tokens == 4)).all())


def test_sample_is_seeded() -> None:
    probs = torch.softmax(_logits(2, (64, 10)), -1)
    a = sample(probs, torch.Generator().manual_seed(5))
    b = sample(probs, torch.Generator().manual_seed(5))
    c = sample(probs, torch.Generator().manual_seed(6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_sample_frequencies_match_probs() -> None:
    """200k draws from (0.1, 0.2, 0.3, 0.4) scaled by 3 (unnormalised): frequencies within 0.005."""
    probs = torch.tensor([0.3, 0.6, 0.9, 1.2]).expand(200_000, 4)
    tokens = sample(probs, torch.Generator().manual_seed(0))
    freq = torch.bincount(tokens, minlength=4).float() / 200_000
    torch.testing.assert_close(freq, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=5e-3, rtol=0)


def test_sample_greedy_one_hot_is_argmax() -> None:
    logits = _logits(3, (100, 9))
    tokens = sample(probs_from_logits(logits, SamplingParams()), torch.Generator().manual_seed(1))
    assert torch.equal(tokens, logits.argmax(-1))
