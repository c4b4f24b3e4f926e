"""The bench configurations, in one table: every column ``eaglelab bench`` can measure, and the ones ``tune``
runs (:data:`CONFIGS`). Graph configurations need CUDA; ``*-gemv`` and ``*-attn`` ones (our Triton kernels)
run only when named."""

from __future__ import annotations

from dataclasses import dataclass

TP_CONFIGS = "plain-eager,plain-graphs,spec-decode-graphs"  # --tp's default: the figure, no HF peer


@dataclass(frozen=True)
class BenchConfig:
    """One column of the comparison."""

    name: str
    speculative: bool
    attention_mode: str  # verify attention mode ("decode" for plain decoding)
    graphs: bool
    peer: bool = False  # HF transformers generate
    description: str = ""
    compile: bool = False  # each captured phase torch.compile'd whole
    gemv: bool = False  # projections of M <= 64 rows on the Triton GEMV (engine/model/gemv.py)
    attn: bool = False  # attention of T <= 64 query rows on the Triton decode attention (engine/model/decode_attention.py)
    one_graph: bool = True  # speculative, decode-mode verify: the whole cycle one phase (False: a phase each)

    @property
    def triton(self) -> bool:
        """Whether this config asks for one of our Triton kernels (run only when named)."""
        return self.gemv or self.attn


CONFIGS: dict[str, BenchConfig] = {c.name: c for c in (
    BenchConfig("plain-eager", False, "decode", False, description="plain greedy, eager"),
    BenchConfig("plain-graphs", False, "decode", True, description="plain greedy, CUDA graphs"),
    BenchConfig("plain-compile", False, "decode", True, compile=True,
                description="plain greedy, CUDA graphs + torch.compile'd phases"),
    BenchConfig("plain-graphs-gemv", False, "decode", True, gemv=True,
                description="plain greedy, CUDA graphs, Triton GEMV for the projections"),
    BenchConfig("plain-compile-gemv", False, "decode", True, compile=True, gemv=True,
                description="plain greedy, CUDA graphs + torch.compile'd phases + Triton GEMV"),
    BenchConfig("plain-compile-gemv-attn", False, "decode", True, compile=True, gemv=True, attn=True,
                description="plain greedy, CUDA graphs + torch.compile'd phases + Triton GEMV + Triton decode attention"),
    BenchConfig("spec-prefill", True, "prefill", False, description="speculative, verify as eager extend"),
    BenchConfig("spec-prefill-graphs", True, "prefill", True, description="speculative, drafter captured, verify eager extend"),
    BenchConfig("spec-decode", True, "decode", False, description="speculative, decode-mode verify, eager"),
    BenchConfig("spec-decode-graphs", True, "decode", True, description="speculative, decode-mode verify, CUDA graphs"),
    BenchConfig("spec-compile", True, "decode", True, compile=True,
                description="speculative, decode-mode verify, CUDA graphs + torch.compile'd phases"),
    BenchConfig("spec-compile-gemv", True, "decode", True, compile=True, gemv=True,
                description="speculative, decode-mode verify, CUDA graphs + torch.compile'd phases + Triton GEMV"),
    BenchConfig("spec-compile-gemv-attn", True, "decode", True, compile=True, gemv=True, attn=True,
                description="speculative, decode-mode verify, CUDA graphs + torch.compile'd phases + Triton GEMV "
                            "+ Triton decode attention"),
    BenchConfig("spec-phases-gemv-attn", True, "decode", True, compile=True, gemv=True, attn=True,
                one_graph=False, description="as spec-compile-gemv-attn, each phase of the cycle its own graph "
                                             "(five launches a cycle, not one)"),
    BenchConfig("hf", False, "decode", False, peer=True, description="HF transformers generate (eager)"),
)}


def pick_configs(text: str | None, default: str | None = None, measures_else: bool = False) -> list[str]:
    """The ``--configs`` names (checked), else ``default`` (a comma list), else every configuration but the
    ``*-gemv`` and ``*-attn`` ones (our Triton kernels). "none" runs no configuration: allowed only when
    something else is measured (``measures_else``: --profile, --tp or the micro-measure)."""
    from eaglelab.engine.errors import EagleLabError

    text = text or default
    if text is None:
        return [name for name, cfg in CONFIGS.items() if not cfg.triton]
    if text.strip() == "none":  # only the --tp section, --profile and the micro-measure
        if not measures_else:
            raise EagleLabError("no configuration, and nothing else to measure", field="--configs", found="none",
                                hint="add --profile, --tp N or --micro, or name configurations")
        return []
    names = [c.strip() for c in text.split(",") if c.strip()]
    for n in names:
        if n not in CONFIGS:
            raise EagleLabError("unknown configuration", field="--configs", found=n, expected=", ".join(CONFIGS))
    return names


def tune_config(speculative: bool, graphs: bool, compiled: bool) -> BenchConfig:
    """The configuration ``eaglelab tune`` runs: decode-mode verify, graphs on CUDA (``compiled``: their phases
    torch.compile'd), eager on CPU."""
    if compiled:
        return CONFIGS["spec-compile" if speculative else "plain-compile"]
    if graphs:
        return CONFIGS["spec-decode-graphs" if speculative else "plain-graphs"]
    return CONFIGS["spec-decode" if speculative else "plain-eager"]
