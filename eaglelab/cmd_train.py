"""``eaglelab train``: train an EAGLE-3 drafter on SpecForge-format data.

Training-time test (default 7 steps, loss weights 0.8^i) against the target's distribution
restricted to the draft vocabulary; AdamW, cosine schedule with warm-up, gradient clipping.
Checkpoints (model, optimizer, scheduler, data position, RNG) every --checkpoint-every steps;
--resume continues from the newest one to the same state as a run that never stopped.
The result is an SGLang/SpecForge drafter directory: config.json (eagle_config ids in the SGLang
convention) and model.safetensors (fc, midlayer.*, norm, lm_head, d2t, t2d).

Data from `eaglelab capture` carries a manifest naming the target and the layers; data written by
SpecForge needs --model, and --layer-ids when it was not captured at SpecForge's default layers.

--online trains on token ids only (`eaglelab distill` output): the target (--target, default the
one the data names) computes its aux and final hidden states for every batch on the training
device. --time-limit stops at a step boundary with a checkpoint, so a long run goes in pieces
(--resume continues bit-identically). --eval-every N measures the simulated accepted length and
per-position acceptance on a held-out split (--eval-samples) and prints it, and writes it to
TensorBoard with --tensorboard.

--intermediate-size sets the drafter's MLP width (default: the target's). With --init-from, a wider
MLP than the init's keeps its units and adds new ones whose down_proj columns start at zero: the
drafter computes what the init did until the first step. --max-size-mb refuses, before any data is
read, a drafter whose saved tensors would exceed the budget, and names the pairs of
--intermediate-size and --draft-vocab-size that fit.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``train`` subcommand."""
    p = subparsers.add_parser(
        "train", help="train an EAGLE-3 drafter (training-time test) on SpecForge-format data",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data", required=True, metavar="DIR",
                   help="data directory: rows_*/data_*.ckpt (SpecForge), or shards/ from `eaglelab distill` with --online")
    p.add_argument("--online", action="store_true",
                   help="the data is token ids only; the target computes the hidden states per batch")
    p.add_argument("--out", required=True, metavar="DIR", help="where the drafter is written")
    p.add_argument("--model", "--target", dest="model", default=None,
                   help="the target (default: the one named by the data's manifest)")
    p.add_argument("--layer-ids", default=None, metavar="IDS", help="aux ids of data without a manifest (default: SpecForge's)")
    p.add_argument("--convention", default="sglang", choices=("sglang", "vllm", "eagle"), help="how --layer-ids count")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--batch-size", type=int, default=4, help="sequences per optimizer step")
    p.add_argument("--ttt-length", type=int, default=7, help="training-time-test steps (default 7)")
    p.add_argument("--step-decay", type=float, default=0.8, help="loss weight of TTT step i is decay^i")
    p.add_argument("--draft-vocab-size", type=int, default=8192)
    p.add_argument("--intermediate-size", type=int, default=None, metavar="N",
                   help="the drafter's MLP width (default: the target's); with --init-from it may exceed the init's: "
                        "the MLP widens, computing what the init did until the first step")
    p.add_argument("--max-size-mb", type=float, default=None, metavar="MB",
                   help="refuse a drafter whose saved tensors exceed MB (10^6 bytes) in --save-dtype; the error "
                        "names the --intermediate-size / --draft-vocab-size pairs that fit")
    p.add_argument("--max-length", type=int, default=2048, help="tokens kept per sample")
    p.add_argument("--warmup-ratio", type=float, default=0.015)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-steps", type=int, default=None, help="stop after N steps (the schedule spans all epochs)")
    p.add_argument("--checkpoint-every", type=int, default=500, metavar="N")
    p.add_argument("--checkpoint-dir", default=None, metavar="DIR",
                   help="default: OUT/checkpoints (the cache when OUT is inside the package)")
    p.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CKPT",
                   help="resume from the newest checkpoint (or the one named)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--time-limit", type=float, default=None, metavar="S",
                   help="stop (with a checkpoint) at the step boundary before S seconds of training")
    p.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="simulated acceptance on the held-out split every N steps (0 = off)")
    p.add_argument("--eval-samples", type=int, default=256, metavar="N",
                   help="samples held out of training for --eval-every (default 256)")
    p.add_argument("--tensorboard", default=None, metavar="DIR", help="write TensorBoard scalars to DIR")
    p.add_argument("--init-from", default=None, metavar="DIR",
                   help="warm start: begin from this trained drafter (same target and aux ids; its draft-head rows "
                        "carry over to the tokens both draft vocabularies hold)")
    p.add_argument("--total-steps", type=int, default=None, metavar="N",
                   help="the run's length in optimizer steps: the LR schedule decays to 0 at N and training stops "
                        "there (default: epochs x batches per epoch)")
    p.add_argument("--init-lm-head", default="target", choices=("target", "random"),
                   help="start lm_head/norm from the target's rows of the draft vocabulary (default) or at random")
    p.add_argument("--save-dtype", default="bfloat16", help="dtype of the written weights (default bfloat16)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--dtype", default="auto", help="compute: auto (bfloat16 autocast on CUDA, float32 on CPU) | float32 | bfloat16")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Train; 0 on success."""
    from rich.console import Console

    from eaglelab.engine.training.capture import read_manifest
    from eaglelab.engine.formats.loader import parse_dtype
    from eaglelab.engine.training.train import SampleSet, TargetHead, TrainConfig
    from eaglelab.devices import pick_device

    from eaglelab.engine.errors import EagleLabError

    console = Console(stderr=True, highlight=False)
    if not Path(args.data).is_dir():
        raise EagleLabError("no such data directory", file=args.data, field="--data",
                            hint="point at the output of `eaglelab capture` or `eaglelab distill` (or SpecForge offline data)")
    device, device_reason = pick_device(args.device)
    autocast = _autocast(args.dtype, device)
    save_dtype = parse_dtype(args.save_dtype)
    manifest = _read_data_manifest(args)
    model_arg = _model_arg(args, manifest)
    _check_identity(manifest, model_arg, args.data)
    if args.online:
        target, data, counts = _online(args, model_arg, device, autocast, console)
        head = TargetHead.from_model(target.model)
        sglang_ids = _layer_ids(args, manifest, head.config.num_layers)
        _check_size(args, head.config, len(sglang_ids), save_dtype)
        states = _states(target.model, sglang_ids)
    else:
        head, states = TargetHead.load(model_arg, device=device), None
        sglang_ids = _layer_ids(args, manifest, head.config.num_layers)
        _check_size(args, head.config, len(sglang_ids), save_dtype)
        counts, lengths = _scan(args.data, head.config.vocab_size, console)
        data = SampleSet(args.data, lengths)
    data, heldout = _split(args, data)
    dv = _vocab(args, counts, head.config.vocab_size, console)
    cfg = TrainConfig(
        epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, ttt_length=args.ttt_length,
        step_decay=args.step_decay, warmup_ratio=args.warmup_ratio, max_grad_norm=args.max_grad_norm,
        weight_decay=args.weight_decay, max_length=args.max_length, seed=args.seed,
        checkpoint_every=args.checkpoint_every, log_every=args.log_every, max_steps=args.max_steps,
        autocast=autocast, init_lm_head=args.init_lm_head, time_limit=args.time_limit, eval_every=args.eval_every,
        total_steps=args.total_steps,
    )
    trainer, init = _trainer(args, head, data, dv, sglang_ids, cfg, device, console, states, heldout)
    _announce(console, head, data, dv, sglang_ids, trainer, device, device_reason, autocast, save_dtype, args.max_size_mb)
    result = _train_loop(trainer, args.tensorboard, console)
    if trainer.checkpoint_dir is not None and (cfg.checkpoint_every or result.stopped_by_time):
        trainer.save_checkpoint()
    if result.stopped_by_time:
        console.print(f"stopped at the time limit after step {trainer.step}/{trainer.total_steps}; "
                      f"continue with the same command and --resume")
    _check_finite(trainer.net, args.out)
    out = _save(args, trainer, head, sglang_ids, dv, manifest, model_arg, save_dtype, result, device, init)
    _report_saved(out, head, console)
    return 0


def _check_size(args, target, num_aux: int, save_dtype) -> None:
    """--max-size-mb: refused before the data is read, naming the (intermediate, vocabulary) pairs that fit."""
    from eaglelab.engine.training.train import check_size_budget, drafter_config

    if args.max_size_mb is not None:
        size = min(args.draft_vocab_size, target.vocab_size)
        check_size_budget(drafter_config(target, num_aux, size, args.intermediate_size), args.max_size_mb, save_dtype)


def _read_data_manifest(args):
    """The data's manifest: distill.json (online) or manifest.json (capture), None for SpecForge's own."""
    from eaglelab.engine.training import capture, distill

    return distill.read_manifest(args.data) if args.online else capture.read_manifest(args.data)


def _online(args, model_arg: str, device, autocast, console):
    """The target (in the compute dtype, on the training device), the token data, answer-token counts."""
    from eaglelab.engine.formats.loader import load_target
    from eaglelab.engine.training.online import TokenData

    with console.status("reading the distill shards ..."):
        data = TokenData(args.data)
    dtype = "bfloat16" if autocast == "bfloat16" else "float32"
    target = load_target(model_arg, device=device, dtype=dtype, with_tokenizer=False)
    return target, data, data.token_counts(target.config.vocab_size)


def _states(model, sglang_ids: list[int]):
    """The target computing the aux states at ``sglang_ids`` (hs[k+1]) and its final hidden state."""
    from eaglelab.engine.formats.conventions import ids_to_hf_indices
    from eaglelab.engine.training.capture import check_layer_ids
    from eaglelab.engine.training.online import TargetStates

    hf = ids_to_hf_indices(tuple(sglang_ids), "sglang")
    check_layer_ids(hf, model.config.num_layers)
    return TargetStates(model, hf)


def _split(args, data):
    """(training set, held-out set or None): --eval-samples samples set aside when --eval-every is on."""
    from eaglelab.engine.errors import ConfigError
    from eaglelab.engine.training.online import Subset, split_heldout

    if not args.eval_every:
        return data, None
    if not 1 <= args.eval_samples < len(data):
        raise ConfigError("cannot hold out that many samples", field="--eval-samples", found=args.eval_samples,
                          expected=f"1..{len(data) - 1} (the data has {len(data)})")
    train, held = split_heldout(len(data), args.eval_samples, args.seed)
    return Subset(data, train), Subset(data, held)


def _autocast(name: str, device) -> str | None:
    """The autocast dtype for --dtype (None = plain float32)."""
    import torch

    from eaglelab.engine.formats.loader import parse_dtype

    if name == "auto":
        return "bfloat16" if device.type == "cuda" else None
    dt = parse_dtype(name)
    return None if dt == torch.float32 else str(dt).replace("torch.", "")


def _model_arg(args, manifest) -> str:
    from eaglelab.engine.errors import ConfigError

    if args.model:
        return args.model
    target = (manifest or {}).get("target") or {}
    arg = target.get("model_arg") or target.get("path")
    if not arg:
        raise ConfigError("which target? the data has no manifest naming it", file=Path(args.data) / "manifest.json",
                          field="--model", hint="pass --model (the target the data was captured from)")
    return str(arg)


def _check_identity(manifest, model_arg: str, data_dir: str) -> None:
    """The target's config.json must be the one the data was captured from."""
    import hashlib

    from eaglelab.engine.errors import ConfigError
    from eaglelab.engine.formats.loader import resolve_model_dir

    want = ((manifest or {}).get("target") or {}).get("config_sha256")
    if not want or (manifest.get("target") or {}).get("path") is None:
        return
    got = hashlib.sha256((resolve_model_dir(model_arg) / "config.json").read_bytes()).hexdigest()
    if got != want:
        raise ConfigError("the target differs from the one the data was captured from", file=Path(data_dir) / "manifest.json",
                          field="target.config_sha256", found=got[:16], expected=want[:16],
                          hint="pass the captured target with --model")


