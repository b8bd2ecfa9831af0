"""The Gradio page's tabs, one module each: a tab's layout, its callbacks, the outputs of its
events and its wiring together. ``app.py`` composes them into one page (``app.compose``).

``common`` holds the page's shared part (``PageBase``: the page's access and visitor, the
session state, the top line, the line on each tab naming the merge it acts on, what a new
session empties, Cancel) and the ``Tab`` base; ``models``, ``deltas``, ``configure``,
``build``, ``evaluate`` (with ``demo``: the demo result, shown on the Evaluate tab), ``sweep``
and ``chat`` are the tabs; ``budget`` the Evaluate and Sweep tabs' maxima and estimates;
``agents`` the agent (MCP) endpoints.

Each tab is its own object, given the page's shared part (``self.page``). It names its
components ``self.<name>``; its ``layout()`` returns a small dataclass of what other tabs may
use (``ConfigureHandles``: its controls, the reader of the merge configured, the updates for
new models), and its ``wire(demo, ...)`` is given the other tabs' handles it needs: no tab
reads another's attributes (``tests/test_architecture.py`` checks it). A tab declares
``OUTPUTS`` (each event's outputs, by name: the API returns them in that order) and ``VIEWS``
(its views of earlier results, with their empty values: a new session empties them). Only the
page's callbacks and layout import gradio; what they show comes from
``layerswap_core.workbench``.
"""
