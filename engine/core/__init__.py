"""The core every other engine layer builds on: the KV cache, the tensor-parallel group and the
config-field checks. It imports nothing of the engine but :mod:`eaglelab.engine.errors`, so
``model``, ``formats``, ``runtime`` and ``training`` can all use it without importing each other."""