def _layer_ids(args, manifest, num_layers: int) -> list[int]:
    """The aux ids in the SGLang convention: the manifest's, or --layer-ids, or SpecForge's default."""
    from eaglelab.cmd_capture import parse_ids
    from eaglelab.engine.training.capture import default_layer_ids
    from eaglelab.engine.formats.conventions import convert_ids

    if manifest and manifest.get("sglang_layer_ids"):
        return list(manifest["sglang_layer_ids"])
    ids = parse_ids(args.layer_ids)
    if ids is None:
        return list(default_layer_ids(num_layers))
    return list(convert_ids(ids, args.convention, "sglang"))


def _scan(data_dir, vocab_size: int, console):
    from eaglelab.engine.training.draft_vocab import scan_data

    with console.status("reading token ids and lengths of the samples ..."):
        return scan_data(data_dir, vocab_size)


def _vocab(args, counts, vocab_size: int, console):
    """The data's vocab mapping when its size matches, else the most frequent assistant tokens."""
    from eaglelab.engine.training.draft_vocab import DraftVocab, build_draft_vocab, coverage
    from eaglelab.engine.formats.specforge_data import read_vocab_mapping

    size = min(args.draft_vocab_size, vocab_size)
    given = read_vocab_mapping(args.data)
    if given is not None and given.d2t.numel() == size and given.t2d.numel() == vocab_size:
        console.print(f"[dim]draft vocabulary: the data's vocab_mapping ({size} tokens)[/]")
        return DraftVocab(given, coverage(counts, given), int(counts.sum()), int((counts > 0).sum()))
    return build_draft_vocab(counts, size)


