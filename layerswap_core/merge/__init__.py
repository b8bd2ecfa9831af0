"""Merge: per-tensor methods, partitions, the merge methods' registry (each method once, with its
knobs), the config (``MergeConfig``), the pure merge plan (parameter name -> where it comes from),
the executor that streams a plan into a folder, the in-memory recomposer and live model, and the
same plans over LoRA adapters. Reads checkpoints; knows nothing of evaluation or the app."""
