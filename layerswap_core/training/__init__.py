"""Training: the SFT trainer (full, LoRA, partial, simultaneous), the demo experts' data recipes,
and the shipped demo experts (registered as embedded models from the top, lazily)."""
