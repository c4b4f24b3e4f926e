"""File formats: HF checkpoint and GGUF loading, drafter checkpoints, SpecForge data, layer-id conventions,
packaged assets, the tokenizer."""
