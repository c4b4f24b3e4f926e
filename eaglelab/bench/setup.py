"""``eaglelab bench``'s flags turned into what it measures: the target (a real model through the session, or a
scale model of random weights), the drafter (both through the drafter registry), the prompts and the
:class:`~eaglelab.bench.harness.BenchContext`, with every device default and the reason for each choice."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

from eaglelab.bench import harness as B
from eaglelab.engine.runtime.spec_config import tree_label
from eaglelab.flags import int_list

# Per device, what a flag left out measures. The headline (no --configs, no --full): a few minutes at most, batch
# 1 and 8 on CUDA, batch 1 and a few prompts on a CPU; passes interleave, three of them so their spread shows.
# --full sweeps the batch sizes a server sees; on a CPU still short enough to finish in minutes on a laptop.
# The HF peer is a reference, not the headline: there it times its first group of prompts at each batch size, once,
# at most HF_HEADLINE_TOKENS a row (eager HF decodes 16.8 tok/s at batch 1 on the H200, and even so capped took
# 14.4 s of a 193.5 s headline: benchmarks/results/h200_2026-12-03b/D/bench_default.txt).
HF_HEADLINE_TOKENS = 32
HEADLINE_GPU = {"batch_sizes": "1,8", "prompts": 8, "max_new_tokens": 64, "repeats": 3, "micro_batch_sizes": "1,8",
                "hf_max_new_tokens": HF_HEADLINE_TOKENS}
HEADLINE_CPU = {"batch_sizes": "1", "prompts": 3, "max_new_tokens": 32, "repeats": 3, "micro_batch_sizes": "1",
                "hf_max_new_tokens": HF_HEADLINE_TOKENS}
GPU_DEFAULTS = {"batch_sizes": "1,2,4,8,16,32", "prompts": 8, "max_new_tokens": 64, "repeats": 3,
                "micro_batch_sizes": "1,8,32"}
CPU_DEFAULTS = {"batch_sizes": "1,2", "prompts": 2, "max_new_tokens": 32, "repeats": 3, "micro_batch_sizes": "1"}
HBM_TBPS_CUDA = 4.3  # --hbm-tbps's default on CUDA: an H200's memory bandwidth (none on CPU)
TP_PEER_SKIP = "HF peer skipped under --tp (it runs on one GPU; compare with a --tp 1 run)"


@dataclass(frozen=True)
class BenchSetup:
    """What a bench run measures with, and what its report says about it."""

    ctx: B.BenchContext
    notes: tuple[str, ...]
    model: str  # the name the report prints
    weight_bytes: int  # read per decoded token: the weight-bandwidth bound's numerator
    micro_batch_sizes: tuple[int, ...]
    device_reason: str
    dtype_reason: str
    dtype_name: str
    regime: Any = None  # configs.Regime: how `run` decodes here (the headline's configurations)

    @property
    def hbm_tbps(self) -> float:
        """The bandwidth of the bound unless --hbm-tbps says otherwise."""
        return HBM_TBPS_CUDA if self.ctx.device.type == "cuda" else 0.0


def setup_bench(args: argparse.Namespace, log: Callable[[str], None], tp: Any = None,
                texts: list[str] | None = None, what: str = "MT-bench first turns") -> BenchSetup:
    """Load (or build) the target and drafter, the prompts (``texts``, else --prompts MT-bench first turns;
    ``what``: how the notes name them), and the bench context."""
    from eaglelab.devices import pick_device, pick_dtype, rank_device

    if getattr(args, "continuous", False) and tp is not None:
        from eaglelab.engine.errors import EagleLabError

        raise EagleLabError("continuous batching has not been tried under tensor parallelism", field="--continuous",
                            found=f"with --tp {args.tp}", hint="serve without --tp, or measure --tp in batches")
    device, device_reason = rank_device(*pick_device(args.device), tp)
    dtype_name, dtype_reason = pick_dtype(args.dtype, device)
    d = defaults_for(args, device.type)
    batch_sizes = int_list(args.batch_sizes or d["batch_sizes"], "--batch-sizes")
    max_new = args.max_new_tokens or d["max_new_tokens"]
    texts = texts or B.mtbench_first_turns(args.prompts or d["prompts"], args.questions)
    check_draft_vocab(args)
    built = (_scale_setup(args, device, dtype_name, log, tp) if args.scale_model
             else _model_setup(args, max_new, log, tp))
    keep, window_note = prompt_tokens_in_window(built["target"].config, args.max_prompt_tokens, max_new)
    prompts, how = B.tokenize_prompts(texts, built["tokenizer"], built["target"].config.vocab_size, keep)
    cpu = device.type == "cpu"
    ctx = B.BenchContext(
        target=built["target"], spec=built["spec"], make_drafter=built["make_drafter"], prompts=prompts,
        max_new_tokens=max_new, batch_sizes=batch_sizes, repeats=args.repeats or d["repeats"],
        peer=capped_peer(built["peer"], d.get("hf_max_new_tokens")), peer_skip=built.get("peer_skip"), log=log, tp=tp,
        compile_mode=None if args.compile_mode == "default" else args.compile_mode,
        compile_prefill=args.bench_compile_prefill,
        eager_kernels=built.get("kernels") if cpu else None,  # as `run`: each side on the few-row C kernel
        plain_kernels=built.get("plain_kernels") if cpu else None,  # or MKL, whichever timed faster
        tree_for=built["tree_for"], observe=observes(args), profile=built["profile"],
        continuous=getattr(args, "continuous", False), refill_rows=_refill_rows(args),
        eos_token_ids=_eos_ids(args, built),
    )
    regime = run_regime(args, device.type, built["profile"])
    notes = built["notes"] + ([compile_prefill_note(device.type)] if args.bench_compile_prefill else [])
    notes += [f"run's regime here: {regime.label}", *regime.reasons, *tree_notes(built["draft"], batch_sizes)]
    for note in notes:  # why this tree, said before the long part (the report repeats it at the end)
        if note.startswith("tree"):
            log(note)
    notes += [f"prompts: {len(prompts)} {what}, {how}; "
              f"{min(map(len, prompts))}..{max(map(len, prompts))} tokens",
              generation_note(max_new, ctx.eos_token_ids), *peer_note(built["peer"] if runs_hf(args) else None, d, max_new)]
    notes += [window_note] if window_note and max(map(len, prompts)) == keep else []
    if ctx.continuous:  # a queue no longer than the rows is one batch of that many rows, not a full one
        notes += [f"--continuous: the {len(prompts)} prompts served through each batch size's rows; at batch {b} "
                  f"that is one batch of {len(prompts)} rows" for b in batch_sizes if len(prompts) <= b]
        served = [f"{ctx.refill_at(b)} at batch {b}" for b in batch_sizes if len(prompts) > b]
        notes += [f"--continuous: free rows wait for {', '.join(served)} to be prefilled together"] if served else []
    micro_bs = int_list(args.micro_batch_sizes or d["micro_batch_sizes"], "--micro-batch-sizes")
    return BenchSetup(ctx, tuple(notes), built["name"], built["weight_bytes"], micro_bs, device_reason, dtype_reason,
                      dtype_name, regime)


def _eos_ids(args: argparse.Namespace, built: dict[str, Any]) -> tuple[int, ...]:
    """The ids that end a row: the model's end-of-sequence ids with --eos, and by default when serving
    (--continuous: a server's requests end where their answers do; a scale model of random weights has none, and
    serves every row --max-new-tokens long); () with --no-eos, and by default in batches (every row as long)."""
    asked = getattr(args, "eos", None)
    if asked is None:  # the default: honoured when serving, where the model has any
        return tuple(built.get("eos") or ()) if getattr(args, "continuous", False) else ()
    if not asked:
        return ()
    from eaglelab.engine.errors import EagleLabError

    if not built.get("eos"):
        found = f"--scale-model {args.scale_model}" if args.scale_model else "a model without end-of-sequence ids"
        raise EagleLabError("no end-of-sequence token to end rows at", field="--eos", found=found,
                            expected="a real model whose tokenizer or config names its EOS (--model)",
                            hint="drop --eos (every row then runs --max-new-tokens), or bench a real model")
    return built["eos"]


def generation_note(max_new: int, eos: tuple[int, ...]) -> str:
    """How long a row runs: always ``max_new`` tokens, or (--eos) until the model's end of sequence."""
    if not eos:
        return f"generation: {max_new} tokens per row, EOS ignored, greedy"
    return (f"generation: up to {max_new} tokens per row, each ending at the model's EOS ({', '.join(map(str, eos))}) "
            "as a served request does, greedy; tok/s counts the tokens each configuration made")


