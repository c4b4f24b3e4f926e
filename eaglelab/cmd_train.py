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
TensorBoard with --tensorboard; a fresh run (not --resume) evaluates once before its first step, the
starting point (step 0), and the card's acceptance_gain is the last evaluation less that one.

--intermediate-size sets the drafter's MLP width (default: the target's). With --init-from, a wider
MLP than the init's keeps its units and adds new ones whose down_proj columns start at zero: the
drafter computes what the init did until the first step. --max-size-mb refuses, before any data is
read, a drafter whose saved tensors would exceed the budget, and names the pairs of
--intermediate-size and --draft-vocab-size that fit.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eaglelab import training_jobs as J


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
    p.add_argument("--target-temperature", type=float, default=1.0, metavar="T",
                   help="match softmax(target logits / T) (default 1: the target's distribution); below 1 sharper, "
                        "weighting the target's first choices, which greedy verification accepts")
    p.add_argument("--draft-vocab-size", type=int, default=8192)
    p.add_argument("--intermediate-size", type=int, default=None, metavar="N",
                   help="the drafter's MLP width (default: the target's); with --init-from it may exceed the init's: "
                        "the MLP widens, computing what the init did until the first step")
    p.add_argument("--layout", choices=("llama", "mla"), default=None,
                   help="a new drafter's attention: llama (q/k/v) or mla (Eagle3DeepseekV2ForCausalLM, the target's MLA "
                        "sizes); default: the target's attention kind (with --init-from, the init's layout)")
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

    from eaglelab.devices import pick_device
    from eaglelab.engine.errors import EagleLabError
    from eaglelab.engine.formats.loader import parse_dtype
    from eaglelab.engine.runtime.limits import length_in_window

    console = Console(stderr=True, highlight=False)
    if not Path(args.data).is_dir():
        raise EagleLabError("no such data directory", file=args.data, field="--data",
                            hint="point at the output of `eaglelab capture` or `eaglelab distill` (or SpecForge offline data)")
    device, device_reason = pick_device(args.device)
    autocast = J.autocast_dtype(args.dtype, device)
    save_dtype = parse_dtype(args.save_dtype)
    manifest = J.read_data_manifest(args)
    target = J.target_arg(args, manifest)
    J.check_identity(manifest, target, args.data)
    got = J.load_training_data(args, manifest, target, device, autocast, save_dtype, console.status)
    head, data = got.head, got.data
    dv = J.draft_vocab(args, got.counts, head.config.vocab_size, console.print)
    max_length, why = length_in_window(head.config, args.max_length)
    if why:
        console.print(f"[yellow]{why}[/]")
    cfg = _train_config(args, autocast, max_length)
    trainer, init = J.make_trainer(args, head, data, dv, got.sglang_ids, cfg, device, console.print, got.states,
                                   got.heldout)
    _announce(console, head, data, dv, got.sglang_ids, trainer, device, device_reason, autocast, save_dtype,
              args.max_size_mb)
    start = f"warm start from {init.path}" if init is not None else "random initialisation"
    result = _train_loop(trainer, args.tensorboard, console, start)
    if trainer.checkpoint_dir is not None and (cfg.checkpoint_every or result.stopped_by_time):
        trainer.save_checkpoint()
    if result.stopped_by_time:
        console.print(f"stopped at the time limit after step {trainer.step}/{trainer.total_steps}; "
                      f"continue with the same command and --resume")
    J.check_finite(trainer.net, args.out)
    out = J.save(args, trainer, head, got.sglang_ids, dv, manifest, target, save_dtype, result, device, init)
    _report_saved(out, head, console)
    return 0


def _train_config(args: argparse.Namespace, autocast: str | None, max_length: int):
    """The flags as a TrainConfig (``max_length``: --max-length cut to the target's context window)."""
    from eaglelab.engine.training.train import TrainConfig

    return TrainConfig(
        epochs=args.epochs, lr=args.lr, batch_size=args.batch_size, ttt_length=args.ttt_length,
        step_decay=args.step_decay, target_temperature=args.target_temperature, warmup_ratio=args.warmup_ratio,
        max_grad_norm=args.max_grad_norm,
        weight_decay=args.weight_decay, max_length=max_length, seed=args.seed,
        checkpoint_every=args.checkpoint_every, log_every=args.log_every, max_steps=args.max_steps,
        autocast=autocast, init_lm_head=args.init_lm_head, time_limit=args.time_limit, eval_every=args.eval_every,
        total_steps=args.total_steps,
    )


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


def _train_loop(trainer, tb_dir, console, start: str):
    """Run the trainer under a progress bar; evaluations go to the console (step 0 named as the starting
    point, ``start``: what the drafter began as) and TensorBoard."""
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
                J.write_scalars(writer, log)

        def on_eval(ev) -> None:
            rates = " ".join(f"{r:.2f}" for r in ev.per_position)
            k, K = min(3, len(ev.accept_len)), len(ev.accept_len)
            longest = f", chain {K} {ev.chain(K):.2f}" if K > k else ""
            cycles = f" (over the engine's cycles: chain {k} {ev.cycle_len[k - 1]:.2f})" if ev.cycle_len else ""
            walked = " ".join(f"{r:.2f}" for r in ev.cycle_per_position)
            walked = f"; over the engine's cycles of chain {K}: {walked}" if walked else ""
            at = f"eval step {ev.step}" + (f" (the starting point: {start})" if ev.step == 0 else "")
            bar.console.print(f"{at}: accepted length chain {k} {ev.chain(k):.2f}{longest}{cycles}; "
                              f"per position {rates}{walked} ({ev.anchors} held-out anchors)")
            if writer is not None:
                J.write_eval_scalars(writer, ev)

        try:
            result = trainer.train(on_log=on_log, on_eval=on_eval)
        finally:
            if writer is not None:
                writer.close()
    return result


def _report_saved(out: Path, head, console) -> None:
    from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint

    ck = read_draft_checkpoint(out)
    size = sum(f.stat().st_size for f in ck.weight_files)
    findings = [f for f in ck.validate(head.config) if f.severity in ("error", "warning")]
    console.print(f"wrote {out} ({size / 2**20:.1f} MiB): config.json + model.safetensors, "
                  f"aux ids {list(ck.aux_layer_ids or [])} (SGLang convention)")
    for f in findings:
        console.print(f"  [yellow]{f.severity}[/] {f.field}: {f.message}")
