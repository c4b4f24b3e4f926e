"""eaglelab.engine: models, KV cache, drafters, tree, verify, the speculative loop, CUDA graphs,
tensor parallelism, loading, training and the checkpoint/data formats.

Four sub-packages: ``runtime`` (the loop and its contracts), ``model``, ``formats``, ``training``.
Imports nothing of eaglelab's other packages; observers plug in through :mod:`.runtime.observer`,
drafters and runners through :mod:`.runtime.contracts`.
"""
