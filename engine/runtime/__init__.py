"""The runtime: the speculative loop, runners (eager, CUDA graphs), KV cache, tree, acceptance, sampling,
drafters, timing, the tensor-parallel group and the contracts (observer, drafter, runner)."""
