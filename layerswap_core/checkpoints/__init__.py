"""Checkpoints, the bottom room: what a model on disk is and how to read and write it.

``reading`` (tensors one at a time: pread copies or zero-copy mapped views; the one safetensors
header parser), ``writing`` (the streaming sharded writer, atomic output folders, the cache
folder, the one cached build), ``references`` (folders, Hub ids and embedded models resolved to
a local folder), ``embedded`` (the registry of embedded models, the demo experts among them),
``adapters`` (PEFT adapters: the reader and the applier), ``loading`` (the device picker, model
and tokenizer, header summaries, adapters as dense models), ``tokenizers``
(tokenizer identity), ``compatibility`` (the one check that models can be used together) and
``architectures`` (parameter names -> layer and kind). Of layerswap_core it imports only
``progress``."""
