"""benchmarks/export_drafter.py: a drafter saved as one file comes out as the two shards it ships in."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from benchmarks.export_drafter import export


def _drafter(tmp_path: Path) -> dict[str, torch.Tensor]:
    tensors = {"lm_head.weight": torch.randn(32, 8), "fc.weight": torch.randn(8, 24), "midlayer.x": torch.randn(4)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))
    return tensors


def test_the_head_goes_alone_in_the_first_shard_and_every_tensor_round_trips(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    tensors = _drafter(src)
    sizes = export(src, out)
    assert sorted(sizes) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert index == {"lm_head.weight": "model-00001-of-00002.safetensors",
                     "fc.weight": "model-00002-of-00002.safetensors", "midlayer.x": "model-00002-of-00002.safetensors"}
    back = {}
    for shard in sizes:
        back.update(load_file(str(out / shard)))
    assert back.keys() == tensors.keys() and all(torch.equal(back[n], tensors[n]) for n in tensors)
    assert json.loads((out / "config.json").read_text()) == {"architectures": ["LlamaForCausalLMEagle3"]}


def test_a_folder_without_the_drafter_file_is_a_clear_error(tmp_path):
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "export_drafter.py"
    done = subprocess.run([sys.executable, str(script), str(tmp_path), str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert done.returncode != 0 and "model.safetensors not found" in done.stderr and "Traceback" not in done.stderr
