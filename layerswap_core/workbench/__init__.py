"""Workbench: what the app shows, as plain functions over a per-visitor session. ``served``
(limits, what visitors may touch, one-line errors), ``session`` (the Session, the dispatcher),
one module per tab (``models``, ``configure``, ``build``, ``deltas``, ``evaluate``, ``sweep``,
``chat``, ``demo``), the figures and the placement on a Space (``spaces``). Work on a model goes
to the engines (``layerswap_core.engines``) as plain-data jobs. The Gradio page in app.py only
lays these out."""
