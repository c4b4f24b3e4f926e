"""``eaglelab bench``: plain, speculative and HF decoding side by side on MT-bench prompts.

Configurations (``--configs``): plain-eager, plain-graphs, plain-compile, plain-graphs-gemv,
plain-compile-gemv, plain-compile-gemv-attn, spec-prefill, spec-prefill-graphs, spec-decode, spec-decode-graphs,
spec-compile, spec-compile-gemv, spec-compile-gemv-attn, hf (``*-compile``: graphs with torch.compile'd phases;
``*-gemv``: the projections of M <= 64 rows on our Triton GEMV kernel; ``*-attn``: also the attention of
<= 64 query rows on our Triton decode attention; these are skipped with the reason where Triton or CUDA is
missing or the model is float32, and run only when named). Graph configurations need CUDA (skipped on CPU, and
the speedup baseline is then plain-eager). ``--scale-model`` swaps the target for a random-weight
model of a named real shape (cost measurements only: acceptance on random weights means nothing).
``--tp N`` runs the same harness over N tensor-parallel ranks (launch with ``torchrun
--nproc-per-node N -m eaglelab bench --tp N ...``; rank 0 prints and writes the JSON) and adds where
the all-reduces go: their share of a decode and a verify step, per-site cost, arrival skew.
"""

from __future__ import annotations

import argparse
from typing import Any

from eaglelab.session import add_model_args

GPU_DEFAULTS = {"batch_sizes": "1,2,4,8,16,32", "prompts": 8, "max_new_tokens": 64, "repeats": 2,
                "micro_batch_sizes": "1,8,32"}
CPU_DEFAULTS = {"batch_sizes": "1,2", "prompts": 2, "max_new_tokens": 32, "repeats": 2, "micro_batch_sizes": "1"}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark plain vs speculative decoding (graphs on/off, both verify modes) vs HF generate",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    add_model_args(p, max_new_tokens=None, max_new_help="tokens per row, EOS ignored (default CUDA 64, CPU 32)")
    p.add_argument("--scale-model", default=None, metavar="NAME",
                   help="random weights of a named shape instead of --model (--draft default: a random EAGLE-3 "
                        "drafter, for cost): llama3.1-8b | kimi-like | smollm2-135m | tiny")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="with --scale-model: the random drafter's draft vocabulary (default 32000; the shipped "
                        "SmolLM2 drafter has 12288): the tree's top-k runs over it every draft step")
    # Greedy, and each configuration chooses graphs, compile, the verify mode and the Triton kernels: not flags here
    # (gemv None: on CPU the session's few-row C kernel, as `run` has it; on CUDA the configs ask for the GEMV).
    p.set_defaults(temperature=0.0, top_k=0, top_p=1.0, attention_mode="decode", cuda_graphs=False, compile=False,
                   gemv=None, decode_attn=False)
    w = p.add_argument_group("workload")
    w.add_argument("--compile-prefill", action="store_true", dest="bench_compile_prefill",  # the configs', not the session's
                   help="the *-compile configs compile the prompt's phases too (prefill, the drafter's extend over the "
                        "prompt), plain and speculative alike: each request then runs compiled kernels from its first "
                        "token (compiles once per padded prompt width; not in tok/s)")
    w.add_argument("--configs", default=None, help="comma list (default: all but the *-gemv and *-attn ones; graph configs only "
                                                   "on CUDA; none: no configuration, for --profile)")
    w.add_argument("--batch-sizes", default=None, help=f"comma list (default CUDA {GPU_DEFAULTS['batch_sizes']}, "
                                                        f"CPU {CPU_DEFAULTS['batch_sizes']})")
    w.add_argument("--prompts", type=int, default=None, help="MT-bench questions used (first turns; default CUDA 8, CPU 2)")
    w.add_argument("--questions", default=None, metavar="FILE", help="an MT-bench question.jsonl (default: the packaged one)")
    w.add_argument("--max-prompt-tokens", type=int, default=512, help="cut longer prompts")
    w.add_argument("--repeats", type=int, default=None, help="timed passes per point, each over every prompt; the median pass counts (default 2; "
                   "the HF peer: one pass over the first batch of prompts)")
    w.add_argument("--micro", action=argparse.BooleanOptionalAction, default=True,
                   help="also time a 1-token decode against verifies of 2..8 tokens")
    w.add_argument("--micro-only", action="store_true", help="only the micro-measure")
    w.add_argument("--compile-mode", default="default", choices=("default", "max-autotune-no-cudagraphs"),
                   help="torch.compile mode of the *-compile configs (max-autotune-no-cudagraphs: inductor tunes "
                        "its matmul and kernel choices per shape; longer first compile, cached)")
    w.add_argument("--micro-context", type=int, default=256, help="tokens in the cache during the micro-measure")
    w.add_argument("--micro-batch-sizes", default=None, help=f"comma list (default CUDA {GPU_DEFAULTS['micro_batch_sizes']}, "
                                                              f"CPU {CPU_DEFAULTS['micro_batch_sizes']})")
    w.add_argument("--hbm-tbps", type=float, default=None,
                   help="memory bandwidth for the weight-bandwidth bound (default: 4.3, an H200's, on CUDA; none on CPU)")
    p.add_argument("--json", default=None, metavar="OUT", help="write the full report as JSON")
    p.add_argument("--tp", type=int, default=None, metavar="N",
                   help="tensor-parallel ranks; launch as `torchrun --nproc-per-node N -m eaglelab bench --tp N ...` "
                        "(default configs then: plain-eager, plain-graphs, spec-decode-graphs; no HF peer). Any --tp, "
                        "1 included, seeds a scale model's weights per tensor, so --tp 1 and --tp N hold the same model")
    p.add_argument("--profile", action="store_true",
                   help="also profile one plain decode step per batch size (torch.profiler, rank 0 under --tp): "
                        "kernel names and microseconds per step, eager layers and (CUDA) compiled whole; and, when "
                        "a speculative configuration runs, each phase of a speculative cycle alike (its kernel set); "
                        "with --configs none only the decode step (and the --tp section)")
    p.add_argument("--tp-check", action="store_true",
                   help="debug: assert every cycle that the ranks' replicated drafters drafted the same tree")
    p.set_defaults(func=run)


