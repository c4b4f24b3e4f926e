"""The benchmark harness behind ``eaglelab bench``: timed plain/speculative/HF runs, micro-measures,
the MT-bench prompt loader. Not a probe: it drives the engine, it does not observe it."""
