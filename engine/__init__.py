"""eaglelab.engine: models, KV cache, drafters, tree, verify, the speculative loop, CUDA graphs,
tensor parallelism, loading, training and the checkpoint/data formats.

Imports nothing of eaglelab's other packages; observers plug in through :mod:`.observer`.
"""
