"""The runtime: the speculative loop, runners (eager, CUDA graphs), KV cache, tree, acceptance, sampling,
drafters, timing and the observer seam."""
