"""The models: config, shared layers, the target (dense and MoE), the EAGLE-3 network, tensor-parallel
(sharded) layers, checkpoint tensor names (``weights.py``), scale presets. Nothing here reads a file:
loading is :mod:`eaglelab.engine.formats` (one layer up)."""
