"""A scaled-down Kimi-K2.5 *trained* target, written the way Kimi ships its checkpoints (issue #35, item 5, part A).

A random-weight target cannot show what broken aux taps cost (its hidden states barely differ by layer and its
greedy text loops), so this trains a real small language model, on text every machine has offline: the Python
standard library's own ``.py`` sources. Steps, all deterministic for a machine's Python:

1. text: the stdlib sources, sorted, split train / held-out by a hash of each file's relative path;
2. tokenizer: a byte-level BPE (``tokenizers``, vocab 8192) trained on the train files; no chat template
   (a base/completion model: eaglelab feeds prompts as they are);
3. model: eaglelab's own ``Transformer`` with Kimi-K2.5's text layout cut down (MLA with q/kv LoRA ranks and
   YaRN rope, layer 0 dense, routed experts + a shared expert, sigmoid top-k routing with
   ``e_score_correction_bias`` kept balanced as DeepSeek-V3 does: no auxiliary loss, the bias nudged against
   each expert's load), trained as a causal LM for a fixed wall-clock budget (AdamW, bf16 autocast on CUDA,
   cosine decay over the budget);
4. checkpoint: the routed experts in compressed-tensors ``pack-quantized`` W4A16 (symmetric, group 32, packed
   by :mod:`eaglelab.engine.formats.quantized_write`), everything else bf16, under Kimi-K2.5's names
   (``language_model.model.*``, ``language_model.lm_head.weight``) in several safetensors shards with an index,
   the ``KimiK25ForConditionalGeneration`` wrapper config with the text model and its ``quantization_config``
   under ``text_config`` (where Kimi-K2.5 keeps it);
5. held-out loss of the written checkpoint as eaglelab loads it (INT4 experts dequantized on load) against the
   same checkpoint with the bf16 experts put back: the cost of the quantization.

Output contract (what ``benchmarks/kimi_incident.py`` and the CLI read)::

    DIR/target/                 HF-style model directory: `eaglelab run --model DIR/target`
                                (config.json, model-0000k-of-0000N.safetensors, model.safetensors.index.json,
                                tokenizer.json, tokenizer_config.json)
    DIR/train_prompts.jsonl     {"index", "source", "kind", "prompt", "file"} per line: 20-40 line windows of
                                training files (`eaglelab distill --prompts`, `capture --prompts-file`)
    DIR/heldout_prompts.jsonl   the same fields: the first 20-40 lines of each held-out module
    DIR/target_summary.json     config, parameters, train tokens, steps, wall time, tok/s, train and held-out
                                loss (bf16 experts and INT4 experts)

Usage: ``python benchmarks/kimi_target.py --out DIR [--device cuda] [--train-s 150] [--small]``
(``--small``: tiny sizes and a few files, for a CPU test in well under a minute).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from eaglelab.engine.formats.loader import load_target
from eaglelab.engine.formats.quantized_write import pack_quantized, pack_quantized_config
from eaglelab.engine.formats.safe_write import write_atomic
from eaglelab.engine.model.config import ModelConfig
from eaglelab.engine.model.model import Transformer
from eaglelab.engine.model.moe import Router, kimi_like_config

SPECIALS = ("<|pad|>", "<|bos|>", "<|eos|>")  # ids 0, 1, 2: the kimi-like configs' bos 1 / eos 2


@dataclass(frozen=True)
class Sizes:
    """Everything ``--small`` changes: the model's widths and the run's data and batch sizes."""

    vocab: int
    layers: int
    hidden: int
    dense_inter: int
    heads: int
    q_lora: int
    kv_lora: int
    nope: int
    rope: int
    v_head: int
    experts: int
    expert_inter: int
    top_k: int
    seq: int
    batch: int
    lr: float
    shards: int
    max_files: int | None  # None: every stdlib file
    eval_seqs: int
    train_prompts: int


DEFAULT = Sizes(vocab=8192, layers=8, hidden=1024, dense_inter=2816, heads=16, q_lora=384, kv_lora=256, nope=64,
                rope=32, v_head=64, experts=16, expert_inter=512, top_k=4, seq=512, batch=64, lr=1.5e-3, shards=4,
                max_files=None, eval_seqs=64, train_prompts=4000)
SMALL = Sizes(vocab=512, layers=3, hidden=64, dense_inter=128, heads=2, q_lora=32, kv_lora=32, nope=16, rope=8,
              v_head=16, experts=8, expert_inter=32, top_k=2, seq=64, batch=8, lr=3e-3, shards=2, max_files=40,
              eval_seqs=4, train_prompts=50)


# ---- 1. text ------------------------------------------------------------------------------------------------
def stdlib_sources(max_files: int | None) -> list[tuple[str, str]]:
    """(relative path, text) of the standard library's ``.py`` files (no site-packages), sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    out = []
    for p in files:
        try:
            text = p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):  # a few test fixtures are deliberately not UTF-8
            continue
        if text.strip():
            out.append((p.relative_to(root).as_posix(), text))
        if max_files is not None and len(out) >= max_files:
            break
    if not out:
        sys.exit(f"kimi_target: no .py sources under {root} (sysconfig's stdlib path); this needs a full Python install")
    return out


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def split_files(files: list[tuple[str, str]], heldout_share: int = 10) -> tuple[list, list]:
    """Train / held-out by a hash of the relative path (about 1 in ``heldout_share`` held out)."""
    held = [f for f in files if _hash(f[0]) % heldout_share == 0]
    return [f for f in files if _hash(f[0]) % heldout_share != 0], held