TP_CONFIGS = "plain-eager,plain-graphs,spec-decode-graphs"


def run(args: argparse.Namespace) -> int:
    if args.tp is None or args.tp == 1:
        bench(args, None)
        return 0
    from eaglelab.cmd_run import join_tp

    tp = join_tp(args.tp, args.device)
    tp.check_replicas = args.tp_check
    try:
        with tp.guard("eaglelab bench"):  # a rank that fails makes every rank stop with its error
            bench(args, tp)
    finally:
        tp.close()
    return 0


def bench(args: argparse.Namespace, tp=None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the bench on this rank (``tp``: its group, or None). -> (report, outputs per config and
    batch). Under TP every rank measures; only rank 0 prints and writes the JSON."""
    import torch
    from rich.console import Console

    from eaglelab.bench import harness as B

    quiet = tp is not None and tp.rank != 0
    console, err = Console(highlight=False, quiet=quiet), Console(stderr=True, highlight=False, quiet=quiet)
    log = lambda msg: err.print(f"[dim]{msg}[/]")  # noqa: E731
    torch.manual_seed(args.seed)
    configs = _configs(args, default=TP_CONFIGS if tp is not None else None)
    _check_profile(args, configs)
    setup = _setup(args, log, tp)
    ctx = setup["ctx"]
    hbm = args.hbm_tbps if args.hbm_tbps is not None else (4.3 if ctx.device.type == "cuda" else 0.0)
    write = bool(args.json) and not quiet
    section = None
    if tp is not None:  # first: the issue's figure, kept even if a later configuration runs out of time
        from eaglelab.bench.tp import tp_section

        section = tp_section(ctx, tp, args.micro_context, log)
    profiles = None
    rows, outputs, captures = [], {}, {}

    def full_report(rows, micro) -> dict[str, Any]:
        """The report of what is measured so far, the --tp section and the profile included."""
        report = _report(args, setup, rows, micro, captures, B.headline(rows, micro, setup["weight_bytes"], hbm))
        return {**report, **({"tp": section} if section is not None else {}),
                **({"profile": profiles} if profiles is not None else {})}

    if not args.micro_only:
        for name in configs:
            got, outs, caps = B.run_config(B.CONFIGS[name], ctx)
            rows += got
            outputs[name], captures[name] = outs, caps
            _release(ctx.device)
            if write:  # a partial report after each configuration (a run cut short keeps what it measured)
                B.write_json(args.json, {**full_report(B.finish_rows(rows, outputs), []), "partial": True})
        rows = B.finish_rows(rows, outputs)
    if args.profile:  # after the configurations: plain-compile's decode compiles are then cache hits
        def keep(found: list[dict[str, Any]]) -> None:  # each profile as it is measured: a cut run keeps them
            nonlocal profiles
            profiles = found
            if write:
                B.write_json(args.json, {**full_report(rows, []), "partial": True})

        keep(_profile(args, setup, tp, log, rows, keep))
    micro = []
    if args.micro or args.micro_only:
        log("micro-measure: 1-token decode vs verify of N tokens")
        cuda = ctx.device.type == "cuda"
        micro = B.micro_measure(ctx.target, setup["micro_batch_sizes"], context=args.micro_context, log=log,
                                iters=20 if cuda else 3, warmup=3 if cuda else 1)
    report = full_report(rows, micro)
    _print(console, report, rows, micro)
    if profiles is not None:
        from eaglelab.bench.profile import print_profile

        print_profile(console, profiles, ctx.device.type == "cuda")
    if section is not None:
        from eaglelab.bench.tp import print_tp

        print_tp(console, section, rows)
    if write:
        B.write_json(args.json, report)
        console.print(f"[dim]wrote {args.json}[/]")
    return report, outputs


def _profile(args, setup, tp, log, rows, keep=lambda found: None) -> list[dict[str, Any]]:
    """``--profile``: one decode step per batch size under torch.profiler, eager layers and, on CUDA,
    compiled whole as the *-compile configurations compile a phase (on CPU those do not run); then, per
    kernel set of the speculative configurations that ran, each phase of a speculative cycle alike.
    ``keep`` gets the profiles measured so far after each batch of them (the partial report)."""
    from eaglelab.bench.profile import profile_decode, profile_section, profile_spec_phases, spec_kernel_sets, with_measured

    ctx = setup["ctx"]
    cuda = ctx.device.type == "cuda"
    steps, warmup = (10, 3) if cuda else (2, 1)
    compiler = ctx.kernels(True).compile_phase if cuda else None
    log("profile: one decode step per batch size, kernel by kernel" + (" (rank 0)" if tp is not None else ""))
    found = profile_decode(ctx.target, tp, ctx.batch_sizes, ctx.max_len, compiler, setup["weight_bytes"],
                           steps=steps, warmup=warmup, log=log)
    keep(profile_section(found))
    for kset in spec_kernel_sets(ctx, rows):
        log(f"profile: the phases of a speculative cycle, kernel set of {', '.join(kset.configs)}")
        for compiled in (False, True) if kset.compiler is not None else (False,):
            for b in ctx.batch_sizes:
                phases, _ = profile_spec_phases(ctx, kset, compiled, b, steps=steps, warmup=warmup, log=log)
                found += with_measured(phases, rows, kset, compiled)
                keep(profile_section(found))
            _release(ctx.device)
    _release(ctx.device)
    return profile_section(found)


def _release(device) -> None:
    """Give the finished configuration's graphs, pools and caches back before the next one."""
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---- setup -----------------------------------------------------------------------------------------
def _configs(args, default: str | None = None) -> list[str]:
    """The --configs names (checked), else ``default`` (a comma list), else every configuration but
    the ``*-gemv`` and ``*-attn`` ones (our Triton kernels)."""
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.bench.harness import CONFIGS

    text = args.configs or default
    if text is None:
        return [name for name, cfg in CONFIGS.items() if not cfg.triton]
    if text.strip() == "none":  # only the --tp section, --profile and the micro-measure
        if not (getattr(args, "profile", False) or getattr(args, "tp", None) is not None
                or getattr(args, "micro", False) or getattr(args, "micro_only", False)):
            raise EagleLabError("no configuration, and nothing else to measure", field="--configs", found="none",
                                hint="add --profile, --tp N or --micro, or name configurations")
        return []
    names = [c.strip() for c in text.split(",") if c.strip()]
    for n in names:
        if n not in CONFIGS:
            raise EagleLabError("unknown configuration", field="--configs", found=n, expected=", ".join(CONFIGS))
    return names


def _check_profile(args, configs: list[str]) -> None:
    """--profile profiles the decode step and the phases of the speculative configurations that run: refuse
    the combinations where what it was asked to profile cannot run (before the model builds)."""
    from eaglelab.bench.harness import CONFIGS
    from eaglelab.engine.errors import EagleLabError

    if not getattr(args, "profile", False):
        return
    if args.micro_only:
        raise EagleLabError("--micro-only measures only the micro-measure: nothing would be profiled with it",
                            field="--profile", found="--profile --micro-only",
                            hint="drop --micro-only (--configs none profiles the decode step alone)")
    spec = [n for n in configs if CONFIGS[n].speculative]
    if spec and args.configs and args.draft == "none":
        raise EagleLabError("the speculative phases need a drafter to profile", field="--draft", found="none",
                            expected="default, ngram or a drafter directory, with " + ", ".join(spec),
                            hint="name a drafter, or drop the speculative configurations from --configs")


def _int_list(text: str, field: str) -> tuple[int, ...]:
    from eaglelab.engine.errors import EagleLabError

    try:
        vals = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise EagleLabError("expected a comma list of integers", field=field, found=text) from None
    if not vals or vals[0] < 1:
        raise EagleLabError("values must be >= 1", field=field, found=text)
    return vals


def _setup(args, log, tp=None) -> dict[str, Any]:
    """Load (or build) the target and drafter, the prompts, and the bench context."""
    import torch

    from eaglelab.bench import harness as B
    from eaglelab.session import _pick_device, _pick_dtype

    device, device_reason = _pick_device(args.device)
    if tp is not None and device.type == "cuda":  # one GPU per rank, as torchrun numbers them
        device = torch.device("cuda", tp.local_rank)
        device_reason += f"; tensor parallel rank {tp.rank} of {tp.world_size} on GPU {tp.local_rank}"
    dtype_name, dtype_reason = _pick_dtype(args.dtype, device)
    d = GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    batch_sizes = _int_list(args.batch_sizes or d["batch_sizes"], "--batch-sizes")
    n_prompts = args.prompts or d["prompts"]
    max_new = args.max_new_tokens or d["max_new_tokens"]
    texts = B.mtbench_first_turns(n_prompts, args.questions)
    _check_draft_vocab(args)
    built = (_scale_setup(args, device, dtype_name, log, tp) if args.scale_model
             else _model_setup(args, device, dtype_name, max_new, log, tp))
    prompts, how = B.tokenize_prompts(texts, built["tokenizer"], built["target"].config.vocab_size, args.max_prompt_tokens)
    ctx = B.BenchContext(
        target=built["target"], spec=built["spec"], make_drafter=built["make_drafter"], prompts=prompts,
        max_new_tokens=max_new, batch_sizes=batch_sizes, repeats=args.repeats or d["repeats"],
        peer=built["peer"], peer_skip=built.get("peer_skip"), log=log, tp=tp,
        compile_mode=None if args.compile_mode == "default" else args.compile_mode,
        compile_prefill=args.bench_compile_prefill,
        eager_kernels=built.get("kernels") if device.type == "cpu" else None,  # as `run`: the few-row C kernel,
        plain_kernels=built.get("plain_kernels") if device.type == "cpu" else None,  # and MKL for plain decoding
    )
    notes = built["notes"] + ([_compile_prefill_note(device.type)] if args.bench_compile_prefill else [])
    notes += [f"prompts: {len(prompts)} MT-bench first turns, {how}; "
                              f"{min(map(len, prompts))}..{max(map(len, prompts))} tokens",
                              f"generation: {max_new} tokens per row, EOS ignored, greedy"]
    micro_bs = _int_list(args.micro_batch_sizes or d["micro_batch_sizes"], "--micro-batch-sizes")
    return dict(ctx=ctx, notes=notes, model=built["name"], weight_bytes=built["weight_bytes"], micro_batch_sizes=micro_bs,
                device_reason=device_reason, dtype_reason=dtype_reason, dtype_name=dtype_name)


def _model_setup(args, device, dtype_name, max_new, log, tp=None) -> dict[str, Any]:
    from eaglelab.engine.model.scale_models import decode_weight_bytes
    from eaglelab.bench import harness as B
    from eaglelab.session import build_session

    args.max_new_tokens = max_new  # the device's bench default, resolved
    s = build_session(args, log=log, tp=tp)
    target = s.target
    if tp is not None:
        return dict(target=target.model, tokenizer=target.tokenizer, spec=s.spec, make_drafter=_drafter_factory(s.drafter),
                    peer=None, peer_skip=_TP_PEER_SKIP, name=f"{target.name} ({target.config.num_layers} layers)",
                    notes=list(s.notes), weight_bytes=decode_weight_bytes(target.model))
    peer = lambda: B.hf_generate_fn(_quiet(B.load_hf_peer)(target.path, target.device, target.dtype), target.device)  # noqa: E731
    return dict(target=target.model, tokenizer=target.tokenizer, spec=s.spec, make_drafter=_drafter_factory(s.drafter),
                peer=peer, name=f"{target.name} ({target.config.num_layers} layers)", notes=list(s.notes),
                weight_bytes=decode_weight_bytes(target.model), kernels=s.kernels,
                plain_kernels=None if s.plain_on_mkl else s.kernels)


def _compile_prefill_note(device_type: str) -> str:
    """What bench --compile-prefill does: the configurations that compile under CUDA graphs compile the prompt too."""
    from eaglelab.engine.runtime.spec_config import SpecConfig
    from eaglelab.session import _compile_prefill_note as session_note

    if device_type == "cuda":
        return ("compile-prefill: the *-compile* configurations compile the prompt's phases too, once per batch bucket "
                "and padded prompt width (~30 s a width the first time, then from the disk cache; never in tok/s)")
    return session_note(SpecConfig(), device_type)  # off, and why


_TP_PEER_SKIP = "HF peer skipped under --tp (it runs on one GPU; compare with a --tp 1 run)"


def _scale_setup(args, device, dtype_name, log, tp=None) -> dict[str, Any]:
    from eaglelab.engine.formats.loader import parse_dtype
    from eaglelab.engine.model.scale_models import build_scale_model, decode_weight_bytes
    from eaglelab.bench import harness as B

    dtype = parse_dtype(dtype_name)
    log(f"building {args.scale_model} with random weights on {device} ({dtype_name}) ...")
    # --tp (even 1): each full tensor drawn from its own seeded generator, so every TP size holds the same model
    per_tensor = args.tp is not None
    sm = build_scale_model(args.scale_model, device=device, dtype=dtype, seed=args.seed, tp=tp, per_tensor_seed=per_tensor)
    spec, make_drafter, draft_note = _scale_drafter(args, sm.model)
    peer, peer_skip = None, None
    if tp is not None:
        peer_skip = _TP_PEER_SKIP
    elif sm.config.moe is None:
        peer = lambda: B.hf_generate_fn(_quiet(B.load_hf_peer)(sm.hf_config, device, dtype), device)  # noqa: E731
    else:
        peer_skip = "HF peer skipped: our kimi-like is GQA DeepSeek-V3 (not an HF architecture), and a 2nd copy would not fit"
    notes = [f"scale model {args.scale_model}: random weights; cost figures only, acceptance means nothing", draft_note]
    return dict(target=sm.model, tokenizer=_default_tokenizer(), spec=spec, make_drafter=make_drafter, peer=peer,
                peer_skip=peer_skip, name=f"{args.scale_model} (random weights, {sm.config.num_layers} layers)",
                notes=notes, weight_bytes=decode_weight_bytes(sm.model))


def _check_draft_vocab(args) -> None:
    """--draft-vocab sizes the scale model's random drafter only, and must hold --topk tokens (said before any
    model is built)."""
    from eaglelab.engine.errors import EagleLabError

    if args.draft_vocab is None:
        return
    if not args.scale_model:
        raise EagleLabError("--draft-vocab sizes the random drafter of --scale-model", field="--draft-vocab",
                            found=args.draft_vocab, hint="a trained drafter's vocabulary is its own: drop --draft-vocab")
    topk = args.topk or 1  # None: the default chain
    if args.draft_vocab < topk:
        raise EagleLabError("the draft vocabulary must hold at least --topk tokens", field="--draft-vocab",
                            found=args.draft_vocab, expected=f">= {topk}")


def _scale_drafter(args, model):
    from eaglelab.engine.runtime.drafters import Eagle3Drafter, NgramDrafter
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.engine.model.scale_models import RANDOM_DRAFT_VOCAB, random_eagle3
    from eaglelab.engine.runtime.spec_config import SpecConfig
    from eaglelab.session import tree_spec

    draft = args.draft
    if draft == "none":
        return SpecConfig(), None, "drafter: none"
    if draft == "ngram":
        return tree_spec("ngram", args.steps, args.topk, args.draft_tokens), NgramDrafter, "drafter: n-gram"
    if draft != "default":
        raise EagleLabError("scale models take --draft default | ngram | none", field="--draft", found=draft)
    net, taps = random_eagle3(model, seed=args.seed + 1, draft_vocab=args.draft_vocab or RANDOM_DRAFT_VOCAB)
    spec = tree_spec("eagle3", args.steps, args.topk, args.draft_tokens)
    return spec, (lambda sp: Eagle3Drafter(net, sp, taps)), (
        f"drafter: random EAGLE-3 of the target's width, {net.config.draft_vocab_size}-token draft vocabulary, "
        f"taps hs{list(taps)}")


def _drafter_factory(drafter):
    """Fresh drafters of the session's kind for each configuration's spec."""
    from eaglelab.engine.runtime.drafters import Eagle3Drafter, NgramDrafter

    if drafter is None:
        return None
    if isinstance(drafter, NgramDrafter):
        return NgramDrafter
    return lambda spec: Eagle3Drafter(drafter.net, spec, drafter.target_taps)


def _default_tokenizer():
    """The default model's tokenizer if it is already converted here (never converts or downloads)."""
    from eaglelab.engine.formats.assets import cache_dir
    from eaglelab.engine.formats.loader import DEFAULT_MODEL_NAME
    from eaglelab.engine.formats.tokenizer import Tokenizer

    path = cache_dir() / "models" / DEFAULT_MODEL_NAME
    return Tokenizer(path) if (path / "tokenizer.json").exists() else None


def _quiet(fn):
    def call(*a, **kw):
        import transformers

        transformers.logging.set_verbosity_error()
        return fn(*a, **kw)

    return call


# ---- report ----------------------------------------------------------------------------------------
def _report(args, setup, rows, micro, captures, head) -> dict[str, Any]:
    from dataclasses import asdict

    from eaglelab.bench import harness as B

    ctx = setup["ctx"]
    return {
        "schema": B.SCHEMA,
        "hardware": B.hardware(ctx.device, next(ctx.target.parameters()).dtype),
        "settings": {
            "model": setup["model"], "scale_model": args.scale_model, "spec": ctx.spec.to_dict(),
            "batch_sizes": list(ctx.batch_sizes), "prompts": len(ctx.prompts), "max_new_tokens": ctx.max_new_tokens,
            "repeats": ctx.repeats, "static_cache_slots": ctx.max_len, "micro_context": args.micro_context,
            "device_reason": setup["device_reason"], "dtype_reason": setup["dtype_reason"],
            "speedup_baseline": B.baseline_name(rows),
        },
        "notes": setup["notes"],
        "rows": [asdict(r) for r in rows],
        "micro": [asdict(m) for m in micro],
        "captures": captures,
        "headline": head,
        **({"gemv_tilings": _gemv_tilings(ctx.gemv)} if ctx.gemv is not None else {}),
        **({"decode_attention": _decode_attention(ctx.attention)} if ctx.attention is not None else {}),
    }


def _gemv_tilings(gemv) -> dict[str, Any]:
    """The Triton GEMV's state: why it is off (if it is), tuning time, the tiling chosen per shape."""
    from eaglelab.engine.model.gemv import describe

    return {"reason": gemv.reason, "tune_seconds": gemv.setup_seconds,
            "chosen": [{"n": n, "k": k, "rows_bucket": m, "choice": describe(cfg), **cfg._asdict()}
                       for (n, k, m), cfg in gemv.chosen.items()]}


def _decode_attention(attention) -> dict[str, Any]:
    """The Triton decode attention's state: why it is off (if it is), checking time, the shapes checked."""
    return {"reason": attention.reason, "check_seconds": attention.setup_seconds, "sms": attention.sms,
            "checked": [{"query_rows": t, "head_dim": d, "group": g} for t, d, g in sorted(attention.checked)]}


def _f(v, pattern: str = "{:.2f}") -> str:
    return "-" if v is None else pattern.format(v)


def _print(console, report, rows, micro) -> None:
    hw = report["hardware"]
    where = hw.get("gpu") or hw.get("cpu")
    console.print(f"[bold]eaglelab bench[/]  {report['settings']['model']}  on {hw['device']} ({where}), "
                  f"{hw['dtype']}, torch {hw['torch']}, transformers {hw['transformers']}")
    for n in report["notes"]:
        console.print(f"[dim]  {n}[/]")
    if rows:
        console.print(_rows_table(rows, report["settings"]["speedup_baseline"]))
        console.print("[dim]graphs: R = replayed from a CUDA graph, E = eager. same tokens: rows identical to "
                      "plain-eager (every config uses the same static cache length; in bf16 a verify of N tokens "
                      "rounds differently from 1-token decodes, so speculative rows may drift; float32 is exact)[/]")
        for line in _eager_reasons(rows):
            console.print(f"[dim]{line}[/]")
        for line in _compile_fallback_lines(rows):
            console.print(f"[yellow]{line}[/]")
    if micro:
        console.print(_micro_table(micro))
    for line in _headline_lines(report["headline"]):
        console.print(line)


def _table(title: str, gap: int = 2):
    """A table that fits an 80-column terminal: no vertical rules, ``gap`` spaces between columns."""
    from rich import box
    from rich.table import Table

    return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, gap, 0, 0))


