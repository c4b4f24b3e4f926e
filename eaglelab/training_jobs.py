"""What ``eaglelab train`` does, as library calls: the data's manifest and the target it names, the aux layer
ids, the draft vocabulary, the trainer (fresh, warm-started or resumed), TensorBoard scalars, and the
drafter written with its provenance. ``eaglelab/cmd_train.py`` parses the flags, shows progress and prints.
Functions take the parsed flags (``args``) where they read several of them; ``say`` prints a line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

from eaglelab.devices import device_name

Say = Callable[[str], None]
Status = Callable[[str], ContextManager[Any]]  # a spinner with a message while a slow read runs (console.status)


@dataclass(frozen=True)
class TrainingData:
    """What a training run reads before its first step."""

    head: Any  # TargetHead: the target's final norm and lm_head, its config
    data: Any  # the training samples (SampleSet, TokenData, or a Subset of either)
    heldout: Any  # the held-out Subset for --eval-every, or None
    counts: Any  # answer-token counts over the target's vocabulary (the draft vocabulary's source)
    states: Any  # --online: TargetStates computing the hidden states per batch; else None
    sglang_ids: list[int]  # aux layer ids, SGLang convention


def load_training_data(args, manifest, target: str, device, autocast: str | None, save_dtype,
                       status: Status) -> TrainingData:
    """The samples (SpecForge data, or token ids with --online and the target computing the states), the target's
    head, the aux ids; --max-size-mb checked before the data is read; --eval-samples held out."""
    from eaglelab.engine.training.draft_vocab import scan_data
    from eaglelab.engine.training.online import TokenData
    from eaglelab.engine.training.train import SampleSet, TargetHead

    if args.online:
        with status("reading the distill shards ..."):
            data = TokenData(args.data)
        model = online_target(target, device, autocast).model
        head = TargetHead.from_model(model)
        sglang_ids = layer_ids(args, manifest, head.config.num_layers)
        check_size(args, head.config, len(sglang_ids), save_dtype)
        counts, states = data.token_counts(model.config.vocab_size), target_states(model, sglang_ids)
    else:
        head, states = TargetHead.load(target, device=device), None
        sglang_ids = layer_ids(args, manifest, head.config.num_layers)
        check_size(args, head.config, len(sglang_ids), save_dtype)
        with status("reading token ids and lengths of the samples ..."):
            counts, lengths = scan_data(args.data, head.config.vocab_size)
        data = SampleSet(args.data, lengths)
    data, heldout = split_heldout_set(args, data)
    return TrainingData(head, data, heldout, counts, states, sglang_ids)


def check_size(args, target, num_aux: int, save_dtype) -> None:
    """--max-size-mb: refused before the data is read, naming the (intermediate, vocabulary) pairs that fit."""
    from eaglelab.engine.training.train import check_size_budget, drafter_config

    if args.max_size_mb is not None:
        size = min(args.draft_vocab_size, target.vocab_size)
        check_size_budget(drafter_config(target, num_aux, size, args.intermediate_size, args.layout),
                          args.max_size_mb, save_dtype)


def read_data_manifest(args):
    """The data's manifest: distill.json (online) or manifest.json (capture), None for SpecForge's own."""
    from eaglelab.engine.training import capture, distill

    return distill.read_manifest(args.data) if args.online else capture.read_manifest(args.data)


def online_target(model_arg: str, device, autocast: str | None):
    """The target of --online training: in the compute dtype, on the training device, without its tokenizer."""
    from eaglelab.engine.formats.loader import load_target

    dtype = "bfloat16" if autocast == "bfloat16" else "float32"
    return load_target(model_arg, device=device, dtype=dtype, with_tokenizer=False)


def target_states(model, sglang_ids: list[int]):
    """The target computing the aux states at ``sglang_ids`` (hs[k+1]) and its final hidden state."""
    from eaglelab.engine.formats.conventions import ids_to_hf_indices
    from eaglelab.engine.training.capture import check_layer_ids
    from eaglelab.engine.training.online import TargetStates

    hf = ids_to_hf_indices(tuple(sglang_ids), "sglang")
    check_layer_ids(hf, model.config.num_layers)
    return TargetStates(model, hf)


def split_heldout_set(args, data):
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


def autocast_dtype(name: str, device) -> str | None:
    """The autocast dtype for --dtype (None = plain float32)."""
    import torch

    from eaglelab.engine.formats.loader import parse_dtype

    if name == "auto":
        return "bfloat16" if device.type == "cuda" else None
    dt = parse_dtype(name)
    return None if dt == torch.float32 else str(dt).replace("torch.", "")


def target_arg(args, manifest) -> str:
    from eaglelab.engine.errors import ConfigError

    if args.model:
        return args.model
    target = (manifest or {}).get("target") or {}
    arg = target.get("model_arg") or target.get("path")
    if not arg:
        raise ConfigError("which target? the data has no manifest naming it", file=Path(args.data) / "manifest.json",
                          field="--model", hint="pass --model (the target the data was captured from)")
    return str(arg)


def check_identity(manifest, model_arg: str, data_dir: str) -> None:
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


def layer_ids(args, manifest, num_layers: int) -> list[int]:
    """The aux ids in the SGLang convention: the manifest's, or --layer-ids, or SpecForge's default."""
    from eaglelab.cmd_capture import parse_ids
    from eaglelab.engine.formats.conventions import convert_ids, ids_to_hf_indices
    from eaglelab.engine.training.capture import check_layer_ids, default_layer_ids

    if manifest and manifest.get("sglang_layer_ids"):
        ids, field = manifest["sglang_layer_ids"], "sglang_layer_ids"
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            from eaglelab.engine.errors import ConfigError

            raise ConfigError("must be a list of integers", file=Path(args.data) / "manifest.json", field=field,
                              found=ids, hint="recapture the data, or delete the manifest and pass --layer-ids")
        ids = list(ids)
    else:
        given = parse_ids(args.layer_ids)
        field = "--layer-ids" if given is not None else "--layer-ids (none given: SpecForge's default)"
        ids = list(default_layer_ids(num_layers)) if given is None else list(convert_ids(given, args.convention, "sglang"))
    # before any step: a drafter tapping one layer twice, or none, cannot run (it was written, then reported broken)
    check_layer_ids(ids_to_hf_indices(tuple(ids), "sglang"), num_layers, field, convention="sglang")
    return ids


def draft_vocab(args, counts, vocab_size: int, say: Say):
    """The data's vocab mapping when its size matches, else the most frequent assistant tokens."""
    from eaglelab.engine.training.draft_vocab import DraftVocab, build_draft_vocab, coverage
    from eaglelab.engine.formats.specforge_data import read_vocab_mapping

    size = min(args.draft_vocab_size, vocab_size)
    given = read_vocab_mapping(args.data)
    if given is not None and given.d2t.numel() == size and given.t2d.numel() == vocab_size:
        say(f"[dim]draft vocabulary: the data's vocab_mapping ({size} tokens)[/]")
        return DraftVocab(given, coverage(counts, given), int(counts.sum()), int((counts > 0).sum()))
    return build_draft_vocab(counts, size)


