"""What `run`, `bench`, `trace` and the TUI share: engine flags, and turning them into a loaded
target, a drafter, a spec config and an observer, with the reason for every auto-chosen value.
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, field
from typing import Any, Callable

from eaglelab.devices import device_name, pick_device, pick_dtype, profile_device, rank_device
from eaglelab.draft_registry import DRAFT_CHOICES, DraftChoice, TreeFlags, Where, choose_drafter


DEFAULT_MAX_NEW_TOKENS = 128  # run, trace, the TUI (bench measures fewer: its own device-dependent defaults)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """The flags every generating command takes: the model and drafter, then how to decode."""
    add_model_args(p, max_new_tokens=DEFAULT_MAX_NEW_TOKENS)
    g = p.add_argument_group("decoding")
    g.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--attention-mode", default="decode", choices=("decode", "prefill"),
                   help="verify as a fixed-shape decode over the static cache, or as an eager extend")
    g.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="replay the loop from CUDA graphs, captured per batch bucket: the whole speculative cycle as one "
                        "(see --one-graph-cycle) or a graph per phase (default: on with CUDA)")
    g.add_argument("--one-graph-cycle", action=argparse.BooleanOptionalAction, default=True,
                   help="run a whole EAGLE-3 cycle (draft, verify, accept, draft-extend, advance) as one phase: one "
                        "CUDA graph launch per cycle; --no-one-graph-cycle runs a phase (a graph) each (default: on; "
                        "needs decode-mode verify; off under tensor parallelism)")
    g.add_argument("--compile-prefill", action=argparse.BooleanOptionalAction, default=False,
                   help="with --compile, compile the prompt's phases too (the prefill and the drafter's extend over the "
                        "prompt), once per batch bucket and padded prompt width (~30 s a width the first time, cached "
                        "on disk): fewer kernels a request (default: off; they are captured uncompiled)")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile each captured phase whole (once per batch bucket; eager runs: the layers' "
                        "RMSNorm/rotary/SwiGLU), cached on disk under the eaglelab cache (default: on with CUDA graphs)")
    add_pdl_arg(g)
    add_kernel_args(g)


def add_pdl_arg(g: argparse._ArgumentGroup, what: str = "", dest: str = "pdl") -> None:
    """``--pdl``, declared once for run and trace (``dest`` pdl: the session's), bench and tune (``bench_pdl``: the
    configurations measured, not their session's)."""
    g.add_argument("--pdl", action=argparse.BooleanOptionalAction, default=None, dest=dest,
                   help=f"{what}launch the captured phases' kernels dependently (Hopper's programmatic dependent "
                        "launch): each starts while the one before finishes, then waits for its results; the same "
                        "tokens (default: the device profile's measured choice, else off; needs CUDA graphs and a GPU "
                        "of compute capability 9.0+)")


def add_kernel_args(g: argparse._ArgumentGroup, what: str = "") -> None:
    """``--gemv`` and ``--decode-attn``, declared once for run, trace, the TUI, bench and tune (``what``: what
    they apply to in that command, e.g. "the headline's configurations: "). Unset, each is what ``run`` decides
    on the device at hand (:func:`cuda_kernel_default`)."""
    g.add_argument("--gemv", action=argparse.BooleanOptionalAction, default=None,
                   help=f"{what}run the projections of a decode or a verify on our few-row kernel: on CUDA the "
                        "Triton GEMV (<= 256 rows, bf16/fp16), tuned per weight shape on first use (default: the "
                        "device profile's measured choice, else on); on CPU a C kernel (<= 256 rows, float32), built "
                        "once with the system compiler (default: on when speculating)")
    g.add_argument("--decode-attn", action=argparse.BooleanOptionalAction, default=None,
                   help=f"{what}run the attention of a decode, verify or draft step (<= 64 query rows, bf16/fp16, CUDA) "
                        "on our Triton kernel made for a few rows over the static cache; past 16 rows a shape keeps SDPA "
                        "where SDPA is faster; longer prefills keep SDPA (default on CUDA: the device profile's measured "
                        "choice, else on)")


def add_model_args(p: argparse.ArgumentParser, max_new_tokens: int | None, max_new_help: str = "") -> None:
    """The model, device, dtype and drafter flags (``run`` and ``bench`` alike), declared once."""
    g = p.add_argument_group("model")
    g.add_argument("--model", default="default", help="'default' (SmolLM2-135M-Instruct), an HF directory or a .gguf file")
    g.add_argument("--max-new-tokens", type=int, default=max_new_tokens, help=max_new_help or None)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    g.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU) | float32 | bfloat16 | float16")
    s = p.add_argument_group("speculation")
    s.add_argument("--draft", default="default", help=f"{DRAFT_CHOICES} (default: the drafter shipped for the default model)")
    s.add_argument("--steps", type=int, default=None, help="draft steps per cycle (default: the tree measured fastest "
                        "for this drafter on this device, from its profile; else 3 for a chain, 5 for a tree; n-gram 4)")
    s.add_argument("--topk", type=int, default=None, help="children per tree node (default: the device profile's, else 1 "
                        "= chain); any tree flag given sets the whole tree (the profile's is used only with none)")
    s.add_argument("--draft-tokens", type=int, default=None, help="tokens verified per cycle, root included")
    s.add_argument("--lookup-tokens", type=int, default=None, metavar="K",
                   help="beside an EAGLE-3 tree, a prompt-lookup branch of K tokens (what followed the latest earlier "
                        "occurrence of the last 1-4 tokens), verified with the tree: text that repeats itself is "
                        "accepted further (default: the device profile's for the batch size, else 0: none)")
    s.add_argument("--lookup-spill", action=argparse.BooleanOptionalAction, default=None,
                   help="where the context's last token never occurred before (the branch has nothing to copy), "
                        "verify the drafter's best --draft-tokens + K nodes in the branch's rows instead, chosen per "
                        "row and cycle (default: wherever the drafter's expansion holds that many nodes; on an H100 "
                        "it took batch 1 on MT-bench from 2.30x to 2.35x, batch 8 unchanged; --no-lookup-spill: never)")
    s.add_argument("--serving", choices=("sglang", "vllm"), default=None,
                   help="read the drafter's aux layer ids as this engine would (default: the checkpoint format's)")