def first_lines(text: str, start: int, key: str) -> str | None:
    """20-40 lines (the count from ``key``'s hash) from line ``start``, or None if fewer than 8 are not blank."""
    lines = text.splitlines()[start: start + 20 + _hash(key) % 21]
    return "\n".join(lines) + "\n" if sum(1 for ln in lines if ln.strip()) >= 8 else None


def write_prompts(path: Path, rows: list[dict]) -> None:
    write_atomic(path, lambda tmp: tmp.write_text("".join(json.dumps(r) + "\n" for r in rows)), what="prompts")


def prompt_rows(train: list, held: list, count: int) -> tuple[list[dict], list[dict]]:
    """Held-out: each held-out module's first lines. Train: windows at spread offsets of the training files."""
    heldout = [{"source": "stdlib", "kind": "heldout", "prompt": p, "file": rel}
               for rel, text in held if (p := first_lines(text, 0, rel)) is not None]
    train_rows, offset = [], 0
    while len(train_rows) < count and offset < 4000:
        for rel, text in train:
            p = first_lines(text, offset, f"{rel}:{offset}")
            if p is not None and len(train_rows) < count:
                train_rows.append({"source": "stdlib", "kind": "train", "prompt": p, "file": rel})
        offset += 60
    return ([{"index": i, **r} for i, r in enumerate(train_rows)], [{"index": i, **r} for i, r in enumerate(heldout)])


