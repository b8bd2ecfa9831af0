"""The Gradio page's tabs, one module each: a tab's layout, its callbacks, the outputs of its
events and its wiring together. ``app.py`` composes them into one page (``app.Page``).

``common`` holds what every tab shares (the page's access and visitor, the session's top line,
the line on each tab naming the merge it acts on, one-line errors, progress bars, Cancel);
``models``, ``deltas``, ``configure``, ``build``, ``evaluate`` (with ``demo``: the demo result,
shown on the Evaluate tab), ``sweep`` and ``chat`` are the tabs; ``budget`` the Evaluate and
Sweep tabs' maxima and estimates; ``agents`` the agent (MCP) endpoints.

Each tab is a class whose methods are the page's: the page is one object (a visitor's events
read and write the same components, e.g. Build reads the Configure tab's controls), made of
the tabs' classes. A tab names its components ``self.<name>`` and declares ``OUTPUTS`` (each
event's outputs, by name: the API returns them in that order) and ``VIEWS`` (its views of
earlier results, with their empty values: a new session empties them). Only the page's
callbacks and layout import gradio; what they show comes from ``layerswap_core.workbench``.
"""