@dataclass
class Session:
    args: argparse.Namespace
    target: Any
    device_label: str
    device_reason: str
    dtype_name: str
    dtype_reason: str
    spec: Any
    spec_label: str
    sampling: Any
    drafter: Any = None
    draft: DraftChoice | None = None  # what --draft became: its kind and a factory of fresh drafters (bench, tune)
    notes: list[str] = field(default_factory=list)
    runner_factory: Callable[..., Any] | None = None
    kernels: Any = None  # the layers' elementwise kernels (compiled with --compile), shared by every engine
    # On CPU, the few-row C kernel by default where it timed faster than MKL: plain engines at one row, speculative
    # ones at the verify's rows; True: that side's engines run their projections on MKL
    plain_on_mkl: bool = False
    spec_on_mkl: bool = False

    def generator(self):
        import torch

        g = torch.Generator(device=self.target.device)
        g.manual_seed(self.args.seed)
        return g

    def run_info(self, baseline: bool = False) -> dict[str, Any]:
        from eaglelab import __version__

        return {"model": self.target.name, "digest": self.target.digest, "eaglelab_version": __version__,
                "baseline": baseline}

    def engine(self, observer=None, spec=None, drafter=None, baseline: bool = False, runner=None):
        """The engine for this session (speculative when a drafter was chosen); ``baseline`` marks
        its runs as the plain baseline of a speculative run in the records they write. ``runner`` (from
        :meth:`runner`) lets engines of the same spec and drafter share captured graphs and static caches."""
        from eaglelab.engine.runtime.generate import Engine

        spec = spec or self.spec
        drafter = drafter if drafter is not None else self.drafter
        runner = runner if runner is not None else self.runner(spec, drafter)
        engine = Engine(
            self.target.model, eos_token_ids=self.target.eos_token_ids, drafter=drafter if spec.enabled else None,
            spec=spec, observer=observer, runner=runner, run_info=self.run_info(baseline),
        )
        return engine

    def runner(self, spec=None, drafter=None):
        """A new runner for an engine of ``spec`` and ``drafter`` (the session's by default): CUDA graphs when
        the session has them, else eager (None: the engine's own)."""
        spec = spec or self.spec
        drafter = drafter if drafter is not None else self.drafter
        return self.runner_factory(spec, drafter) if self.runner_factory else self._eager_runner(spec, drafter)

    def _eager_runner(self, spec, drafter):
        """An eager runner with the session's compiled kernels (None: the engine's own runner)."""
        from eaglelab.engine.runtime.reasons import EAGER_NO_CUDA, EAGER_OFF
        from eaglelab.engine.runtime.runner import EagerRunner

        kernels = self.eager_kernels(spec.enabled)
        if kernels is None:  # MKL, not the kernel (the engine's own runner)
            return None
        net = drafter.net if spec.enabled and drafter is not None else None
        return EagerRunner(self.target.model, net, reason=EAGER_NO_CUDA if spec.cuda_graphs else EAGER_OFF,
                           kernels=kernels)

    def eager_kernels(self, speculative: bool):
        """The kernels an eager engine of that side runs: the session's, less the few-row CPU kernel where the side
        runs on MKL (:attr:`plain_on_mkl`, :attr:`spec_on_mkl`); None: the layers' own (MKL)."""
        from dataclasses import replace

        from eaglelab.engine.model.layers import EAGER_KERNELS

        kernels = self.kernels
        if kernels is None or not (self.spec_on_mkl if speculative else self.plain_on_mkl):
            return kernels
        return None if kernels == replace(EAGER_KERNELS, gemv=kernels.gemv) else replace(kernels, gemv=None)

    def warm_up_tokens(self, spec=None) -> int:
        """Tokens a timed run generates first, untimed (``Engine.generate(warm_up=...)``), so its CUDA graphs are
        captured and replayed once before the clock starts: two speculative cycles (both graphs of the observed
        cycle) or two decode steps. 0 without CUDA graphs (an eager run's first cycles cost what the others do)."""
        if self.runner_factory is None:
            return 0
        spec = spec or self.spec
        return 2 * (spec.max_depth + 1) + 2 if spec.enabled else 3

    def plain_engine(self, observer=None, runner=None):
        """Plain decoding with the same model and graph setting: the baseline of a speculative run
        (``runner``: from ``runner(spec.plain(), None)``, to share one between baseline engines)."""
        return self.engine(observer=observer, spec=self.spec.plain(), drafter=None, baseline=True, runner=runner)

    def observer(self, record: str | None = None, tensorboard: str | None = None, always: bool = False):
        """A probe bus with the requested sinks (None when nothing asks for one), and a closer."""
        if not (record or tensorboard or always):
            return None, lambda: None
        from eaglelab.probes.bus import ProbeBus

        bus = ProbeBus()
        closers: list[Callable[[], None]] = []
        if record:
            from eaglelab.probes.record import RecordWriter

            writer = RecordWriter(record, mode="replace" if getattr(self.args, "force", False) else "new")
            bus.subscribe(writer)
            closers.append(writer.close)
        if tensorboard:
            from eaglelab.probes.sinks import TensorBoardSink

            sink = TensorBoardSink(tensorboard)
            bus.subscribe(sink)
            closers.append(sink.close)

        def finish() -> None:
            for close in closers:
                close()

        return bus, finish