def _trainer(args, head, data, dv, sglang_ids: list[int], cfg, device, console, states=None, heldout=None):
    """The trainer (fresh, warm-started with --init-from, or resumed) and the warm start's facts (or None)."""
    from eaglelab.engine.errors import CheckpointError
    from eaglelab.engine.formats.specforge_data import list_samples, read_sample
    from eaglelab.engine.training.train import Trainer, drafter_config, latest_checkpoint, new_drafter
    from eaglelab.engine.training.warm_start import warm_start

    num_aux = len(sglang_ids)
    if states is None:
        first_path = list_samples(args.data)[0]
        width = read_sample(first_path).aux_hidden_state.shape[-1]
        if width != num_aux * head.config.hidden_size:
            raise CheckpointError("aux_hidden_state width disagrees with the layer ids and the target", file=first_path,
                                  field="aux_hidden_state", found=width,
                                  expected=f"{num_aux} x {head.config.hidden_size} = {num_aux * head.config.hidden_size}")
    dcfg = drafter_config(head.config, num_aux, dv.size, args.intermediate_size)
    net = new_drafter(dcfg, head, dv.mapping, seed=cfg.seed, init_lm_head=cfg.init_lm_head)
    init = None
    if args.init_from:
        init = warm_start(net, args.init_from, sglang_ids, head.lm_head_weight, seed=cfg.seed)
        mapped = f" (the target's rows mapped, fit error {init.map_rel_error:.0%})" if init.head_rows_new else ""
        console.print(f"warm start from {init.path}: {init.tensors} tensors, {init.head_rows_copied} draft-head rows "
                      f"carried over, {init.head_rows_new} new{mapped}")
        if init.widened:
            console.print(f"  MLP widened {init.intermediate_from} -> {init.intermediate_size}: new gate/up rows "
                          f"N(0, {init.widen_std}) (seed {init.widen_seed}), new down_proj columns 0, so the drafter "
                          f"computes what {init.path} did until the first step")
    ck_dir = _checkpoint_dir(args, console)
    trainer = Trainer(net, head, data, cfg, device=device, checkpoint_dir=ck_dir, states=states, heldout=heldout)
    if args.resume:
        path = latest_checkpoint(ck_dir) if args.resume == "latest" else Path(args.resume)
        if path is None:
            raise CheckpointError("nothing to resume from", file=ck_dir, hint="train without --resume first")
        trainer.load_checkpoint(path)
        console.print(f"resumed from {path} at step {trainer.step}/{trainer.total_steps}")
    return trainer, init


