"""Does speculation pay on a live server? The verdict from what a server reports.

A server gives the mean accepted length ``A`` (bonus included) and its generation throughput, not
per-phase times. With the plain-decoding throughput of the same server at the same load
(``baseline``, measured by the user: the server restarted without a drafter), the measured speedup
and what a speculative cycle costs follow::

    speedup               = throughput / baseline
    cycle cost (decodes)  = A / speedup          (one cycle commits A tokens; a decode commits 1)
    break-even length     = cycle cost           (speculation pays once A exceeds it)

Worked example (an EAGLE-3 deployment whose verify ran eagerly): 59 tok/s against 82 tok/s
plain, A = 2.5 -> speedup 0.72x, a cycle costs 3.5 decodes, break-even length 3.5.

Probable cause when it does not pay: acceptance below what the drafter should reach (wiring, a
drafter trained on other layers); decode passes that ran without a CUDA graph (an eager, extend-mode
verify); else a cycle that costs too much for the acceptance it gets (verify or draft cost).
Without a baseline only the acceptance half of the verdict can be given.
"""

from __future__ import annotations

from dataclasses import dataclass

CAUSES: tuple[str, ...] = ("pays", "acceptance_low", "verify_eager", "cycle_costly", "speedup_unknown")

# Eager passes are blamed once they are this common: a few (prefills, batches above the captured
# sizes) are normal and do not explain a slow deployment.
EAGER_SHARE_BLAMED = 0.1

_GRAPH_ADVICE = {
    "sglang": "try a decode-style verify (--speculative-attention-mode decode) or a larger --cuda-graph-max-bs",
    "vllm": "check --compilation-config cudagraph_mode (FULL graphs for decode) and the capture sizes",
}


@dataclass(frozen=True)
class LiveEconomics:
    """The figures and the plain-words verdict; ``cause`` is one of :data:`CAUSES`."""

    accept_len: float
    tokens_per_s: float | None
    baseline_tokens_per_s: float | None
    speedup: float | None
    break_even_accept_len: float | None
    cause: str
    verdict: str

    @property
    def below_break_even(self) -> bool:
        """Whether the measurements say speculation costs time here."""
        return self.cause not in ("pays", "speedup_unknown")


def live_economics(
    accept_len: float,
    tokens_per_s: float | None,
    *,
    baseline_tokens_per_s: float | None = None,
    expected_accept_len: float = 2.0,
    cuda_graph_share: float | None = None,
    engine: str | None = None,
) -> LiveEconomics:
    """The verdict for a server's mean accepted length and throughput (see the module docstring)."""
    assert accept_len >= 1.0, f"accepted length counts the bonus token, so it is >= 1; got {accept_len}"
    low = accept_len < expected_accept_len
    if tokens_per_s is None or not baseline_tokens_per_s or tokens_per_s <= 0:
        cause = "acceptance_low" if low else "speedup_unknown"
        missing = (
            "pass the plain-decoding throughput of this server at the same load (--baseline-tok-s)"
            if not baseline_tokens_per_s else "the server's throughput is not known yet (one read of a counter is no rate)"
        )
        words = _acceptance_words(accept_len, expected_accept_len) if low else (
            f"mean accepted length {accept_len:.2f}; speedup unknown: {missing}"
        )
        return LiveEconomics(accept_len, tokens_per_s, baseline_tokens_per_s, None, None, cause, words)
    speedup = tokens_per_s / baseline_tokens_per_s
    break_even = accept_len / speedup  # what one speculative cycle costs, in plain decode steps
    figures = (
        f"{speedup:.2f}x ({tokens_per_s:.1f} tok/s against {baseline_tokens_per_s:.1f} tok/s plain), "
        f"mean accepted length {accept_len:.2f} against a break-even of {break_even:.2f}"
    )
    if speedup >= 1.0:
        return LiveEconomics(accept_len, tokens_per_s, baseline_tokens_per_s, speedup, break_even, "pays",
                             f"speculation pays: {figures}")
    head = f"speculation is slower than plain decoding: {figures}; "
    if low:
        cause, why = "acceptance_low", _acceptance_words(accept_len, expected_accept_len)
    elif cuda_graph_share is not None and 1.0 - cuda_graph_share >= EAGER_SHARE_BLAMED:
        cause = "verify_eager"
        advice = _GRAPH_ADVICE.get(engine or "", "capture verify in CUDA graphs (decode-style attention)")
        why = (
            f"{1 - cuda_graph_share:.0%} of decode passes ran without a CUDA graph: verify runs eagerly "
            f"(extend attention, or batches above the captured sizes); {advice}"
        )
    else:
        cause = "cycle_costly"
        why = (
            f"a speculative cycle costs {break_even:.1f} plain decodes, more than its {accept_len:.2f} "
            "accepted tokens: verify or drafting costs too much (fewer draft tokens, or profile the verify)"
        )
    return LiveEconomics(accept_len, tokens_per_s, baseline_tokens_per_s, speedup, break_even, cause, head + why)


def _acceptance_words(accept_len: float, expected: float) -> str:
    return (
        f"acceptance too low: mean accepted length {accept_len:.2f} (expected >= {expected:g} for this "
        "drafter); check the drafter's wiring with eaglelab check-wiring"
    )
