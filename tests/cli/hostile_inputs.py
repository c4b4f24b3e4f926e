"""Valid inputs for every file eaglelab reads, tiny and seeded, and a way to run the CLI on them.

The hostile-input tests start from these and break one thing at a time: a drafter (config.json +
safetensors) for a 4-layer random target, SpecForge samples captured from that target, a run record
and an SGLang log. Nothing here loads the real default model.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from eaglelab.cli import main
from eaglelab.engine.formats.draft_checkpoint import expected_tensor_shapes
from eaglelab.engine.formats.draft_export import save_draft_checkpoint, sglang_config
from eaglelab.engine.formats.specforge_data import Sample, write_sample
from eaglelab.errors import INTERNAL_ERROR_EXIT
from tests.conftest import random_model, save_hf_dir, tiny_config

OK_EXITS = {0, 1, 2, 4}  # 4: check-wiring's 'not checked numerically' (inconclusive)
AUX_IDS = [0, 1, 2]  # SGLang convention: hs[1], hs[2], hs[3] of the 4-layer target
DRAFT_VOCAB = 32

SGLANG_LOG = "\n".join([
    "[2025-06-01 09:59:40 TP0] Capture cuda graph end. Time elapsed: 12.34 s. mem usage=1.20 GB.",
    "[2025-06-01 09:59:41 TP0] Prefill batch, #new-seq: 1, #new-token: 1, #cached-token: 0, token usage: 0.00, "
    "#running-req: 0, #queue-req: 0, cuda graph: False, ",
    "[2025-06-01 09:59:42] The server is fired up and ready to roll!",
    '[2025-06-01 09:59:43] INFO:     127.0.0.1:5000 - "GET /health HTTP/1.1" 200 OK',
    "[2025-06-01 10:00:01 TP0] Decode batch, #running-req: 1, #token: 530, token usage: 0.01, accept len: 2.43, "
    "accept rate: 0.36, cuda graph: True, gen throughput (token/s): 88.91, #queue-req: 0, ",
    "[2025-06-01 10:00:02 TP0] Decode batch. #running-req: 1, #token: 570, token usage: 0.01, accept len: 1.90, "
    "cuda graph: False, gen throughput (token/s): 61.20, #queue-req: 0,",
]) + "\n"


@dataclass(frozen=True)
class Inputs:
    """Paths of one set of valid inputs."""

    target: Path  # HF directory of the tiny target
    drafter: Path  # its EAGLE-3 drafter
    data: Path  # SpecForge samples from the target, aux slots hs[1..3]
    record: Path  # a finished run record
    log: Path  # an SGLang server log


def make_inputs(root: Path) -> Inputs:
    """Write every valid input under ``root``."""
    cfg = tiny_config()
    model = random_model(cfg, seed=0)
    target = save_hf_dir(model, cfg, root / "target")
    drafter = make_drafter(root / "drafter", cfg)
    data = make_data(root / "data", model)
    record = make_record(root / "run.jsonl")
    log = root / "server.log"
    log.write_text(SGLANG_LOG)
    return Inputs(target, drafter, data, record, log)


def make_drafter(path: Path, target_cfg: dict) -> Path:
    """A random EAGLE-3 drafter for the tiny target, in SGLang/SpecForge format."""
    h, vocab = target_cfg["hidden_size"], target_cfg["vocab_size"]
    cfg = sglang_config(hidden_size=h, vocab_size=vocab, draft_vocab_size=DRAFT_VOCAB, aux_layer_ids=AUX_IDS,
                        num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, target_hidden_size=h,
                        max_position_embeddings=target_cfg["max_position_embeddings"])
    shapes = expected_tensor_shapes(hidden_size=h, aux_hidden_size=h, num_aux=3, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=h // 4, intermediate_size=128, vocab_size=vocab,
                                    draft_vocab_size=DRAFT_VOCAB)
    gen = torch.Generator().manual_seed(1)
    tensors = {k: 0.1 * torch.randn(s, generator=gen) for k, s in shapes.items() if k not in ("d2t", "t2d")}
    tensors["d2t"] = torch.zeros(DRAFT_VOCAB, dtype=torch.long)
    tensors["t2d"] = torch.arange(vocab) < DRAFT_VOCAB
    return save_draft_checkpoint(path, cfg, tensors)


def make_data(path: Path, model, samples: int = 3, tokens: int = 12) -> Path:
    """``samples`` SpecForge samples of ``tokens`` tokens with the drafter's aux slots."""
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(3, model.config.vocab_size, (samples, tokens), generator=gen)
    with torch.inference_mode():
        hs = model.all_hidden_states(ids)
    for b in range(samples):
        aux = torch.cat([hs[i + 1][b : b + 1] for i in AUX_IDS], -1).bfloat16()  # [1, T, 3H]
        write_sample(path, b, Sample(ids[b].clone(), torch.ones(tokens, dtype=torch.long), hs[-1][b : b + 1].bfloat16(), aux))
    return path


def make_record(path: Path) -> Path:
    """A finished speculative run with plain-decode baseline steps."""
    from eaglelab.probes import events as ev
    from eaglelab.probes.record import RecordWriter

    spec = {"algorithm": "eagle3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4, "attention_mode": "decode",
            "cuda_graphs": False}
    events: list[ev.Event] = [ev.RunStarted("tiny", "d1", "cpu", "float32", 1, spec, {}, {"torch": "2"}),
                              ev.Step(0, "prefill", {"prefill": 40.0}, accept_len=(1,))]
    events += [ev.Step(i, "decode", {"decode": 12.0}, accept_len=(1,), graph={"decode": "replay"}) for i in range(1, 4)]
    events += [ev.Step(10 + i, "spec", {"draft": 3.0, "verify": 20.0, "accept": 0.5, "draft_extend": 2.0}, accept_len=(a,),
                       num_draft_tokens=4, verify_tokens=4, graph={"verify": "eager: prefill mode", "draft": "replay"})
               for i, a in enumerate((3, 2, 4))]
    events.append(ev.RunFinished(8, 13, 0.2, 7, None))
    with RecordWriter(path, mode="new") as writer:
        for event in events:
            writer(event)
    return path


def copy_tree(src: Path, dst: Path) -> Path:
    """A fresh copy of ``src`` at ``dst`` (replacing what was there)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    return dst


@dataclass(frozen=True)
class Outcome:
    """How one CLI call ended."""

    rc: int
    out: str
    err: str


def run_cli(argv: list[str], capsys) -> Outcome:
    """``eaglelab ARGV`` in this process; argparse's own refusals (SystemExit 2) count as exit 2."""
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    return Outcome(rc, captured.out, captured.err)


def assert_handled(o: Outcome, argv: list[str]) -> None:
    """The promise to the user: exit 0, 1 or 2; no traceback, no internal error; ``--json`` prints one object."""
    assert o.rc != INTERNAL_ERROR_EXIT, f"internal error for {argv}:\n{o.err}"
    assert o.rc in OK_EXITS, f"exit {o.rc} for {argv}:\n{o.err}"
    assert "Traceback" not in o.err and "Traceback" not in o.out, f"traceback for {argv}:\n{o.err}"
    if "--json" in argv:
        obj = json.loads(o.out, parse_constant=_no_constant)  # NaN / Infinity are not JSON
        assert isinstance(obj, dict), o.out


def _no_constant(name: str) -> None:
    raise AssertionError(f"{name} printed in JSON output")


def flat(text: str) -> str:
    """Rich wraps long lines at the terminal width: compare a message with its whitespace collapsed."""
    return " ".join(text.split())