def _checkpoint_dir(args, console) -> Path:
    """--checkpoint-dir, else OUT/checkpoints; never inside the installed package (the shipped drafter)."""
    import eaglelab
    from eaglelab.engine.formats.assets import cache_dir

    if args.checkpoint_dir:
        return Path(args.checkpoint_dir)
    out = Path(args.out).resolve()
    package = Path(eaglelab.__file__).resolve().parent
    if package in out.parents:
        ck = cache_dir() / "train-checkpoints" / out.name
        console.print(f"[dim]checkpoints go to {ck}: OUT is inside the eaglelab package, which ships no checkpoints[/]")
        return ck
    return Path(args.out) / "checkpoints"


def _announce(console, head, data, dv, ids, trainer, device, device_reason, autocast, save_dtype, max_mb=None) -> None:
    from eaglelab.engine.training.train import drafter_size_bytes

    size = drafter_size_bytes(trainer.net, save_dtype)
    budget = f", budget {max_mb:g} MB" if max_mb is not None else ""
    console.print(f"[bold]train[/] EAGLE-3 drafter for {head.config.architecture} "
                  f"(hidden {head.config.hidden_size}, {head.config.num_layers} layers) on {device} ({device_reason}), "
                  f"compute {autocast or 'float32'}")
    held = f", {len(trainer.heldout)} held out for acceptance every {trainer.cfg.eval_every} steps" if trainer.heldout else ""
    online = "; online: the target computes the states per batch" if trainer.states is not None else ""
    console.print(f"  {len(data)} samples, {sum(data.lengths)} tokens{held}; aux ids {ids} (SGLang convention); "
                  f"{trainer.total_steps} steps ({trainer.batches_per_epoch}/epoch){online}")
    console.print(f"  draft vocabulary {dv.size}: covers {dv.coverage:.2%} of the assistant tokens")
    console.print(f"  drafter: {sum(p.numel() for p in trainer.net.parameters()) / 1e6:.2f} M parameters, "
                  f"{size / 2**20:.1f} MiB in {str(save_dtype).replace('torch.', '')} ({size / 1e6:.2f} MB{budget}): "
                  f"intermediate {trainer.net.config.intermediate_size}, draft vocabulary {dv.size}")


