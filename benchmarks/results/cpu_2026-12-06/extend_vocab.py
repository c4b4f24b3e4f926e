"""Widen the shipped drafter's draft vocabulary with no training: the next target ids (lowest first, BPE's merge
order) outside it, their head rows the target's own (tied embedding) rescaled to the drafter's row norms, times an
optional factor (0: zero rows).    python extend_vocab.py OUT_DIR 16384 [FACTOR]"""
import json, sys
from pathlib import Path
import torch
from safetensors import safe_open
from safetensors.torch import save_file

src = Path("eaglelab/drafters/smollm2-135m-eagle3")  # run from the repository root
out, new_size = Path(sys.argv[1]), int(sys.argv[2])
tgt = str(Path.home() / ".cache/eaglelab/models/SmolLM2-135M-Instruct/model.safetensors")  # the default model
with safe_open(str(src / "model.safetensors"), "pt") as f:
    t = {k: f.get_tensor(k) for k in f.keys()}
with safe_open(tgt, "pt") as f:
    emb = f.get_tensor("model.embed_tokens.weight")
d2t, head = t["d2t"], t["lm_head.weight"]
old_ids = torch.arange(d2t.numel()) + d2t  # target id of each draft id
have = torch.zeros(emb.shape[0], dtype=torch.bool); have[old_ids] = True
extra = (~have).nonzero().squeeze(1)[: new_size - d2t.numel()]
ids, order = torch.sort(torch.cat([old_ids, extra]))
rows_old = head.float()
scale = rows_old.norm(dim=1).mean() / emb[old_ids].float().norm(dim=1).mean()  # drafter rows against target rows
cos = torch.nn.functional.cosine_similarity(rows_old, emb[old_ids].float(), dim=1)
print(f"draft rows against target rows: cosine mean {cos.mean():.3f}, norm ratio {scale:.3f}")
rows = torch.cat([rows_old, emb[extra].float() * scale * float(sys.argv[3] if len(sys.argv) > 3 else 1)])[order]
t["lm_head.weight"] = rows.to(head.dtype).contiguous()
t["d2t"] = (ids - torch.arange(ids.numel())).to(d2t.dtype)
t2d = torch.zeros_like(t["t2d"]); t2d[ids] = True; t["t2d"] = t2d
out.mkdir(parents=True, exist_ok=True)
save_file(t, str(out / "model.safetensors"))
cfg = json.loads((src / "config.json").read_text()); cfg["draft_vocab_size"] = ids.numel()
(out / "config.json").write_text(json.dumps(cfg, indent=2))
print(f"{out}: draft vocabulary {d2t.numel()} -> {ids.numel()} (highest new id {int(extra.max())})")
