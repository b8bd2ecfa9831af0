"""Checkpoints, the bottom room: what a model on disk is and how to read and write it.

``reading`` (tensors one at a time: pread copies or zero-copy mapped views; the one safetensors
header parser), ``writing`` (the streaming sharded writer, atomic output folders, the cache
folder), ``references`` (embedded models, folders, Hub ids, resolved to a local folder),
``loading`` (the device picker, model and tokenizer, header summaries), ``tokenizers``
(tokenizer identity), ``compatibility`` (the one check that models can be used together) and
``architectures`` (parameter names -> layer and kind). Of layerswap_core it imports only
``progress`` (and names the embedded-model plugins, loaded by name)."""