def _train_loop(trainer, tb_dir, console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    writer = None
    if tb_dir:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(tb_dir)
    stop = min(trainer.total_steps, trainer.cfg.max_steps or trainer.total_steps)
    cols = (TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(), TimeElapsedColumn(),
            TimeRemainingColumn(), TextColumn("{task.fields[stats]}"))
    with Progress(*cols, console=console) as bar:
        task = bar.add_task("train", total=stop, completed=trainer.step, stats="")

        def on_log(log) -> None:
            acc = " ".join(f"{a:.2f}" for a in log.step_acc)
            bar.update(task, completed=log.step, stats=f"loss {log.loss:.3f}  acc/step {acc}  lr {log.lr:.2e}")
            if writer is not None:
                _scalars(writer, log)

        def on_eval(ev) -> None:
            rates = " ".join(f"{r:.2f}" for r in ev.per_position)
            k, K = min(3, len(ev.accept_len)), len(ev.accept_len)
            longest = f", chain {K} {ev.chain(K):.2f}" if K > k else ""
            cycles = f" (over the engine's cycles: chain {k} {ev.cycle_len[k - 1]:.2f})" if ev.cycle_len else ""
            bar.console.print(f"eval step {ev.step}: accepted length chain {k} {ev.chain(k):.2f}{longest}{cycles}; "
                              f"per position {rates} ({ev.anchors} held-out anchors)")
            if writer is not None:
                _eval_scalars(writer, ev)

        try:
            result = trainer.train(on_log=on_log, on_eval=on_eval)
        finally:
            if writer is not None:
                writer.close()
    return result


def _scalars(writer, log) -> None:
    writer.add_scalar("train/loss", log.loss, log.step)
    writer.add_scalar("train/lr", log.lr, log.step)
    writer.add_scalar("train/grad_norm", log.grad_norm, log.step)
    if log.seconds > 0:
        writer.add_scalar("train/tokens_per_s", log.tokens / log.seconds, log.step)
    for i, (loss, acc) in enumerate(zip(log.step_loss, log.step_acc)):
        writer.add_scalar(f"train/loss_step{i}", loss, log.step)
        writer.add_scalar(f"train/acc_step{i}", acc, log.step)


def _eval_scalars(writer, ev) -> None:
    for k, length in enumerate(ev.accept_len, 1):
        writer.add_scalar(f"eval/accept_len_chain{k}", length, ev.step)
    for k, length in enumerate(ev.cycle_len, 1):
        writer.add_scalar(f"eval/cycle_len_chain{k}", length, ev.step)
    for i, rate in enumerate(ev.per_position):
        writer.add_scalar(f"eval/accept_rate_pos{i}", rate, ev.step)


def _check_finite(net, out: str) -> None:
    """A drafter with NaN weights is never written: training diverged or the data held non-finite values."""
    import torch

    from eaglelab.engine.errors import EagleLabError

    for name, tensor in net.state_dict().items():
        if torch.is_floating_point(tensor) and not bool(torch.isfinite(tensor).all()):
            raise EagleLabError("training diverged: the drafter's weights hold NaN or infinity; nothing was written",
                                file=out, field=name, hint="lower --lr or --max-grad-norm, and check the data "
                                "(eaglelab check-wiring DRAFT --data DIR reads every sample)")


def _save(args, trainer, head, sglang_ids, dv, manifest, model_arg, save_dtype, result, device, init=None) -> Path:
    from dataclasses import asdict

    from eaglelab import __version__
    from eaglelab.engine.training.train import drafter_size_bytes, save_drafter

    last = result.logs[-1] if result.logs else None
    provenance = {
        "eaglelab_version": __version__, "target": (manifest or {}).get("target") or {"model_arg": model_arg},
        "data": str(args.data), "samples": len(trainer.data), "steps": trainer.step, "total_steps": trainer.total_steps,
        "train_config": asdict(trainer.cfg), "draft_vocab": {"size": dv.size, "coverage": dv.coverage},
        "aux_layer_ids_sglang": sglang_ids,
        "final": {"loss": last.loss, "step_acc": list(last.step_acc)} if last else None,
        "online": bool(args.online), "device": _device_name(device), "train_seconds": round(trainer.seconds, 1),
        "distill_seconds": round(sum(r.get("seconds", 0.0) for r in (manifest or {}).get("runs", [])), 1) or None,
        "parameters": sum(p.numel() for p in trainer.net.parameters()),
        "size_bytes": drafter_size_bytes(trainer.net, save_dtype),
        "data_counts": (manifest or {}).get("counts"), "prompts": _prompts_manifest(manifest),
        "heldout_samples": len(trainer.heldout) if trainer.heldout is not None else 0,
        "acceptance": asdict(result.evals[-1]) if result.evals else None,
        "init_from": asdict(init) if init is not None else None,
    }
    return save_drafter(trainer.net, args.out, target=head.config, sglang_layer_ids=sglang_ids, dtype=save_dtype,
                        provenance=provenance)


def _device_name(device) -> str:
    import torch

    return str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "")