def build_session(args: argparse.Namespace, log: Callable[[str], None] = print, tp=None) -> Session:
    """Load the target and drafter the flags name; every auto choice keeps its reason."""
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.engine.formats.loader import load_target
    from eaglelab.engine.runtime.sampling import SamplingParams

    device, device_reason = rank_device(*pick_device(args.device), tp)
    dtype_name, dtype_reason = pick_dtype(args.dtype, device)
    try:
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    except ValueError as exc:
        raise EagleLabError(str(exc), field="--temperature/--top-k/--top-p") from None
    if args.max_new_tokens < 1:
        raise EagleLabError("must be >= 1", field="--max-new-tokens", found=args.max_new_tokens)
    target = load_target(args.model, device=device, dtype=dtype_name, tp=tp)
    session = Session(args, target, device_name(device), device_reason, dtype_name, dtype_reason, None, "", sampling,
                      notes=list(target.notes))  # how the target was read (quantized weights dequantized on load)
    _choose_drafter(session, log)
    pdl = _dependent_launches(session, device)
    if session.spec.compile:
        from eaglelab.engine.formats.assets import cache_dir
        from eaglelab.engine.runtime.compile import compiled_kernels, inductor_cache_dir

        session.kernels = compiled_kernels(cache_dir(), log, pdl=pdl)
        session.notes.append(f"compile: each captured phase with torch.compile on first use, cached in "
                             f"{inductor_cache_dir(cache_dir())}")
        if tp is not None and tp.world_size > 1:
            session.notes.append("all-reduce timing: the collectives of compiled phases run untimed (clocks and "
                                 "CUDA events cannot be compiled); --no-compile times every one")
    if session.spec.compile_prefill:
        session.notes.append(compile_prefill_note(session.spec, device.type))
    gemv = getattr(args, "gemv", None)  # commands that declare no --gemv build sessions too
    if device.type == "cpu":  # default: on for speculation (its verify's rows); plain decoding where it times faster
        if gemv or (gemv is None and session.spec.enabled):
            _add_cpu_gemm(session, log)
            if gemv is None:  # each side where it times faster: the verify's rows, and the plain baseline's one
                spec = session.spec
                faster = _on_cpu_kernel(session, spec.draft_tokens + spec.lookup_tokens, 1)
                session.spec_on_mkl, session.plain_on_mkl = (not f for f in faster)
        elif gemv is None:  # --draft none: the kernel only where it times faster than MKL at one row
            _add_cpu_gemm(session, log, quiet=True)
            (faster,) = _on_cpu_kernel(session, 1)
            session.plain_on_mkl = not faster
        if getattr(args, "decode_attn", None):
            _add_decode_attn(session, log)
    else:
        profile = session.draft.profile
        # the profile's tilings, where they fit its setup and launches
        gemv_with_tilings = functools.partial(_add_gemv, profile=profile, pdl=pdl)
        for flag, field, add, library in (("--gemv", "gemv", gemv_with_tilings, "cuBLAS"),
                                          ("--decode-attn", "decode_attn", _add_decode_attn, "SDPA")):
            on, why = cuda_kernel_default(getattr(args, field, None), profile, flag, library)
            if why:
                session.notes.append(why)
            if on:
                add(session, log)
    if pdl and not session.spec.compile:  # graphs of eager pieces: our kernels' launches only
        from dataclasses import replace

        from eaglelab.engine.model.layers import EAGER_KERNELS

        session.kernels = replace(session.kernels or EAGER_KERNELS, pdl=True)
    if session.spec.cuda_graphs and device.type == "cuda":
        session.runner_factory = _graph_runner_factory(session)
        session.notes.append("CUDA graphs: captured lazily per batch bucket (an EAGLE-3 cycle as one graph where it "
                             "can be, else a graph per phase); fallbacks say why")
    return session


