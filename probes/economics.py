"""Does speculation pay? Predicted speedup from measured per-cycle costs, and why not if not.

One speculative cycle costs ``cycle_ms = draft_ms + verify_ms + accept_ms + extend_ms`` and
commits ``accept_len`` tokens (bonus included) per row; plain decoding commits one token per
``decode_ms``. So::

    predicted speedup     = accept_len * decode_ms / cycle_ms
    break-even verify_ms  = accept_len * decode_ms - (draft_ms + accept_ms + extend_ms)
    verify/decode ratio   = verify_ms / decode_ms

Worked example (an SGLang deployment whose verify ran as an eager extend, ~29-30 ms for 3
tokens against a ~12 ms graph-replayed decode): decode 12 ms, draft 3, verify 29.5 (eager
extend), accept 0.5, extend 2, accept length 2.5 -> cycle 35 ms, speedup 30/35 = 0.86x,
break-even verify 24.5 ms, ratio 2.46: verify is the cause.

When speculation is slower, the verdict names the dominating cause by asking which single fix
would help most: acceptance raised to what the drafter should reach (``expected_accept_len``)
or verify brought down to the cost of one decode (what a graph-captured, decode-style verify
costs). If neither applies, drafting itself costs more than the accepted tokens save.
"""

from __future__ import annotations

from dataclasses import dataclass

# Verify counts as "costly" once it exceeds a plain decode by this factor.
VERIFY_COSTLY_RATIO = 1.2

CAUSES: tuple[str, ...] = ("pays", "acceptance_low", "verify_eager", "verify_costly", "draft_costly")


@dataclass(frozen=True)
class EconomicsInputs:
    """Measured costs of one speculative cycle, the plain-decode baseline, and acceptance."""

    decode_ms: float  # one plain 1-token decode step (baseline)
    draft_ms: float
    verify_ms: float
    accept_len: float  # mean accepted length, bonus included
    accept_ms: float = 0.0
    extend_ms: float = 0.0  # draft_extend
    verify_graph: str | None = None  # "replay" | "eager: <reason>" | None when unknown
    attention_mode: str | None = None  # "prefill" | "decode" | None when unknown
    expected_accept_len: float = 2.0  # the least this drafter should reach when wired right

    def __post_init__(self) -> None:
        if not self.decode_ms > 0:
            raise ValueError(f"decode_ms must be > 0, got {self.decode_ms}")
        if not self.accept_len >= 1:
            raise ValueError(f"accept_len counts the bonus token, so it is >= 1; got {self.accept_len}")
        for name in ("draft_ms", "verify_ms", "accept_ms", "extend_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @property
    def overhead_ms(self) -> float:
        """Everything in a cycle but verify: draft + accept + draft-extend."""
        return self.draft_ms + self.accept_ms + self.extend_ms

    @property
    def cycle_ms(self) -> float:
        """One whole speculative cycle."""
        return self.overhead_ms + self.verify_ms

    @property
    def verify_eager(self) -> bool:
        """Verify is known to run without a CUDA graph."""
        return self.verify_graph is not None and self.verify_graph.startswith("eager")

    def speedup(self, *, accept_len: float | None = None, verify_ms: float | None = None) -> float:
        """Predicted speedup, optionally with a different accept length or verify cost."""
        a = self.accept_len if accept_len is None else accept_len
        v = self.verify_ms if verify_ms is None else verify_ms
        cycle = self.overhead_ms + v
        return a * self.decode_ms / cycle if cycle > 0 else float("inf")


@dataclass(frozen=True)
class Economics:
    """The prediction and its plain-words verdict."""

    inputs: EconomicsInputs
    predicted_speedup: float
    break_even_verify_ms: float  # may be <= 0: no verify cost could make speculation pay
    verify_decode_ratio: float
    speedup_if_expected_acceptance: float
    speedup_if_verify_as_decode: float
    cause: str  # one of CAUSES
    verdict: str


def analyse(inputs: EconomicsInputs) -> Economics:
    """Predict the speedup and name what dominates when speculation does not pay."""
    speedup = inputs.speedup()
    if_acceptance = inputs.speedup(accept_len=max(inputs.accept_len, inputs.expected_accept_len))
    if_verify = inputs.speedup(verify_ms=min(inputs.verify_ms, inputs.decode_ms))
    cause = _cause(inputs, speedup, if_acceptance, if_verify)
    return Economics(
        inputs=inputs,
        predicted_speedup=speedup,
        break_even_verify_ms=inputs.accept_len * inputs.decode_ms - inputs.overhead_ms,
        verify_decode_ratio=inputs.verify_ms / inputs.decode_ms,
        speedup_if_expected_acceptance=if_acceptance,
        speedup_if_verify_as_decode=if_verify,
        cause=cause,
        verdict=_verdict(inputs, cause, speedup),
    )


def _cause(inputs: EconomicsInputs, speedup: float, if_acceptance: float, if_verify: float) -> str:
    if speedup >= 1.0:
        return "pays"
    acceptance_low = inputs.accept_len < inputs.expected_accept_len
    verify_costly = inputs.verify_ms > VERIFY_COSTLY_RATIO * inputs.decode_ms
    if acceptance_low and (not verify_costly or if_acceptance >= if_verify):
        return "acceptance_low"
    if verify_costly:
        eager = inputs.verify_eager or (inputs.verify_graph is None and inputs.attention_mode == "prefill")
        return "verify_eager" if eager else "verify_costly"
    return "draft_costly"


def _verdict(inputs: EconomicsInputs, cause: str, speedup: float) -> str:
    a, d = inputs.accept_len, inputs.decode_ms
    if cause == "pays":
        return (
            f"speculation pays: {speedup:.2f}x predicted (mean accepted length {a:.2f} per "
            f"{inputs.cycle_ms:.1f} ms cycle against {d:.1f} ms per plain decode)"
        )
    head = f"speculation is slower than plain decoding ({speedup:.2f}x predicted): "
    if cause == "acceptance_low":
        return head + (
            f"acceptance too low: mean accepted length {a:.2f} (expected >= "
            f"{inputs.expected_accept_len:g} for this drafter); check wiring with eaglelab check-wiring"
        )
    if cause in ("verify_eager", "verify_costly"):
        return head + _verify_words(inputs, cause)
    return head + (
        f"drafting costs {inputs.overhead_ms:.1f} ms per cycle (draft + accept + draft-extend), more "
        f"than the {(a - 1) * d:.1f} ms the {a - 1:.2f} accepted draft tokens save; "
        "use fewer draft steps or capture the draft with CUDA graphs"
    )


def _verify_words(inputs: EconomicsInputs, cause: str) -> str:
    ratio = inputs.verify_ms / inputs.decode_ms
    text = f"verify costs {ratio:.1f}x a decode"
    if cause == "verify_eager":
        reason = inputs.verify_graph.split(":", 1)[1].strip() if inputs.verify_graph and ":" in inputs.verify_graph else ""
        if not reason and inputs.attention_mode:
            reason = f"attention mode {inputs.attention_mode}"
        text += f" and runs eagerly ({reason})" if reason else " and runs eagerly"
    break_even = inputs.accept_len * inputs.decode_ms - inputs.overhead_ms
    if break_even > 0:
        text += f"; break-even verify is {break_even:.1f} ms against {inputs.verify_ms:.1f} ms measured"
    else:
        text += "; even a free verify would not pay at this accept length"
    if inputs.attention_mode == "prefill" or "prefill" in (inputs.verify_graph or ""):
        text += "; try --attention-mode decode"
    return text
