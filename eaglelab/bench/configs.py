"""The bench configurations, in one table: every column ``eaglelab bench`` can measure (:data:`CONFIGS`), and the
one that decodes as ``run`` does on a device (:func:`regime_config`: the bench's headline, what ``tune`` runs).
Graph configurations need CUDA; ``*-gemv``, ``*-attn`` and ``*-pdl`` ones (our Triton kernels, dependent launches)
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
    gemv: bool = False  # projections of M <= 256 rows on the Triton GEMV (engine/model/gemv.py)
    attn: bool = False  # attention of T <= 64 query rows on the Triton decode attention (engine/model/decode_attention.py)
    one_graph: bool = True  # speculative, decode-mode verify: the whole cycle one phase (False: a phase each)
    pdl: bool = False  # the captured phases' kernels launched dependently (Hopper; engine/model/pdl.py)
    shed: bool = True  # a batch's live rows move onto a smaller batch bucket as rows end (False: ``*-whole``)

    @property
    def triton(self) -> bool:
        """Whether this config asks for one of our Triton kernels or their dependent launches (run only when
        named)."""
        return self.gemv or self.attn or self.pdl


CONFIGS: dict[str, BenchConfig] = {c.name: c for c in (
    BenchConfig("plain-eager", False, "decode", False, description="plain greedy, eager"),
    BenchConfig("plain-graphs", False, "decode", True, description="plain greedy, CUDA graphs"),
    BenchConfig("plain-compile", False, "decode", True, compile=True,
                description="plain greedy, CUDA graphs + torch.compile'd phases"),
    BenchConfig("plain-graphs-gemv", False, "decode", True, gemv=True,
                description="plain greedy, CUDA graphs, Triton GEMV for the projections"),
    BenchConfig("plain-compile-gemv", False, "decode", True, compile=True, gemv=True,
                description="plain greedy, CUDA graphs + torch.compile'd phases + Triton GEMV"),
    BenchConfig("plain-compile-attn", False, "decode", True, compile=True, attn=True,
                description="plain greedy, CUDA graphs + torch.compile'd phases + Triton decode attention"),
    BenchConfig("plain-compile-gemv-attn", False, "decode", True, compile=True, gemv=True, attn=True,
                description="plain greedy, CUDA graphs + torch.compile'd phases + Triton GEMV + Triton decode attention"),
    BenchConfig("plain-compile-gemv-attn-pdl", False, "decode", True, compile=True, gemv=True, attn=True, pdl=True,
                description="as plain-compile-gemv-attn, every kernel launched dependently (PDL, Hopper)"),
    BenchConfig("spec-prefill", True, "prefill", False, description="speculative, verify as eager extend"),
    BenchConfig("spec-prefill-graphs", True, "prefill", True, description="speculative, drafter captured, verify eager extend"),
    BenchConfig("spec-decode", True, "decode", False, description="speculative, decode-mode verify, eager"),
    BenchConfig("spec-decode-graphs", True, "decode", True, description="speculative, decode-mode verify, CUDA graphs"),
    BenchConfig("spec-compile", True, "decode", True, compile=True,
                description="speculative, decode-mode verify, CUDA graphs + torch.compile'd phases"),
    BenchConfig("spec-compile-gemv", True, "decode", True, compile=True, gemv=True,
                description="speculative, decode-mode verify, CUDA graphs + torch.compile'd phases + Triton GEMV"),
    BenchConfig("spec-compile-attn", True, "decode", True, compile=True, attn=True,
                description="speculative, decode-mode verify, CUDA graphs + torch.compile'd phases + Triton decode "
                            "attention"),
    BenchConfig("spec-compile-gemv-attn", True, "decode", True, compile=True, gemv=True, attn=True,
                description="speculative, decode-mode verify, CUDA graphs + torch.compile'd phases + Triton GEMV "
                            "+ Triton decode attention"),
    BenchConfig("spec-compile-gemv-attn-pdl", True, "decode", True, compile=True, gemv=True, attn=True, pdl=True,
                description="as spec-compile-gemv-attn, every kernel launched dependently (PDL, Hopper)"),
    BenchConfig("spec-compile-gemv-attn-whole", True, "decode", True, compile=True, gemv=True, attn=True, shed=False,
                description="as spec-compile-gemv-attn, every batch run whole until its last row ends (its ended "
                            "rows not shed onto a smaller batch bucket)"),
    BenchConfig("spec-phases-gemv-attn", True, "decode", True, compile=True, gemv=True, attn=True,
                one_graph=False, description="as spec-compile-gemv-attn, each phase of the cycle its own graph "
                                             "(five launches a cycle, not one)"),
    BenchConfig("hf", False, "decode", False, peer=True, description="HF transformers generate (eager)"),
)}


def pick_configs(text: str | None, default: str | None = None, measures_else: bool = False) -> list[str]:
    """The ``--configs`` names (checked), else ``default`` (a comma list), else every configuration but the
    ``*-gemv``, ``*-attn`` and ``*-pdl`` ones (our Triton kernels). "none" runs no configuration: allowed only when
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


@dataclass(frozen=True)
class Regime:
    """How ``eaglelab run`` decodes on a device, as bench and tune measure it: CUDA graphs (on CUDA), their
    phases torch.compile'd, our Triton GEMV and decode attention, the one-graph cycle; ``reasons``: why each
    value was chosen (the session's notes: the device profile's measured choice, else the default)."""

    graphs: bool
    compile: bool = False
    gemv: bool = False
    attn: bool = False
    one_graph: bool = True
    reasons: tuple[str, ...] = ()
    pdl: bool = False  # the captured phases' kernels launched dependently (bench --pdl: the ``*-pdl`` columns)

    @property
    def label(self) -> str:
        if not self.graphs:
            return "eager"
        parts = ["CUDA graphs"] + ["torch.compile"] * self.compile + ["Triton GEMV"] * self.gemv
        parts += ["Triton decode attention"] * self.attn + ["dependent launches (PDL)"] * self.pdl
        return " + ".join(parts) + ("" if self.one_graph else ", a graph per phase")


def regime_config(speculative: bool, regime: Regime) -> BenchConfig:
    """The configuration of :data:`CONFIGS` that decodes as ``regime`` (plain or speculative, decode-mode verify).

    Example: ``regime_config(True, Regime(graphs=True, compile=True, gemv=True, attn=True))`` is
    ``spec-compile-gemv-attn``; ``regime_config(False, Regime(graphs=False))`` is ``plain-eager``."""
    want = (speculative, regime.graphs, regime.compile and regime.graphs, regime.gemv and regime.graphs,
            regime.attn and regime.graphs, regime.one_graph or not speculative, regime.pdl and regime.graphs)
    for cfg in CONFIGS.values():
        if not cfg.peer and cfg.attention_mode == "decode" and want == (
                cfg.speculative, cfg.graphs, cfg.compile, cfg.gemv, cfg.attn, cfg.one_graph or not speculative,
                cfg.pdl):
            return cfg
    # a combination no bench column names (tune's --no-compile with a kernel on): made here, named by what it runs
    name = "-".join(["spec" if speculative else "plain", "graphs" if want[2] is False else "compile",
                     *(["gemv"] if want[3] else []), *(["attn"] if want[4] else []), *([] if want[5] else ["phases"]),
                     *(["pdl"] if want[6] else [])])
    return BenchConfig(name, speculative, "decode", regime.graphs, compile=want[2], gemv=want[3], attn=want[4],
                       one_graph=regime.one_graph, pdl=want[6], description=f"{'speculative' if speculative else 'plain'}, "
                                                           f"{regime.label}")