def _prompts_manifest(manifest) -> dict | None:
    """Sources and counts of the prompts the data answers (each prompts file's manifest.json, when found;
    distill may answer several files together)."""
    from eaglelab.engine.errors import EagleLabError, read_json_object

    files = (manifest or {}).get("prompts_files") or ([manifest["prompts_file"]] if (manifest or {}).get("prompts_file") else [])
    if not files:
        return None
    out: dict = {"file": ", ".join(map(str, files)), "count": 0, "sources": {}}
    checks = []
    for src in files:
        path = Path(src)
        path = (path if path.is_dir() else path.parent) / "manifest.json"
        try:
            m = read_json_object(path) if path.exists() else None
        except EagleLabError:
            m = None  # the card says what it can; a broken prompts manifest is not the training's error
        if m is None:
            return {"file": out["file"]}
        out["count"] += m.get("count") or 0
        for k, v in (m.get("sources") or {}).items():
            out["sources"][k] = out["sources"].get(k, 0) + v
        checks.append(m.get("overlap_check"))
    out["overlap_check"] = checks[0] if len(checks) == 1 else checks
    return out


def _report_saved(out: Path, head, console) -> None:
    from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint

    ck = read_draft_checkpoint(out)
    size = sum(f.stat().st_size for f in ck.weight_files)
    findings = [f for f in ck.validate(head.config) if f.severity in ("error", "warning")]
    console.print(f"wrote {out} ({size / 2**20:.1f} MiB): config.json + model.safetensors, "
                  f"aux ids {list(ck.aux_layer_ids or [])} (SGLang convention)")
    for f in findings:
        console.print(f"  [yellow]{f.severity}[/] {f.field}: {f.message}")