def _refill_rows(args: argparse.Namespace) -> int | None:
    """--refill-rows, checked: a positive count, and only with --continuous (batches have no refills)."""
    n = getattr(args, "refill_rows", None)
    if n is None:
        return None
    from eaglelab.engine.errors import EagleLabError

    if not getattr(args, "continuous", False):
        raise EagleLabError("--refill-rows only means something to rows served continuously", field="--refill-rows",
                            found=f"{n} without --continuous", hint="add --continuous, or drop --refill-rows")
    if n < 1:
        raise EagleLabError("a refill needs at least one free row", field="--refill-rows", found=str(n),
                            hint="1 refills each row as soon as it is free; leave it out for a quarter of the batch")
    return n


def capped_peer(peer: Callable[[], Any] | None, tokens: int | None) -> Callable[[], Any] | None:
    """The HF peer's builder, its generate making at most ``tokens`` a row (None: as many as asked)."""
    if peer is None or tokens is None:
        return peer

    def build() -> Callable[[list[list[int]], int], Any]:
        generate = peer()
        return lambda group, max_new: generate(group, min(max_new, tokens))

    return build


def runs_hf(args: argparse.Namespace) -> bool:
    """Whether the HF peer is among the configurations (the headline's, --full's, or named in --configs)."""
    return args.configs is None or "hf" in [c.strip() for c in args.configs.split(",")]