def _dependent_launches(s: Session, device: Any) -> bool:
    """--pdl: whether this session's captured phases launch their kernels dependently; the note says so, or why
    not (a CPU, a GPU before Hopper, no CUDA graphs, a torch or Triton without it)."""
    asked = getattr(s.args, "pdl", None)  # commands that declare no --pdl build sessions too
    measured = pdl_default(s.draft.profile if s.draft is not None else None) if asked is None else None
    if not (asked or measured):
        return False
    from eaglelab.engine.model.pdl import refusal

    why = refusal(device) or (None if s.spec.cuda_graphs else "it applies to captured phases (--no-cuda-graphs)")
    if why is not None:
        s.notes.append(f"--pdl: off, {why}")
        return False
    compiled = "inductor's kernels and ours" if s.spec.compile else "our kernels (the rest uncompiled)"
    s.notes.append(f"--pdl: {compiled} launch dependently in the captured phases (each starts while the one "
                   "before finishes, then waits for its results)" + (f"; {measured}" if measured else ""))
    return True


def pdl_default(profile: Any) -> str | None:
    """Where ``--pdl`` is not given: why it is on by default (the device profile measured it on), or None (off: no
    profile, or one measured without it)."""
    if profile is None or not profile.pdl:
        return None
    kin = f", a GPU of this {profile.stands_in_for}'s family" if profile.stands_in_for else ""
    return f"on by default, as measured on {profile.device}{kin} ({profile.kernels_reason}); --no-pdl to change it"