# ---- 2. tokenizer -------------------------------------------------------------------------------------------
def train_tokenizer(texts: list[str], vocab: int, out: Path):
    """A byte-level BPE trained on ``texts`` -> ``out/tokenizer.json`` + ``tokenizer_config.json`` (no chat template)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIALS), min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIALS[1], "eos_token": SPECIALS[2],
           "pad_token": SPECIALS[0], "model_max_length": 4096, "add_bos_token": False, "add_eos_token": False}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return tok


def token_stream(tok, texts: list[str]) -> torch.Tensor:
    """All ``texts`` encoded and joined, each followed by EOS: int64 [N]."""
    eos = tok.token_to_id(SPECIALS[2])
    ids: list[int] = []
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)  # tokenizers >= 0.21: no offsets (~1.5x faster)
    for enc in encode(texts, add_special_tokens=False):
        ids += enc.ids + [eos]
    return torch.tensor(ids, dtype=torch.int64)


# ---- 3. the model -------------------------------------------------------------------------------------------
def wrapper_config(s: Sizes, vocab: int) -> dict:
    """Kimi-K2.5's config.json layout: the KimiK25ForConditionalGeneration wrapper, the kimi_k2 (DeepSeek-V3)
    text model under ``text_config`` with its ``quantization_config``; Kimi-K2's rope, routing and scaling."""
    text = kimi_like_config(
        "gpu", num_hidden_layers=s.layers, hidden_size=s.hidden, intermediate_size=s.dense_inter,
        num_attention_heads=s.heads, num_key_value_heads=s.heads, head_dim=s.nope + s.rope, n_routed_experts=s.experts,
        moe_intermediate_size=s.expert_inter, num_experts_per_tok=s.top_k, n_shared_experts=1, first_k_dense_replace=1,
        n_group=1, topk_group=1, vocab_size=vocab, q_lora_rank=s.q_lora, kv_lora_rank=s.kv_lora,
        qk_nope_head_dim=s.nope, qk_rope_head_dim=s.rope, v_head_dim=s.v_head, bos_token_id=1, eos_token_id=2,
        pad_token_id=0)
    text.pop("architectures")
    text.update(model_type="kimi_k2", quantization_config=pack_quantized_config())
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text,
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}


def init_weights(model: Transformer, seed: int) -> None:
    """N(0, 0.02) matrices (output projections / sqrt(2 L), GPT-2's residual scaling), norms 1, biases 0."""
    g = torch.Generator(device=model.embed_tokens.weight.device).manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * model.config.num_layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight", "down_proj")) else 0.02
                p.normal_(0.0, std, generator=g)
            else:
                p.fill_(1.0 if "norm" in name else 0.0)


class LoadBalancer:
    """DeepSeek-V3's auxiliary-loss-free balance: after each step, each router's ``e_score_correction_bias``
    moves by ``rate`` against its experts' load (up for the under-used, down for the over-used)."""

    def __init__(self, model: Transformer, rate: float = 1e-3) -> None:
        self.rate, self.loads = rate, {}
        self.hooks = [m.register_forward_hook(self._seen) for m in model.modules() if isinstance(m, Router)]

    def _seen(self, router: Router, _inputs, out) -> None:
        idx = out[1].detach().flatten()  # [N * k] expert ids
        # tokens per expert; not torch.bincount, which reads idx.max() back to the host on CUDA (a sync per router)
        load = torch.zeros(router.weight.shape[0], device=idx.device)
        self.loads[router] = load.index_add_(0, idx, torch.ones_like(idx, dtype=load.dtype))

    @torch.no_grad()
    def step(self) -> torch.Tensor:
        """Nudge every bias; the worst max/mean load of the step's routers (1.0 = perfectly even), a 0-d tensor on
        their device: read it only to print it (a ``float`` here would sync once per router, every step)."""
        worst = [load.max() / load.mean().clamp(min=1) for load in self.loads.values()]
        for router, load in self.loads.items():
            router.e_score_correction_bias += self.rate * torch.sign(load.mean() - load)
        self.loads.clear()
        return torch.stack(worst).max().clamp(min=1.0) if worst else torch.ones(())

    def close(self) -> None:
        for h in self.hooks:
            h.remove()