def make_trainer(args, head, data, dv, sglang_ids: list[int], cfg, device, say: Say, states=None, heldout=None):
    """The trainer (fresh, warm-started with --init-from, or resumed) and the warm start's facts (or None)."""
    from eaglelab.engine.errors import CheckpointError

    from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint
    from eaglelab.engine.formats.specforge_data import list_samples, read_sample
    from eaglelab.engine.training.train import Trainer, drafter_config, latest_checkpoint, new_drafter
    from eaglelab.engine.training.warm_start import init_config, init_layout, warm_start

    num_aux = len(sglang_ids)
    if states is None:
        first_path = list_samples(args.data)[0]
        width = read_sample(first_path).aux_hidden_state.shape[-1]
        if width != num_aux * head.config.hidden_size:
            raise CheckpointError("aux_hidden_state width disagrees with the layer ids and the target", file=first_path,
                                  field="aux_hidden_state", found=width,
                                  expected=f"{num_aux} x {head.config.hidden_size} = {num_aux * head.config.hidden_size}")
    layout = args.layout  # None: the target's attention kind (an init's layout with --init-from)
    init_ck = read_draft_checkpoint(args.init_from) if args.init_from else None
    if init_ck is not None:  # the init's layout, checked against --layout and the target
        layout = init_layout(init_ck, head.config, layout)
    dcfg = drafter_config(head.config, num_aux, dv.size, args.intermediate_size, layout)
    if init_ck is not None:  # the init's EAGLE-3.1 flags (fc_norm weights copied below) and MLA sizes
        dcfg = init_config(dcfg, init_ck)
    net = new_drafter(dcfg, head, dv.mapping, seed=cfg.seed, init_lm_head=cfg.init_lm_head)
    init = None
    if args.init_from:
        init = warm_start(net, args.init_from, sglang_ids, head.lm_head_weight, seed=cfg.seed)
        mapped = f" (the target's rows mapped, fit error {init.map_rel_error:.0%})" if init.head_rows_new else ""
        say(f"warm start from {init.path}: {init.tensors} tensors, {init.head_rows_copied} draft-head rows "
                      f"carried over, {init.head_rows_new} new{mapped}")
        if init.widened:
            say(f"  MLP widened {init.intermediate_from} -> {init.intermediate_size}: new gate/up rows "
                          f"N(0, {init.widen_std}) (seed {init.widen_seed}), new down_proj columns 0, so the drafter "
                          f"computes what {init.path} did until the first step")
    ck_dir = checkpoint_dir(args, say)
    trainer = Trainer(net, head, data, cfg, device=device, checkpoint_dir=ck_dir, states=states, heldout=heldout)
    if args.resume:
        path = latest_checkpoint(ck_dir) if args.resume == "latest" else Path(args.resume)
        if path is None:
            raise CheckpointError("nothing to resume from", file=ck_dir, hint="train without --resume first")
        trainer.load_checkpoint(path)
        say(f"resumed from {path} at step {trainer.step}/{trainer.total_steps}")
        if trainer.replanned:
            was, now = trainer.replanned
            say(f"  the run's length re-planned: {was} -> {now} steps (--total-steps/--epochs); the cosine now ends "
                f"at step {now}, and the learning rate follows it from step {trainer.step}")
    return trainer, init


