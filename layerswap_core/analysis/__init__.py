"""Analysis: per-row delta statistics of each expert against the base (cached), and the layer
swap they suggest. Feeds the plan's suggestions and the app's heatmaps."""