def cuda_kernel_default(asked: bool | None, profile: Any, flag: str, library: str) -> tuple[bool, str | None]:
    """Whether a CUDA session runs one of our kernels (``--gemv``, ``--decode-attn``), and why when the user did
    not say: the device profile's measured choice, else on. Both kernels judge themselves per shape on first use
    (the GEMV keeps cuBLAS where cuBLAS is faster; the decode attention keeps SDPA past 16 query rows where SDPA
    is faster), so on a GPU nobody measured, on is the choice that cannot lose much."""
    if asked is not None:
        return asked, None
    field = flag.lstrip("-").replace("-", "_")
    measured = getattr(profile, field, None) if profile is not None else None
    if measured is not None:
        kin = f", a GPU of this {profile.stands_in_for}'s family" if profile.stands_in_for else ""
        return measured, (f"{flag}: {'on' if measured else 'off'} by default, as measured on {profile.device}{kin} "
                          f"({profile.kernels_reason}); --{'no-' if measured else ''}{flag[2:]} to change it")
    return True, (f"{flag}: on by default (no measured profile for this drafter and GPU; each shape keeps {library} "
                  f"where {library} times faster on first use; `eaglelab tune` measures a profile); "
                  f"--no-{flag[2:]} to turn it off")


def compile_prefill_note(spec, device_type: str) -> str:
    """What --compile-prefill does in this session: the prompt's captured phases compiled, or why not."""
    if spec.compile and spec.cuda_graphs and device_type == "cuda":
        return ("compile-prefill: the prompt's phases compiled too, once per batch bucket and padded prompt width "
                "(~30 s a width the first time, then from the disk cache; never counted in tok/s)")
    why = "no CUDA graphs on a CPU" if device_type != "cuda" else "without --compile and --cuda-graphs"
    return f"compile-prefill: off ({why}: it compiles the prompt's captured phases); the prompt runs as without it"


def _add_gemv(s: Session, log: Callable[[str], None], profile: Any = None, pdl: bool = False) -> None:
    """--gemv: the session's kernels take the Triton GEMV (where it cannot run, a note says why), with the device
    this machine's cached tilings and ``profile``'s where they were measured on this setup
    (:func:`eaglelab.gemv_cache.prepare`); under ``pdl`` (--pdl) its shapes are tuned, cached and adopted as
    dependent launches, apart from plain launches' choices."""
    from eaglelab.engine.model.gemv import MAX_ROWS, TritonGemv, dtype_refusal
    from eaglelab.gemv_cache import prepare

    gemv = TritonGemv(log, pdl=pdl)
    prepare(gemv, profile, s.target.device, s.target.dtype, log)  # as bench's: the setup decides, not the device
    _add_triton_kernel(s, "--gemv", "gemv", gemv, dtype_refusal, "F.linear",
                       f"projections of <= {MAX_ROWS} rows on the Triton GEMV (bf16/fp16; F.linear per shape where it "
                       "is faster)")


