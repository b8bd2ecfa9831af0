"""Workbench: what the app shows, as plain functions over a per-visitor session. ``served``
(limits, what visitors may touch, one-line errors), ``session`` (the Session; the Models,
Configure and Build tabs), one module per other tab (``deltas``, ``evaluate``, ``sweep``,
``chat``), the figures and the ZeroGPU shim. The Gradio page in app.py only lays these out."""