def _rows_table(rows, base) -> Any:
    """Tables readable at 80 columns: speed per configuration, its phase costs, then its per-request costs."""
    from rich.console import Group

    speed = _table(f"end to end (speedup over {base})")
    for col in ("config", "batch", "tok/s", "speedup", "accept len", "same tokens"):
        speed.add_column(col, justify="left" if col == "config" else "right", no_wrap=col != "same tokens")
    cost = _table("phase costs, ms per cycle", gap=1)  # eight columns: one space keeps the graph column at 80
    for col in ("config", "batch", "decode", "verify", "v/dec", "draft", "extend", "graphs"):
        cost.add_column(col, justify="left" if col in ("config", "graphs") else "right", no_wrap=col != "graphs")
    last = None
    for r in sorted(rows, key=lambda r: r.batch):
        if last is not None and r.batch != last:
            speed.add_section()
            cost.add_section()
        last = r.batch
        if r.skipped:
            speed.add_row(r.config, str(r.batch), "-", "-", "-", f"[dim]skipped: {r.skipped}[/]")
            continue
        speed.add_row(r.config, str(r.batch), _f(r.tok_per_s, "{:.1f}"), _f(r.speedup, "{:.2f}x"),
                      _f(r.mean_accept_len), _f(r.same_tokens_as_plain_eager, "{:.0%}"))
        cost.add_row(r.config, str(r.batch), _f(r.decode_ms, "{:.3f}"), _f(r.verify_ms, "{:.3f}"),
                     _f(r.verify_over_decode), _f(r.draft_ms, "{:.3f}"), _f(r.extend_ms, "{:.3f}"), _graphs_cell(r.graph))
    return Group(speed, cost, *_request_table(rows))


