"""The runtime: the speculative loop (the cycle listed once in ``cycle.py``, run by ``generate.py``),
runners (eager, CUDA graphs), tree, verification, sampling, drafters, timing and the contracts
(observer, drafter, runner). The KV cache and the TP group it uses are in :mod:`eaglelab.engine.core`."""
