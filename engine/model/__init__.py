"""The models: config, shared layers, the target (dense and MoE), the EAGLE-3 drafter, tensor-parallel
(sharded) layers, scale presets."""