def _request_table(rows) -> list[Any]:
    """Per request, what runs once before the cycles: the prompt's forward and the drafter's extend over it
    (median over the prompt groups), so a gap between the cycles' speedup and the end-to-end one is seen."""
    measured = sorted((r for r in rows if r.prefill_ms is not None), key=lambda r: r.batch)
    if not measured:
        return []
    table = _table("per request, ms (median over the prompt groups)")
    for col in ("config", "batch", "prompt", "drafter's extend", "whole request"):
        table.add_column(col, justify="left" if col == "config" else "right")
    last = None
    for r in measured:
        if last is not None and r.batch != last:
            table.add_section()
        last = r.batch
        table.add_row(r.config, str(r.batch), _f(r.prefill_ms, "{:.2f}"), _f(r.begin_ms, "{:.2f}"),
                      _f(_request_ms(r), "{:.1f}"))
    return [table]


def _request_ms(r) -> float | None:
    """A request's mean wall time at this row's speed: a group's tokens (the pass's over its groups) / tok/s."""
    if not r.tok_per_s or not r.group_tok_per_s:
        return None
    return r.tokens / len(r.group_tok_per_s) / r.tok_per_s * 1e3


def _graphs_cell(graph: dict[str, str]) -> str:
    """"R" when every phase replayed, "E" when none did, else the phases with their letter."""
    marks = {p: "R" if st == "replay" else "E" for p, st in graph.items()}
    if len(set(marks.values())) <= 1:
        return next(iter(marks.values()), "-")
    return " ".join(f"{_SHORT.get(p, p)}:{m}" for p, m in marks.items())


