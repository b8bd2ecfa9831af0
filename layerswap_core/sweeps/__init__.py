"""Sweeps: a grid of merge configurations, each shown on a live model (engine) and scored, in an
order that rewrites the fewest tensors, resumable from ``DIR/results.jsonl``, on this process
(``local``) or on Ray actors (``ray``, an optional extra imported only by ``ray_backend``)."""