def checkpoint_dir(args, say: Say) -> Path:
    """--checkpoint-dir, else OUT/checkpoints; never inside the installed package (the shipped drafter)."""
    import eaglelab
    from eaglelab.engine.formats.assets import cache_dir

    if args.checkpoint_dir:
        return Path(args.checkpoint_dir)
    out = Path(args.out).resolve()
    package = Path(eaglelab.__file__).resolve().parent
    if package in out.parents:
        ck = cache_dir() / "train-checkpoints" / out.name
        say(f"[dim]checkpoints go to {ck}: OUT is inside the eaglelab package, which ships no checkpoints[/]")
        return ck
    return Path(args.out) / "checkpoints"


def write_scalars(writer, log) -> None:
    """One logged training step's figures as TensorBoard scalars."""
    writer.add_scalar("train/loss", log.loss, log.step)
    writer.add_scalar("train/lr", log.lr, log.step)
    writer.add_scalar("train/grad_norm", log.grad_norm, log.step)
    if log.seconds > 0:
        writer.add_scalar("train/tokens_per_s", log.tokens / log.seconds, log.step)
    for i, (loss, acc) in enumerate(zip(log.step_loss, log.step_acc)):
        writer.add_scalar(f"train/loss_step{i}", loss, log.step)
        writer.add_scalar(f"train/acc_step{i}", acc, log.step)


def write_eval_scalars(writer, ev) -> None:
    """One held-out evaluation's simulated acceptance as TensorBoard scalars."""
    for k, length in enumerate(ev.accept_len, 1):
        writer.add_scalar(f"eval/accept_len_chain{k}", length, ev.step)
    for k, length in enumerate(ev.cycle_len, 1):
        writer.add_scalar(f"eval/cycle_len_chain{k}", length, ev.step)
    for i, rate in enumerate(ev.per_position):
        writer.add_scalar(f"eval/accept_rate_pos{i}", rate, ev.step)
    for i, rate in enumerate(ev.cycle_per_position):
        writer.add_scalar(f"eval/cycle_rate_pos{i}", rate, ev.step)


