"""Checkpoints: model references (embedded, folders, Hub ids, adapters), reading and writing
safetensors, loading models and tokenizers, and the table of architectures (parameter names ->
layer and kind). The bottom of the house: it imports nothing else of layerswap_core."""
