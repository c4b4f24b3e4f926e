"""A trained drafter (one ``model.safetensors``) as two shards under 16 MiB each, the head alone in the first,
with the index and the drafter's JSON files beside them: the form the drafter ships in, and one the device tool
can bring back (it returns files under 16 MiB).

    python benchmarks/export_drafter.py DRAFTER_DIR OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from safetensors.torch import load_file, save_file

SHARD_LIMIT = 16 * 2**20


def export(src: Path, out: Path) -> dict[str, int]:
    """Write the shards, the index and the JSON files of ``src`` into ``out``. -> bytes per shard."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(src / "model.safetensors"))
    parts = [["lm_head.weight"], sorted(n for n in tensors if n != "lm_head.weight")]
    weight_map = {}
    for i, names in enumerate(parts):
        name = f"model-0000{i + 1}-of-00002.safetensors"
        save_file({n: tensors[n].contiguous() for n in names}, str(out / name), metadata={"format": "pt"})
        weight_map.update({n: name for n in names})
    index = {"metadata": {}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    for f in src.glob("*.json"):
        (out / f.name).write_text(f.read_text())
    sizes = {p.name: p.stat().st_size for p in out.glob("*.safetensors")}
    if any(s >= SHARD_LIMIT for s in sizes.values()):
        raise SystemExit(f"export_drafter: a shard is 16 MiB or more: {sizes}")
    return sizes


def main() -> None:
    if len(sys.argv) != 3:
        raise SystemExit("usage: python benchmarks/export_drafter.py DRAFTER_DIR OUT_DIR")
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    if not (src / "model.safetensors").is_file():
        raise SystemExit(f"export_drafter: {src / 'model.safetensors'} not found (a drafter saved by `eaglelab train`)")
    sizes = export(src, out)
    print("exported", sorted(p.name for p in out.iterdir()), f"{sum(sizes.values())} bytes of weights")


if __name__ == "__main__":
    main()
