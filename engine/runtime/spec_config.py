"""Speculative decoding settings, as SGLang defines them."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from eaglelab.engine.errors import ConfigError

ALGORITHMS = ("none", "eagle3", "ngram")
ATTENTION_MODES = ("prefill", "decode")
MAX_LOOKUP_TOKENS = 32  # a lookup branch's longest chain (a verify of the tree plus these stays a few-row forward)


def expansion_nodes(steps: int, topk: int) -> int:
    """Every candidate a drafter's expansion of ``steps`` steps, ``topk`` children a node, holds, and the root:
    ``1 + topk + (steps - 1) * topk^2`` (the most a tree can keep; a chain's ``steps + 1``)."""
    return 1 + topk + (steps - 1) * topk * topk


@dataclass(frozen=True)
class SpecConfig:
    """How to speculate.

    ``topk == 1`` drafts a chain of ``num_steps`` tokens (``num_draft_tokens = num_steps + 1``,
    the root included). ``topk > 1`` grows a tree by cumulative draft probability and keeps the
    best ``num_draft_tokens - 1`` nodes plus the root. ``attention_mode``: ``prefill`` verifies
    with an eager extend forward that builds its mask on the fly (data-dependent shapes, never
    graph-captured); ``decode`` verifies with a fixed-shape forward over the static cache with a
    tree mask (no host syncs, CUDA-graph capturable).
    """

    algorithm: str = "none"
    num_steps: int = 3
    topk: int = 1
    num_draft_tokens: int = 0  # 0 = auto: num_steps + 1 for a chain, else required
    attention_mode: str = "decode"
    cuda_graphs: bool = False
    compile: bool = False  # torch.compile each captured phase whole (eager runs: RMSNorm, rotary, SwiGLU)
    # The whole speculative cycle as one phase (one CUDA graph: draft, verify, accept, draft-extend, advance)
    # where the drafter allows it (EAGLE-3) and verify is decode-mode, without tensor parallelism; False: a
    # phase (a graph) each, as SGLang runs them.
    one_graph_cycle: bool = True
    # Under compile, the prompt's phases too (the prefill and the drafter's extend over the prompt), once per batch
    # bucket and padded prompt width: a prefill of compiled kernels, not eager ones, for the cost of a compile per
    # width the first time (cached on disk). False: the prompt's phases are captured uncompiled.
    compile_prefill: bool = False
    # A prompt-lookup branch of this many tokens beside an EAGLE-3 tree (``runtime/lookup.py``): the continuation
    # of the context's latest earlier n-gram, verified with the tree. 0: none.
    lookup_tokens: int = 0
    # Where the context's last token never occurred before (the lookup has nothing to copy and would propose the
    # root repeated), the branch's rows go to the tree instead: the drafter's best draft_tokens + lookup_tokens
    # nodes, the same rows verified. Chosen per row and cycle inside the captured draft phase. None (the default):
    # wherever the drafter's expansion holds that many candidates (:attr:`spills`); True insists (refused where it
    # does not), False never.
    lookup_spill: bool | None = None

    def plain(self) -> "SpecConfig":
        """Plain decoding with these graph and compile settings: the baseline a speculative run is measured against."""
        return SpecConfig(cuda_graphs=self.cuda_graphs, compile=self.compile, compile_prefill=self.compile_prefill)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ConfigError("unknown algorithm", field="algorithm", found=self.algorithm, expected=" | ".join(ALGORITHMS))
        if self.attention_mode not in ATTENTION_MODES:
            raise ConfigError(
                "unknown attention mode", field="--attention-mode", found=self.attention_mode,
                expected=" | ".join(ATTENTION_MODES),
            )
        if self.num_steps < 1 or self.topk < 1:
            raise ConfigError("must be >= 1", field="--steps/--topk", found=(self.num_steps, self.topk))
        if not 0 <= self.lookup_tokens <= MAX_LOOKUP_TOKENS:
            raise ConfigError("out of range", field="--lookup-tokens", found=self.lookup_tokens,
                              expected=f"0 (none) .. {MAX_LOOKUP_TOKENS}",
                              hint="leave the flag out for the device profile's branch (16 at batch 1 on the H200)")
        if self.lookup_tokens and self.algorithm != "eagle3":
            raise ConfigError("a lookup branch rides beside an EAGLE-3 drafter's tree", field="--lookup-tokens",
                              found=f"{self.lookup_tokens} with algorithm {self.algorithm}",
                              hint="give an EAGLE-3 --draft, or --draft ngram for the lookup alone")
        if self.lookup_spill and self.lookup_tokens:
            most = self.expansion_nodes
            if self.draft_tokens + self.lookup_tokens > most:
                raise ConfigError(
                    "the branch's rows spill into the tree, which has fewer candidates", field="--lookup-spill",
                    found=f"{self.draft_tokens} draft tokens + {self.lookup_tokens} lookup tokens",
                    expected=f"at most {most} (1 + topk + (steps - 1) * topk^2) in all",
                    hint="a smaller --lookup-tokens or --draft-tokens, more --steps or --topk, or --no-lookup-spill")
        if self.num_draft_tokens == 0:
            return
        if self.topk == 1 and self.num_draft_tokens != self.num_steps + 1:
            raise ConfigError(
                "a chain (topk 1) verifies num_steps + 1 tokens",
                field="--draft-tokens", found=self.num_draft_tokens, expected=self.num_steps + 1,
            )
        most = self.expansion_nodes
        if not 2 <= self.num_draft_tokens <= most:
            raise ConfigError(
                "out of range for this tree", field="--draft-tokens", found=self.num_draft_tokens,
                expected=f"2..{most} (1 + topk + (steps - 1) * topk^2)",
            )

    @property
    def enabled(self) -> bool:
        return self.algorithm != "none"

    @property
    def draft_tokens(self) -> int:
        """N: tokens per row the target verifies, the root included."""
        if self.num_draft_tokens:
            return self.num_draft_tokens
        if self.topk == 1:
            return self.num_steps + 1
        return min(self.expansion_nodes, 2 * self.num_steps * self.topk)

    @property
    def expansion_nodes(self) -> int:
        """Every candidate the drafter's expansion holds, and the root (:func:`expansion_nodes`)."""
        return expansion_nodes(self.num_steps, self.topk)

    @property
    def spills(self) -> bool:
        """Whether the lookup branch's rows go to the drafter's tree where the lookup matched nothing:
        ``lookup_spill`` as set, else (None) wherever there is a branch and the expansion holds its rows too."""
        if self.lookup_spill is not None:
            return bool(self.lookup_spill and self.lookup_tokens)
        return (self.algorithm == "eagle3" and self.lookup_tokens > 0
                and self.draft_tokens + self.lookup_tokens <= self.expansion_nodes)

    @property
    def tree_nodes(self) -> int:
        """Nodes per row the target verifies: the drafter's tree (root included) and the lookup branch."""
        return self.draft_tokens + self.lookup_tokens

    @property
    def chain(self) -> bool:
        """Whether every cycle verifies a chain (topk 1, no lookup branch): an accepted path already sits on
        consecutive slots (nothing to compact)."""
        return self.topk == 1 and not self.lookup_tokens

    @property
    def max_depth(self) -> int:
        """The deepest node of a cycle's tree (an accepted path has at most this many drafted tokens)."""
        return max(self.num_steps, self.lookup_tokens)

    @property
    def draft_slots(self) -> int:
        """Drafter-cache slots past the target's: a draft step's frontiers (steps x topk), or the extend over the
        deepest path (a lookup branch's may be deeper), and two to spare."""
        return max(self.num_steps * self.topk, self.lookup_tokens) + 2

    @property
    def tree_label(self) -> str:
        """The tree as the CLI names it (:func:`tree_label`), ", spilling" where the branch spills (:attr:`spills`)."""
        label = tree_label(self.num_steps, self.topk, self.draft_tokens, self.lookup_tokens)
        return label + (", spilling" if self.spills else "")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["lookup_spill"] = self.spills  # what ran, the default resolved
        d["num_draft_tokens"] = self.draft_tokens if self.enabled else 0
        return d


def tree_label(steps: int, topk: int, draft_tokens: int, lookup_tokens: int = 0) -> str:
    """A tree as the CLI names it: "5 steps, topk 4, 24 draft tokens" (", lookup 8" with a lookup branch)."""
    lookup = f", lookup {lookup_tokens}" if lookup_tokens else ""
    return f"{steps} steps, topk {topk}, {draft_tokens} draft tokens{lookup}"
