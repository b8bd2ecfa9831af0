"""The demo: one record per demo trio (``trios``: its models and their recipes, the variant set,
the result file, the page's words and defaults), the demo's measure and statistics
(``measure``), the result reproduced (``reproduce``) and the experts' held-out NLL table
(``heldout``). Between ``training`` and ``engines``: it reads the registries below it and
registers nothing above; the page's job kind and charts stay in ``workbench.demo``."""