_SHORT = {"decode": "dec", "draft": "draft", "verify": "ver", "draft_extend": "ext"}


def _eager_reasons(rows) -> list[str]:
    """One line per distinct eager reason, naming the configs and phases it applied to."""
    seen: dict[str, set[str]] = {}
    for r in rows:
        for phase, status in r.graph.items():
            if status != "replay":
                seen.setdefault(status, set()).add(f"{r.config} {_SHORT.get(phase, phase)}")
    lines = [f"  E = {why}: {', '.join(sorted(where))}" for why, where in seen.items()]
    off = {r.gemv for r in rows if r.gemv not in (None, "on")}
    attn_off = {r.decode_attn for r in rows if r.decode_attn not in (None, "on")}
    return (lines + [f"  GEMV off (F.linear instead): {why}" for why in sorted(off)]
            + [f"  decode attention off (SDPA instead): {why}" for why in sorted(attn_off)])


def _compile_fallback_lines(rows) -> list[str]:
    """Per config, each phase compile that fell back to eager (its graph then holds the eager layers)."""
    seen: dict[str, list[str]] = {}
    for r in rows:
        for why in r.compile_fallbacks:
            if why not in seen.setdefault(r.config, []):
                seen[r.config].append(why)
    return [f"  not compiled ({cfg}, ran eager inside its graph): {why}" for cfg, whys in seen.items() for why in whys]


