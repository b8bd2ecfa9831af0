"""Merge: per-tensor methods, partitions, the merge methods' registry (each method once, with its
knobs), the config (``MergeConfig``), the pure merge plan (parameter name -> where it comes from),
one function from a plan's source to a tensor (``apply``), the executor that streams a plan into
a folder, the live model that applies it in memory, and the
same plans over LoRA adapters. Reads checkpoints; knows nothing of evaluation or the app."""