def peer_note(peer: Callable[[], Any] | None, defaults: dict[str, Any], max_new: int) -> list[str]:
    """What the HF peer times, when it runs: its first group of prompts, once, and how many tokens a row."""
    if peer is None:
        return []
    tokens = min(max_new, defaults.get("hf_max_new_tokens") or max_new)
    return [f"HF generate (a reference): the first group of prompts at each batch size, one pass, {tokens} tokens per "
            "row" + (f" (its tok/s over {tokens}, prefill included; ours over {max_new})" if tokens < max_new else "")]


def prompt_tokens_in_window(config: Any, max_prompt_tokens: int, max_new: int) -> tuple[int, str | None]:
    """(tokens a prompt keeps, the note when the window cut it below --max-prompt-tokens): a prompt and its
    --max-new-tokens must fit the target's context window, as in `run`; bench cuts longer prompts (as it cuts at
    --max-prompt-tokens) and says so, and refuses --max-new-tokens that leave no room for a prompt."""
    from eaglelab.engine.runtime.limits import check_context

    check_context(config, 1, max_new)  # refuses, naming --max-new-tokens and the window
    room = config.max_position_embeddings - max_new
    if max_prompt_tokens <= room:
        return max_prompt_tokens, None
    return room, (f"prompts cut at {room} tokens: with --max-new-tokens {max_new} that fills the target's context "
                  f"window of {config.max_position_embeddings} tokens (max_position_embeddings)")


def headline_only(args: argparse.Namespace) -> bool:
    """A run with no --configs and no --full measures the headline alone (:func:`eaglelab.bench.suite.configs_for`)."""
    return not getattr(args, "full", False) and args.configs is None and getattr(args, "tp", None) is None


def defaults_for(args: argparse.Namespace, device_type: str) -> dict[str, Any]:
    """What the flags left out measure on this device: the headline's short run, else the full sweep's."""
    if headline_only(args):
        return HEADLINE_GPU if device_type == "cuda" else HEADLINE_CPU
    return GPU_DEFAULTS if device_type == "cuda" else CPU_DEFAULTS


def observes(args: argparse.Namespace) -> bool:
    """Whether each configuration gets an observed pass for its phase costs: asked (--phase-costs), else with the
    full sweep, named configurations or --profile; the headline alone times end to end only (its compiled cycle
    observed would be compiled again, with its timing marks)."""
    asked = getattr(args, "phase_costs", None)
    return asked if asked is not None else (not headline_only(args) or bool(getattr(args, "profile", False)))