def check_finite(net, out: str) -> None:
    """A drafter with NaN weights is never written: training diverged or the data held non-finite values."""
    import torch

    from eaglelab.engine.errors import EagleLabError

    for name, tensor in net.state_dict().items():
        if torch.is_floating_point(tensor) and not bool(torch.isfinite(tensor).all()):
            raise EagleLabError("training diverged: the drafter's weights hold NaN or infinity; nothing was written",
                                file=out, field=name, hint="lower --lr or --max-grad-norm, and check the data "
                                "(eaglelab check-wiring DRAFT --data DIR reads every sample)")


def save(args, trainer, head, sglang_ids, dv, manifest, model_arg, save_dtype, result, device, init=None) -> Path:
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
        "online": bool(args.online), "device": device_name(device), "train_seconds": round(trainer.seconds, 1),
        "distill_seconds": round(sum(r.get("seconds", 0.0) for r in (manifest or {}).get("runs", [])), 1) or None,
        "parameters": sum(p.numel() for p in trainer.net.parameters()),
        "size_bytes": drafter_size_bytes(trainer.net, save_dtype),
        "data_counts": (manifest or {}).get("counts"), "prompts": prompts_manifest(manifest),
        "heldout_samples": len(trainer.heldout) if trainer.heldout is not None else 0,
        "acceptance": asdict(result.evals[-1]) if result.evals else None,
        "acceptance_history": trainer.eval_history,  # per held-out evaluation: chains and per-position rates
        "acceptance_gain": acceptance_gain(trainer.eval_history),
        "init_from": asdict(init) if init is not None else None,
    }
    return write_checked(args.out, head.config, lambda staging: save_drafter(
        trainer.net, staging, target=head.config, sglang_layer_ids=sglang_ids, dtype=save_dtype, provenance=provenance))


def acceptance_gain(history: list[dict]) -> dict | None:
    """What training added: the last evaluation's accepted lengths (chains of 1..K, over every anchor and over
    the engine's cycles) less the starting point's (step 0); None without a step-0 evaluation or a later one.
    Example: chain 3 at 2.50 (step 0) and 2.80 (step 400) -> accept_len[2] = 0.30."""
    if len(history) < 2 or history[0]["step"] != 0:
        return None
    first, last = history[0], history[-1]
    diff = lambda key: [round(b - a, 4) for a, b in zip(first.get(key, ()), last.get(key, ()))]  # noqa: E731
    return {"from_step": 0, "to_step": last["step"], "accept_len": diff("accept_len"), "cycle_len": diff("cycle_len")}


def write_checked(out: str | Path, target, write: Callable[[Path], object]) -> Path:
    """Write the drafter into OUT/.eaglelab-partial, check it as check-wiring's static pass does (against the
    target), and only then move its files into OUT: a drafter that cannot run is never written (it was
    written, reported broken, and the command said 0)."""
    import shutil

    from eaglelab.engine.errors import EagleLabError
    from eaglelab.engine.formats.draft_checkpoint import read_draft_checkpoint
    from eaglelab.flags import TRAIN_STAGING

    out = Path(out)
    staging = out / TRAIN_STAGING
    shutil.rmtree(staging, ignore_errors=True)
    try:
        write(staging)
        errors = [f for f in read_draft_checkpoint(staging).validate(target) if f.severity == "error"]
        if errors:
            first = errors[0]
            raise EagleLabError(
                "the trained drafter cannot run: nothing was written", file=out, field=first.field,
                found="; ".join(f"{f.field}: {f.message}" for f in errors[:3]),
                expected="a drafter whose config and weights pass check-wiring's static checks",
                hint=(first.hint + "; " if first.hint else "") + "the training state is in the checkpoints, if any were written")
        for file in sorted(staging.iterdir()):
            file.replace(out / file.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def prompts_manifest(manifest) -> dict | None:
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