_CALL = {("decode", True): "decode/graph", ("decode", False): "decode/eager", ("prefill", False): "extend/eager",
         ("prefill", True): "extend/graph"}


def _micro_table(micro) -> Any:
    """Per batch and kind of call: the 1-token decode's ms, then each verify width as x that decode."""
    widths = sorted({m.tokens for m in micro if m.tokens > 1})
    t = _table("micro: verify of N tokens / 1-token decode")
    t.add_column("batch", justify="right", no_wrap=True)
    t.add_column("verify", no_wrap=True)
    t.add_column("dec ms", justify="right", no_wrap=True)
    for n in widths:
        t.add_column(f"N={n}", justify="right", no_wrap=True, min_width=4)
    for b in sorted({m.batch for m in micro}):
        base = [m for m in micro if m.batch == b and m.tokens == 1 and m.over_decode == 1.0]
        base_ms = _f(base[0].ms, "{:.3f}") if base else "-"
        kinds = sorted({(m.attention_mode, m.graphs) for m in micro if m.batch == b and m.tokens > 1},
                       key=lambda k: (k[0] != "decode", not k[1]))
        for mode, g in kinds:
            cells = []
            for n in widths:
                hit = [m for m in micro if (m.batch, m.tokens, m.attention_mode, m.graphs) == (b, n, mode, g)]
                cells.append(f"{hit[0].over_decode:.2f}" if hit and hit[0].over_decode is not None else "")
            t.add_row(str(b), _CALL.get((mode, g), mode), base_ms, *cells)
        t.add_section()
    return t