def _add_decode_attn(s: Session, log: Callable[[str], None]) -> None:
    """--decode-attn: the session's kernels take the Triton decode attention (where it cannot run, a note says why)."""
    from eaglelab.engine.model.decode_attention import TritonDecodeAttention, dtype_refusal

    _add_triton_kernel(s, "--decode-attn", "attention", TritonDecodeAttention(log), dtype_refusal, "SDPA",
                       "attention of <= 64 query rows on the Triton decode attention (bf16/fp16; past 16 rows SDPA "
                       "per shape where it is faster); longer prefills on SDPA")


def _add_triton_kernel(s: Session, flag: str, field: str, kernel: Any, dtype_refusal: Callable[[Any], str | None],
                       instead: str, on: str) -> None:
    """``kernel`` into the session's kernels as ``field``; the note says what runs, or why ``instead`` does (the
    device first: off a CUDA device, Triton would not help)."""
    from dataclasses import replace

    from eaglelab.engine.model.layers import EAGER_KERNELS

    s.kernels = replace(s.kernels or EAGER_KERNELS, **{field: kernel})
    if s.target.device.type != "cuda":
        s.notes.append(f"{flag}: off on {s.target.device.type} (a CUDA kernel), {instead} instead")
    elif kernel.reason is not None:
        s.notes.append(f"{flag}: off, {instead} instead: {kernel.reason}")
    elif (why := dtype_refusal(s.target.dtype)) is not None:
        s.notes.append(f"{flag}: off for {why}, {instead} instead")
    else:
        s.notes.append(f"{flag}: {on}")


def _add_cpu_gemm(s: Session, log: Callable[[str], None], quiet: bool = False) -> None:
    """On CPU (with a drafter unless --no-gemv, or --gemv; for plain decoding by default, ``quiet``): the few-row C
    kernel for float32 projections of <= 256 rows; where it cannot build or the weights are not float32, a note says
    why (unless ``quiet``: plain decoding then runs MKL as it always could) and MKL runs them."""
    from dataclasses import replace

    from eaglelab.engine.formats.assets import cache_dir
    from eaglelab.engine.model.cpu_gemm import CpuGemm
    from eaglelab.engine.model.layers import EAGER_KERNELS

    gemm = CpuGemm(cache_dir(), None if quiet else log)
    if gemm.reason is not None:
        if not quiet:
            s.notes.append(f"gemv: {gemm.reason}")
    elif s.dtype_name != "float32":
        if not quiet:
            s.notes.append(f"gemv: few-row CPU kernel off for {s.dtype_name} weights (it takes float32): MKL instead")
    else:
        s.kernels = replace(s.kernels or EAGER_KERNELS, gemv=gemm)
        if not quiet:
            s.notes.append("gemv: projections of <= 256 rows (decode, verify, short prompts) on the few-row CPU "
                           "kernel (--no-gemv: MKL)")


