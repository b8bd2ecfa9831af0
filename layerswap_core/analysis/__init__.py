"""Analysis: per-row delta statistics of each expert against the base (``deltas``, cached; LoRA
adapters through ``providers``), and the layer swap they suggest (``suggest``). Feeds the plan's
suggestions and the app's heatmaps."""