def run_regime(args: argparse.Namespace, device_type: str, profile: Any, compile_asked: bool | None = None):
    """How ``eaglelab run`` would decode on this device, with the reason for each choice: on CUDA, graphs of
    torch.compile'd phases (run's default; ``compile_asked``: tune's --compile / --no-compile) and our kernels as
    :func:`eaglelab.session.cuda_kernel_default` picks them (the device profile's measured choice, else on; --gemv /
    --decode-attn change them); on a CPU eager (the session's kernels: the few-row C kernel when speculating)."""
    from eaglelab.bench.configs import Regime
    from eaglelab.session import cuda_kernel_default, pdl_default

    if device_type != "cuda":
        gemv = getattr(args, "gemv", None)
        why = ("no CUDA graphs on a CPU: eager, as `run` decodes here",)
        why += ("--pdl: off (dependent launches are a CUDA feature)",) if getattr(args, "bench_pdl", None) else ()
        return Regime(graphs=False, gemv=gemv is not False, reasons=why)
    if compile_asked is False:
        reasons = ["compile: off (as flagged)"]
    else:
        reasons = ["compile: on with CUDA graphs (run's default)" if compile_asked is None else "compile: on (as flagged)"]
    on = {}
    for flag, name, library in (("--gemv", "gemv", "cuBLAS"), ("--decode-attn", "decode_attn", "SDPA")):
        on[name], why = cuda_kernel_default(getattr(args, name, None), profile, flag, library)
        reasons.append(why or f"{flag}: {'on' if on[name] else 'off'} (as flagged)")
    asked = getattr(args, "bench_pdl", None)  # bench's and tune's --pdl (the session's own is run's)
    measured = pdl_default(profile) if asked is None else None
    pdl = bool(asked or measured)
    if asked is not None:
        dependent = "the captured phases' kernels launched dependently"
        reasons.append(f"--pdl: {dependent if asked else 'off'} (as flagged)")
    elif measured:
        reasons.append(f"--pdl: {measured}")
    return Regime(graphs=True, compile=compile_asked is not False, gemv=on["gemv"], attn=on["decode_attn"],
                  reasons=tuple(reasons), pdl=pdl)


def tree_notes(draft: Any, batch_sizes: tuple[int, ...]) -> list[str]:
    """The tree at each batch size beyond 1 where it differs from batch 1's (the device profile's bucket for it)."""
    if draft is None or draft.kind != "eagle3":
        return []
    first, out = draft.tree_for(1), []
    for b in batch_sizes:
        t = draft.tree_for(b)
        if t != first:
            bucket = draft.profile.bucket(b) if draft.profile is not None and not draft.flags.given else None
            lent = f", measured on {bucket.measured_on} (lent by its family)" if bucket and bucket.measured_on else ""
            why = (f"the profile's bucket for batch <= {bucket.max_batch}{lent}: {bucket.measured or 'no figure recorded'}"
                   if bucket is not None else "")
            out.append(f"tree at batch {b}: {tree_label(t.steps, t.topk, t.draft_tokens, t.lookup_tokens)}"
                       + (f" ({why})" if why else ""))
    return out


def _model_setup(args, max_new: int, log, tp=None) -> dict[str, Any]:
    """A real target and its drafter, through the session `run` builds (so the same registry and kernels)."""
    from eaglelab.engine.model.scale_models import decode_weight_bytes
    from eaglelab.session import build_session

    args.max_new_tokens = max_new  # the device's bench default, resolved
    s = build_session(args, log=log, tp=tp)
    target = s.target
    eos = target.eos_token_ids
    common = dict(target=target.model, tokenizer=target.tokenizer, spec=s.spec, make_drafter=s.draft.make,
                  name=f"{target.name} ({target.config.num_layers} layers)", notes=list(s.notes),
                  weight_bytes=decode_weight_bytes(target.model), tree_for=s.draft.tree_for if s.draft.make else None,
                  draft=s.draft, profile=s.draft.profile, eos=eos)
    if tp is not None:
        return dict(common, peer=None, peer_skip=TP_PEER_SKIP)
    stop = eos if getattr(args, "eos", False) else ()
    peer = lambda: B.hf_generate_fn(_quiet(B.load_hf_peer)(target.path, target.device, target.dtype),  # noqa: E731
                                    target.device, stop)
    return dict(common, peer=peer, kernels=s.eager_kernels(True),
                plain_kernels=s.eager_kernels(False))