def _on_cpu_kernel(s: Session, *rows: int) -> tuple[bool, ...]:
    """For each row count of ``rows``, whether the engines it stands for take the few-row C kernel: that many rows
    through the target's projections timed on it and on MKL, now, in one timing over one packing of the weights
    (which is faster depends on the CPU, the torch build's MKL and whether the weights are bfloat16-exact, which the
    kernel then reads in half the bytes); a note each gives both times. One row: plain decoding (a --draft none run,
    and a speculative run's baseline); a verify's rows: the speculative engines (verify and drafter). All False
    where the kernel is off."""
    import torch

    from eaglelab.engine.model.cpu_gemm import time_rows
    from eaglelab.engine.model.layers import fused_linears

    gemm = s.kernels.gemv if s.kernels is not None else None
    if gemm is None or gemm.reason is not None:
        return tuple(False for _ in rows)
    weights, first = [], {}
    for fused in fused_linears(s.target.model):
        key = (sum(lin.weight.shape[0] for lin in fused.linears), fused.linears[0].weight.shape[1])
        if key not in first:  # one per shape (a 135M model has 5 shapes in 121 projections); a single one uncopied
            ws = [lin.weight.detach() for lin in fused.linears]
            first[key] = ws[0] if len(ws) == 1 else torch.cat(ws)
        weights.append(first[key])
    timed = time_rows(gemm, weights, rows)
    for n, got in zip(rows, timed):
        on = "on the few-row CPU kernel" if got.kernel_faster else "on MKL"
        flag = "--no-gemv: MKL" if got.kernel_faster else "--gemv: the kernel"
        side, what = ("plain decoding", "one row") if n == 1 else ("speculation", f"the verify's {n} rows")
        s.notes.append(f"gemv: {side} {on}: {what} through every projection {got.kernel_ms:.1f} ms on the "
                       f"kernel, {got.mkl_ms:.1f} ms on MKL, timed now ({flag})")
    return tuple(got.kernel_faster for got in timed)


def _graph_runner_factory(s: Session) -> Callable[..., Any]:
    """Builds a CUDA-graph runner per engine, its static cache sized for prompts up to 1024 tokens
    plus --max-new-tokens (longer runs fall back to eager and say so)."""
    from eaglelab.engine.model.layers import EAGER_KERNELS
    from eaglelab.engine.runtime.cuda_graphs import CudaGraphRunner

    max_len = -(-(s.args.max_new_tokens + 1024 + 2 * 64) // 256) * 256

    def make(spec, drafter):
        return CudaGraphRunner.for_engine(s.target.model, spec, drafter, max_len=max_len, kernels=s.kernels or EAGER_KERNELS)

    return make


def _choose_drafter(s: Session, log: Callable[[str], None]) -> None:
    """Resolve --draft and the spec flags (through the drafter registry) into ``s.spec`` and ``s.drafter``."""
    from eaglelab.engine.runtime.generate import runs_one_graph_cycle

    a = s.args
    graphs = a.cuda_graphs if a.cuda_graphs is not None else s.target.device.type == "cuda"
    compile_ = a.compile if a.compile is not None else graphs
    modes = dict(attention_mode=a.attention_mode, cuda_graphs=graphs, compile=compile_,
                 one_graph_cycle=getattr(a, "one_graph_cycle", True),
                 compile_prefill=getattr(a, "compile_prefill", False),  # commands without these build sessions too
                 lookup_spill=getattr(a, "lookup_spill", None))
    where = Where(profile_device(s.target.device), s.dtype_name, batch=1)  # run, trace and the TUI: one prompt
    s.draft = choose_drafter(a.draft, a.model, s.target.model, TreeFlags.from_args(a), modes=modes,
                             serving=a.serving, log=log, where=where)
    s.spec, s.drafter = s.draft.spec, s.draft.drafter()
    s.notes += s.draft.notes
    if not s.spec.enabled:
        s.spec_label = "off"
        return
    sp = s.spec
    spill = " (spilling into the tree when nothing repeats)" if sp.spills else ""
    lookup = f" + a lookup branch of {sp.lookup_tokens}{spill}" if sp.lookup_tokens else ""
    s.spec_label = (f"{sp.algorithm}, {sp.num_steps} steps, topk {sp.topk}, {sp.draft_tokens}{lookup} tokens per verify, "
                    f"verify attention mode {sp.attention_mode}"
                    + (", one CUDA graph per cycle" if sp.cuda_graphs and runs_one_graph_cycle(sp, s.drafter, s.target.model)
                       else ""))
