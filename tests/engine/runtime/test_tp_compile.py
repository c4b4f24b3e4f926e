"""TP under --compile: collectives inside a compiled phase."""

from __future__ import annotations

import torch


def test_a_compiled_phase_runs_its_collectives_untimed(tmp_path):
    """--compile under TP: a phase with an all-reduce compiles whole (fullgraph); the collective still
    sums, and neither the timing hook nor the arrival clock is traced into it."""
    import torch.distributed as dist

    from eaglelab.engine.runtime.tp_group import TPGroup

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        seen: list = []
        tp = TPGroup(rank=0, world_size=1, backend="nccl", hook=lambda *a: seen.append(a))
        tp.arrivals = []

        def step(x):
            y = x * 2
            tp.all_reduce(y, 0, "attn")
            return y + 1

        out = torch.compile(step, fullgraph=True, dynamic=False)(torch.ones(4))
        assert torch.equal(out, torch.full((4,), 3.0))
        assert seen == [] and tp.arrivals == []
    finally:
        dist.destroy_process_group()