def compile_prefill_note(device_type: str) -> str:
    """What bench --compile-prefill does: the configurations that compile under CUDA graphs compile the prompt too."""
    from eaglelab.engine.runtime.spec_config import SpecConfig
    from eaglelab.session import compile_prefill_note as session_note

    if device_type == "cuda":
        return ("compile-prefill: the *-compile* configurations compile the prompt's phases too, once per batch bucket "
                "and padded prompt width (~30 s a width the first time, then from the disk cache; never in tok/s)")
    return session_note(SpecConfig(), device_type)  # off, and why


def _scale_setup(args, device, dtype_name: str, log, tp=None) -> dict[str, Any]:
    """A scale model of random weights and its drafter (the registry's random one for --draft default)."""
    from eaglelab.draft_registry import TreeFlags, random_drafter
    from eaglelab.engine.formats.loader import parse_dtype
    from eaglelab.engine.model.scale_models import build_scale_model, decode_weight_bytes

    dtype = parse_dtype(dtype_name)
    log(f"building {args.scale_model} with random weights on {device} ({dtype_name}) ...")
    # --tp (even 1): each full tensor drawn from its own seeded generator, so every TP size holds the same model
    per_tensor = args.tp is not None
    sm = build_scale_model(args.scale_model, device=device, dtype=dtype, seed=args.seed, tp=tp, per_tensor_seed=per_tensor)
    draft = random_drafter(args.draft, sm.model, TreeFlags.from_args(args), seed=args.seed + 1,
                           draft_vocab=args.draft_vocab, lookup_spill=getattr(args, "lookup_spill", None))
    peer, peer_skip = None, None
    if tp is not None:
        peer_skip = TP_PEER_SKIP
    elif sm.config.moe is None:
        peer = lambda: B.hf_generate_fn(_quiet(B.load_hf_peer)(sm.hf_config, device, dtype), device)  # noqa: E731
    else:
        peer_skip = "HF peer skipped: our kimi-like is GQA DeepSeek-V3 (not an HF architecture), and a 2nd copy would not fit"
    notes = [f"scale model {args.scale_model}: random weights; cost figures only, acceptance means nothing", *draft.notes]
    return dict(target=sm.model, tokenizer=default_tokenizer(), spec=draft.spec, make_drafter=draft.make, peer=peer,
                peer_skip=peer_skip, name=f"{args.scale_model} (random weights, {sm.config.num_layers} layers)",
                notes=notes, weight_bytes=decode_weight_bytes(sm.model), tree_for=draft.tree_for if draft.make else None,
                draft=draft, profile=None)


def check_draft_vocab(args: argparse.Namespace) -> None:
    """--draft-vocab sizes the scale model's random drafter only, and must hold the tree's topk tokens (said
    before any model is built)."""
    from eaglelab.draft_registry import TreeFlags, tree_defaults
    from eaglelab.engine.errors import EagleLabError

    if args.draft_vocab is None:
        return
    if not args.scale_model:
        raise EagleLabError("--draft-vocab sizes the random drafter of --scale-model", field="--draft-vocab",
                            found=args.draft_vocab, hint="a trained drafter's vocabulary is its own: drop --draft-vocab")
    topk = tree_defaults("eagle3", TreeFlags.from_args(args)).topk
    if args.draft_vocab < topk:
        raise EagleLabError("the draft vocabulary must hold at least --topk tokens", field="--draft-vocab",
                            found=args.draft_vocab, expected=f">= {topk}")


def default_tokenizer():
    """The default model's tokenizer if it is already converted here (never converts or downloads)."""
    from eaglelab.engine.formats.assets import cache_dir
    from eaglelab.engine.formats.loader import DEFAULT_MODEL_NAME
    from eaglelab.engine.formats.tokenizer import Tokenizer

    path = cache_dir() / "models" / DEFAULT_MODEL_NAME
    return Tokenizer(path) if (path / "tokenizer.json").exists() else None


def _quiet(fn):
    """``fn`` with transformers' logging at errors only (loading the peer warns about what we do not use) and no
    progress bar (its weights load in a blink, and the bar would land among the bench's own lines)."""
    def call(*a, **kw):
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        return fn(*a, **kw)

    return call
