"""The demo: its data (the held-out variant sets, ``variants``, Bengali's, ``bengali``, and its
experts' data recipes, ``recipes``), one record per demo trio (``trios``: its models and their
recipes, the variant set, the result file, the page's words and defaults), the cross-fitting
(``folds``), the demo's measure and statistics (``measure``), the result reproduced
(``reproduce``) and the experts' held-out NLL table (``heldout``). Between ``training`` and
``engines``: it reads the registries below it and registers into them (``demos.recipes`` its
recipes into ``training.recipes``, ``demos.variants`` the ``demo-variants`` task into
``evaluation.registry``); nothing below imports it, so the entry points that look a recipe or a
task up by name import those modules first. The page's job kind and charts stay in
``workbench.demo``."""