def _headline_lines(h) -> list[str]:
    out = ["[bold]headline[/]"]
    if "plain_vs_hf_batch1" in h:
        x = h["plain_vs_hf_batch1"]
        out.append(f"  plain decoding, batch 1: {x['ours']:.1f} tok/s ({h['baseline']}) vs HF generate "
                   f"{x['hf']:.1f} tok/s = {x['ratio']:.2f}x")
    if "bandwidth_bound_batch1" in h:
        x = h["bandwidth_bound_batch1"]
        step = (f"; per decode step (phase median, logits included) {x['decode_step_tok_per_s']:.1f} tok/s = "
                f"{x['decode_step_fraction']:.0%}") if x.get("decode_step_tok_per_s") else ""
        out.append(f"  weight-bandwidth bound, batch 1: {x['weight_bytes'] / 1e9:.3f} GB of weights per token / "
                   f"{x['hbm_tbps']} TB/s = {x['bound_tok_per_s']:.1f} tok/s; ours end to end {x['ours_tok_per_s']:.1f} "
                   f"tok/s = {x['fraction']:.0%} of it{step}")
        for cfg, f in x.get("plain_configs", {}).items():
            if cfg != h["baseline"]:
                per_step = f" ({f['decode_step_fraction']:.0%} per decode step)" if f["decode_step_fraction"] else ""
                out.append(f"    {cfg}: {f['tok_per_s']:.1f} tok/s = {f['fraction']:.0%} of the bound{per_step}")
    for key, label in (("decode-graphs", "decode-mode verify, graphs"), ("decode-eager", "decode-mode verify, eager"),
                       ("prefill-eager", "prefill-mode verify (eager extend)")):
        vals = h.get("verify_over_decode_batch1", {}).get(key)
        if vals:
            shown = "  ".join(f"N={n}: {v:.2f}x" for n, v in sorted(vals.items()) if n >= 4)
            out.append(f"  verify cost / 1-token decode, batch 1, {label}: {shown}")
    for cfg, by_batch in h.get("spec_speedup", {}).items():
        shown = "  ".join(f"b{b}: {v:.2f}x" for b, v in sorted(by_batch.items()))
        out.append(f"  {cfg} speedup over {h['baseline']}: {shown}")
        for b, x in sorted(h.get("spec_speedup_spread", {}).get(cfg, {}).items()):
            out.append(f"    b{b}, prompt group by group ({x['groups']}): {x['min']:.2f}x .. {x['max']:.2f}x, "
                       f"median {x['median']:.2f}x")
    return out
