"""Graph statuses and the engine's warnings: every string defined once.

A cycle's ``CycleStats.graph[phase]`` is :data:`REPLAY` or ``"eager: <reason>"``; the runners write
it, the engine turns a fallback nobody chose into a warning (``Observer.on_warning``), and the
probes, the TUI and its synthetic demo read the same strings. Reasons that carry figures (a batch
above the largest bucket, a shape not captured) are built by the runner; the fixed ones are here.
No torch: the TUI imports this (through ``eaglelab.probes.events``).
"""

from __future__ import annotations

REPLAY = "replay"
EAGER_OFF = "eager: CUDA graphs off"
EAGER_NO_CUDA = "eager: no CUDA device"
EAGER_NO_RUNNER = "eager: no graph runner given to the engine"
EAGER_PREFILL = "eager: prompt above the captured prefill sizes"
EAGER_EXTEND = "eager: attention mode prefill (extend shapes vary)"
EAGER_HOST_DRAFTER = "eager: host-side drafter (no forward)"
EAGER_NO_FORWARD = "eager: no forward this cycle"

# Eager by design, not worth a warning: graphs turned off, a prompt too long to capture (its
# prefill is compute-bound), a drafter with no network (n-gram), a phase that ran no forward.
EXPECTED_EAGER: frozenset[str] = frozenset({EAGER_OFF, EAGER_PREFILL, EAGER_HOST_DRAFTER, EAGER_NO_FORWARD})

# ``source`` of the warnings the engine sends about its runner.
SOURCE_RUNNER = "runner"


def eager_warning(phase: str, status: str) -> str | None:
    """The warning for ``phase`` having run as ``status``; None for a replay or an eager run by design.

    >>> eager_warning("verify", EAGER_EXTEND)
    'verify runs eagerly: attention mode prefill (extend shapes vary)'
    """
    if status == REPLAY or status in EXPECTED_EAGER:
        return None
    reason = status.split(":", 1)[1].strip() if status.startswith("eager:") else status
    return f"{phase} runs eagerly: {reason}"