def lm_loss(model: Transformer, ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ids [B, T+1]."""
    x, y = ids[:, :-1], ids[:, 1:]
    positions = torch.arange(x.shape[1], device=x.device).expand_as(x)
    hidden, _ = model(x, positions)  # [B, T, H], causal (no cache)
    logits = model.logits(hidden)  # [B, T, V] float32
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def train(model: Transformer, stream: torch.Tensor, s: Sizes, budget_s: float, device: torch.device, seed: int) -> dict:
    """Random windows of ``stream`` for ``budget_s`` seconds of wall clock; progress lines every ~5 s."""
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2 and "embed" not in n]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and not (p.dim() >= 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=s.lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    balancer, g = LoadBalancer(model), torch.Generator().manual_seed(seed)
    stream = stream.to(device)
    model.train()
    start, step, tokens, shown, ema, losses, warmup = time.perf_counter(), 0, 0, 0.0, None, [], 20
    while (elapsed := time.perf_counter() - start) < budget_s:
        frac = elapsed / budget_s
        lr = s.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(stream) - s.seq - 1, (s.batch,), generator=g).to(device)
        batch = stream[starts[:, None] + torch.arange(s.seq + 1, device=device)]  # [B, T+1]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = lm_loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        imbalance = balancer.step()
        value = float(loss.detach())  # the step's one sync
        step, tokens = step + 1, tokens + s.batch * s.seq
        ema = value if ema is None else 0.95 * ema + 0.05 * value
        losses.append(value)
        if time.perf_counter() - start - shown >= 5.0:
            shown = time.perf_counter() - start
            print(f"  train {shown:6.1f}s  step {step:5d}  loss {ema:.3f}  lr {lr:.2e}  {tokens / shown:9.0f} tok/s"
                  f"  expert load max/mean {float(imbalance):.2f}", flush=True)
    balancer.close()
    wall = time.perf_counter() - start
    tail = losses[-max(1, len(losses) // 10):]
    return {"steps": step, "train_tokens": tokens, "train_wall_s": round(wall, 1), "tok_per_s": round(tokens / wall),
            "train_loss_last10pct": round(sum(tail) / len(tail), 4)}


@torch.no_grad()
def eval_loss(model: Transformer, windows: torch.Tensor, batch: int = 8) -> float:
    """Mean cross-entropy over held-out windows [N, T+1] (the model as it runs: its own dtype, no autocast)."""
    model.eval()
    dev = model.embed_tokens.weight.device
    total = sum(float(lm_loss(model, windows[i: i + batch].to(dev))) * len(windows[i: i + batch])
                for i in range(0, len(windows), batch))
    return total / len(windows)


# ---- 4. the checkpoint --------------------------------------------------------------------------------------
def checkpoint_tensors(model: Transformer) -> dict[str, torch.Tensor]:
    """Kimi-K2.5's stored tensors: routed experts packed INT4 (per expert), everything else bf16 (the routing
    bias float32, as DeepSeek-V3 ships it), under ``language_model.``."""
    out: dict[str, torch.Tensor] = {}
    for mod_name, mod in model.named_modules():
        parts = getattr(mod, "checkpoint_names", None)
        for attr, p in mod.named_parameters(recurse=False):
            full = f"{mod_name}.{attr}" if mod_name else attr
            hf = "language_model." + (full if full.startswith("lm_head") else "model." + full)
            if parts is None:
                keep = torch.float32 if attr == "e_score_correction_bias" else torch.bfloat16
                out[hf] = p.detach().to(keep).cpu().contiguous()
                continue
            stem = "language_model.model." + mod_name
            for e, name in enumerate(parts(attr)):  # "E.gate_proj.weight": packed as compressed-tensors writes it
                base = f"{stem}.{name.removesuffix('.weight')}"
                for k, t in pack_quantized(p[e].detach().to(torch.bfloat16)).items():
                    out[f"{base}.{k}"] = t.cpu()
    return out


def _layer_of(name: str) -> int:
    parts = name.split(".")
    return int(parts[3]) if parts[2] == "layers" else (-1 if "embed_tokens" in name else 1 << 30)


def write_checkpoint(tensors: dict[str, torch.Tensor], config: dict, out: Path, shards: int) -> list[str]:
    """``shards`` safetensors files split by layer (embedding first, norm and head last), the index, config.json."""
    from safetensors.torch import save_file

    names = sorted(tensors, key=lambda n: (_layer_of(n), n))
    layers = sorted({_layer_of(n) for n in names})
    per = math.ceil(len(layers) / shards)
    files, weight_map = [], {}
    for k in range(shards):
        chunk = set(layers[k * per: (k + 1) * per])
        part = {n: tensors[n] for n in names if _layer_of(n) in chunk}
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_atomic(out / file, lambda tmp, part=part: save_file(part, str(tmp), metadata={"format": "pt"}),
                     what="target weights")
        weight_map.update({n: file for n in part})
        files.append(file)
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return files


# ---- 5. bf16 vs INT4 experts ----------------------------------------------------------------------------------
def quantization_cost(trained: Transformer, target_dir: Path, windows: torch.Tensor, device: torch.device,
                      tok, prompt: str) -> dict:
    """Held-out loss of the written checkpoint as eaglelab loads it (INT4 experts dequantized on load), then of
    the same loaded model with the trained experts (bf16) copied back in: only the experts differ. Also the
    INT4 model's greedy continuation of ``prompt`` (a held-out module's first lines)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    loaded = load_target(target_dir, device=device, dtype=dtype)
    int4 = eval_loss(loaded.model, windows)
    sample = greedy_sample(loaded.model, tok, prompt)
    with torch.no_grad():
        for ours, theirs in zip(loaded.model.layers, trained.layers):
            if hasattr(ours.mlp, "experts"):
                for attr in ("gate_proj", "up_proj", "down_proj"):
                    getattr(ours.mlp.experts, attr).copy_(getattr(theirs.mlp.experts, attr).to(torch.bfloat16))
    bf16 = eval_loss(loaded.model, windows)
    return {"int4_greedy_sample": sample, "heldout_loss_bf16_experts": round(bf16, 4), "heldout_loss_int4_experts": round(int4, 4),
            "int4_cost": round(int4 - bf16, 4), "load_notes": list(loaded.notes), "eval_dtype": str(dtype)}


