"""Probe overhead: tok/s with every probe on (bus, run record, TensorBoard, console totals) against
no observer at all, same engine, same prompts, alternating runs, medians.

    python benchmarks/probe_overhead.py [--device cuda] [--draft default|ngram|none] [--repeats 5]

On CUDA the runs use the CUDA-graph runner (as `eaglelab run` does), so this also shows that
probes add no graph breaks: the graph column must read the same with probes on and off. Every run
shares one runner, as the requests of one server would: the warm-up runs capture (and compile) the
graphs both settings need, and the timed runs replay them (capture is not decoding, and `run`,
`bench` and the TUI keep it out of tok/s too). It also
prints the host time the observer takes per cycle (building stats, events, record, TensorBoard):
the engine hands it each cycle's stats one cycle late, so on a GPU that time overlaps the device's
next cycle instead of adding to it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from eaglelab.engine.runtime.observer import CycleStats
from eaglelab.probes.bus import ProbeBus
from eaglelab.probes.record import RecordWriter
from eaglelab.probes.sinks import ConsoleSummary, TensorBoardSink
from eaglelab.session import add_engine_args, build_session


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(p)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prompt", default="Write a short story about a lighthouse keeper who finds a message in a bottle.")
    args = p.parse_args()
    session = build_session(args, log=print)
    ids = [session.target.tokenizer.chat_ids(args.prompt)]
    tmp = tempfile.mkdtemp()
    runner = session.runner()  # shared: captured once (see the docstring)

    observer_s: list[float] = []  # host seconds inside on_cycle, per cycle, probes on

    def probes_on():
        bus = TimedBus(observer_s)
        record = RecordWriter(f"{tmp}/run.jsonl")
        tb = TensorBoardSink(f"{tmp}/tb")
        for sink in (record, tb, ConsoleSummary(print_on_finish=False)):
            bus.subscribe(sink)
        return bus, (record.close, tb.close)

    def one(observed: bool) -> tuple[float, dict]:
        bus, closers = probes_on() if observed else (None, ())
        engine = session.engine(observer=bus, runner=runner)
        t0 = time.perf_counter()
        out = engine.generate(ids, args.max_new_tokens, session.sampling, session.generator())
        if session.target.device.type == "cuda":
            torch.cuda.synchronize()
        secs = time.perf_counter() - t0
        for close in closers:
            close()
        return out.generated_tokens / secs, engine.graph_status("spec" if session.spec.enabled else "decode", 1)

    one(False), one(True)  # warm-up (and graph capture)
    off, on, graphs = [], [], {}
    for _ in range(args.repeats):
        off.append(one(False)[0])
        tps, graphs["on"] = one(True)
        on.append(tps)
    graphs["off"] = one(False)[1]
    a, b = statistics.median(off), statistics.median(on)
    dev = session.device_label
    print(f"hardware: {dev}, {session.dtype_name}, torch {torch.__version__}, threads {torch.get_num_threads()}")
    print(f"workload: {session.spec_label or 'plain decoding'}; {args.max_new_tokens} new tokens, batch 1, "
          f"{args.repeats} alternating runs each, medians")
    print(f"probes off: {a:.1f} tok/s   probes on (bus + record + TensorBoard + totals): {b:.1f} tok/s   "
          f"ratio on/off: {b / a:.3f}")
    print(f"observer host time per cycle (probes on): median {statistics.median(observer_s) * 1e3:.3f} ms "
          f"over {len(observer_s)} cycles")
    print(f"graph status, probes off: {graphs['off']}")
    print(f"graph status, probes on:  {graphs['on']}")


class TimedBus(ProbeBus):
    """The probe bus, timing its own per-cycle work (stats to events, totals, every sink)."""

    def __init__(self, seconds: list[float]) -> None:
        super().__init__()
        self.seconds = seconds

    def on_cycle(self, stats: CycleStats) -> None:
        t0 = time.perf_counter()
        super().on_cycle(stats)
        self.seconds.append(time.perf_counter() - t0)


if __name__ == "__main__":
    main()
