"""Speculative decoding from Python with the probes attached.

    python examples/speculate.py "Explain what a KV cache is."

Loads the default target and the drafter shipped for it, generates greedily with EAGLE-3 (a tree of
8 tokens per verify), checks the output against plain greedy decoding, and prints the probes'
summary (per-phase costs, acceptance, verdict). Writes a run record you can replay with
`eaglelab tui run.jsonl`.
"""

from __future__ import annotations

import sys
from pathlib import Path

import eaglelab
from eaglelab.engine.runtime.drafters import Eagle3Drafter
from eaglelab.engine.formats.drafter_loader import load_eagle3
from eaglelab.engine.runtime.generate import Engine
from eaglelab.engine.formats.loader import load_target
from eaglelab.engine.runtime.spec_config import SpecConfig
from eaglelab.probes.bus import ProbeBus
from eaglelab.probes.record import RecordWriter
from eaglelab.probes.sinks import ConsoleSummary

prompt = sys.argv[1] if len(sys.argv) > 1 else "Explain what a KV cache is."
target = load_target("default")  # SmolLM2-135M-Instruct, float32 on CPU
drafter_dir = Path(eaglelab.__file__).parent / "drafters" / "smollm2-135m-eagle3"
net, taps, why = load_eagle3(drafter_dir, target.model)
print(f"drafter taps: {why}")

spec = SpecConfig("eagle3", num_steps=5, topk=4, num_draft_tokens=8, attention_mode="decode")
bus = ProbeBus()
summary = ConsoleSummary(print_on_finish=True)
bus.subscribe(summary)
with RecordWriter("run.jsonl") as record:
    bus.subscribe(record)
    ids = [target.tokenizer.chat_ids(prompt)]
    eos = target.tokenizer.eos_token_ids
    spec_out = Engine(target.model, eos_token_ids=eos, drafter=Eagle3Drafter(net, spec, taps), spec=spec,
                      observer=bus).generate(ids, 96)
plain = Engine(target.model, eos_token_ids=eos).generate(ids, 96)
print(target.tokenizer.decode(spec_out.tokens[0]))
print(f"identical to plain greedy decoding: {spec_out.tokens == plain.tokens}; "
      f"{spec_out.tokens_per_second:.1f} tok/s vs {plain.tokens_per_second:.1f} tok/s plain; "
      f"mean accepted length {spec_out.mean_accept_len:.2f}")