@torch.no_grad()
def greedy_sample(model: Transformer, tok, prompt: str, new_tokens: int = 48) -> str:
    """The model's greedy continuation of ``prompt`` (full causal forwards, no cache: a sanity check only)."""
    dev = model.embed_tokens.weight.device
    ids = torch.tensor([tok.encode(prompt, add_special_tokens=False).ids[-400:]], device=dev)  # [1, T]
    start = ids.shape[1]
    for _ in range(new_tokens):
        positions = torch.arange(ids.shape[1], device=dev)[None]
        hidden, _ = model(ids, positions)
        ids = torch.cat([ids, model.logits(hidden[:, -1:]).argmax(-1)], dim=1)
    return tok.decode(ids[0, start:].tolist())


def windows_of(stream: torch.Tensor, seq: int, count: int) -> torch.Tensor:
    """The first ``count`` non-overlapping windows of seq+1 tokens: int64 [N, seq+1]."""
    n = min(count, (len(stream) - 1) // seq)
    assert n >= 1, f"the held-out text has {len(stream)} tokens, fewer than one window of {seq + 1}"
    return torch.stack([stream[i * seq: i * seq + seq + 1] for i in range(n)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path, help="output directory (target/, prompts, summary)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--train-s", type=float, default=None, help="training wall-clock budget (default 150; --small 6)")
    p.add_argument("--small", action="store_true", help="tiny sizes and few files (a CPU test)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    s, device = (SMALL if args.small else DEFAULT), torch.device(args.device)
    budget = args.train_s if args.train_s is not None else (6.0 if args.small else 150.0)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("kimi_target: --device cuda but torch sees no CUDA device; pass --device cpu (slow) or run on a GPU")
    t0, out = time.perf_counter(), args.out
    target = out / "target"
    target.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)

    files = stdlib_sources(s.max_files)
    train_files, held_files = split_files(files)
    if not held_files:  # a tiny --small run: keep one file out
        train_files, held_files = files[:-1], files[-1:]
    train_rows, held_rows = prompt_rows(train_files, held_files, s.train_prompts)
    write_prompts(out / "train_prompts.jsonl", train_rows)
    write_prompts(out / "heldout_prompts.jsonl", held_rows)
    tok = train_tokenizer([t for _, t in train_files], s.vocab, target)
    train_ids, held_ids = token_stream(tok, [t for _, t in train_files]), token_stream(tok, [t for _, t in held_files])
    t_data = time.perf_counter() - t0
    print(f"text: {len(train_files)} train / {len(held_files)} held-out stdlib files, {len(train_ids):,} / "
          f"{len(held_ids):,} tokens (BPE vocab {tok.get_vocab_size()}), {len(train_rows)} / {len(held_rows)} "
          f"prompts ({t_data:.1f}s)", flush=True)

    config = wrapper_config(s, tok.get_vocab_size())
    cfg = ModelConfig.from_dict(config, source="kimi_target")
    model = Transformer(cfg).to(device)
    init_weights(model, args.seed)
    model.reset_buffers()
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {cfg.num_layers} layers, hidden {cfg.hidden_size}, {cfg.moe.num_experts} experts x "
          f"{cfg.moe.expert_intermediate_size} top-{cfg.moe.top_k} + 1 shared, MLA q/kv rank "
          f"{cfg.mla.q_lora_rank}/{cfg.mla.kv_lora_rank}: {params / 1e6:.1f} M parameters on {device}", flush=True)
    stats = train(model, train_ids, s, budget, device, args.seed)

    t_write = time.perf_counter()
    shard_files = write_checkpoint(checkpoint_tensors(model), config, target, s.shards)
    t_write = time.perf_counter() - t_write
    windows = windows_of(held_ids, s.seq, s.eval_seqs)
    t_eval = time.perf_counter()
    prompt = held_rows[0]["prompt"] if held_rows else held_files[0][1][:2000]
    cost = quantization_cost(model, target, windows, device, tok, prompt)
    t_eval = time.perf_counter() - t_eval
    summary = {"config": config, "parameters": params, "sizes": asdict(s), "device": str(device),
               "train_files": len(train_files), "heldout_files": len(held_files), "train_corpus_tokens": len(train_ids),
               "heldout_tokens_scored": int(windows.numel() - len(windows)), **stats, **cost,
               "shards": shard_files, "data_s": round(t_data, 1), "write_s": round(t_write, 1),
               "load_and_eval_s": round(t_eval, 1), "wall_s": round(time.perf_counter() - t0, 1)}
    (out / "target_summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print_table(summary)
    return 0


def print_table(s: dict) -> None:
    rows = [("parameters", f"{s['parameters'] / 1e6:.1f} M"), ("train tokens", f"{s['train_tokens']:,} ({s['steps']} steps)"),
            ("train wall / tok/s", f"{s['train_wall_s']} s / {s['tok_per_s']:,}"),
            ("train loss (last 10%)", s["train_loss_last10pct"]),
            ("held-out loss, bf16 experts", s["heldout_loss_bf16_experts"]),
            ("held-out loss, INT4 experts", f"{s['heldout_loss_int4_experts']} ({s['int4_cost']:+.4f})"),
            ("checkpoint", f"{len(s['shards'])} shards, written in {s['write_s']} s"),
            ("total wall", f"{s['wall_s']} s (text + tokenizer {s['data_s']} s, load + eval {s['load_and_eval_s']} s)")]
    for k, v in rows:
        print(f"  {k:<30} {v}")
    print("  INT4 greedy continuation of the first held-out prompt: " + json.dumps(s["int4_greedy_sample"])[:300])
    for note in s["load_notes"]:
        print(f"  note: {note}")


if __name__ == "__main__":
    sys.exit(main())
