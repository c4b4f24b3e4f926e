"""eaglelab.engine: models, KV cache, drafters, tree, verify, the speculative loop, CUDA graphs,
tensor parallelism, loading, training and the checkpoint/data formats.

Five sub-packages in layers that import one way, bottom to top: ``core`` (KV cache, TP group,
config-field checks; with :mod:`.errors`) <- ``model`` (the networks; no file reads) <- ``formats``
(files: loading builds models) <- ``runtime`` (the loop and its contracts) <- ``training``
(``tests/engine/test_layers.py`` enforces it). Imports nothing of eaglelab's other packages; observers
plug in through :mod:`.runtime.observer`, drafters and runners through :mod:`.runtime.contracts`.
"""
