"""Model soups, declared once: the soup (every tensor the task/lang blend with w_task : w_lang;
mergekit's ``linear`` over the two experts, out and in) and the magnitude soup (the same blend
with the magnitude-adjusted weights, computed from the deltas at merge time: no mergekit
counterpart)."""
from __future__ import annotations

from .mergekit_parts import blend_sources, number, params, refuse, two_models
from .registry import BLEND_KNOBS, Source, declare_method, weights_text


def _soup_sources(config, names, arch, blend):
    return dict.fromkeys(names, blend)


def _to_mergekit(config, plan, paths, notes) -> dict:
    return dict(merge_method="linear", base_model=paths["task"],
                models=blend_sources(Source("linear", ("task", "lang"),
                                            (config.w_task, config.w_lang)),
                                     paths, notes, layers=None))


def _from_mergekit(doc: dict, num_layers) -> dict | None:
    """``linear`` over two models (the task expert first): a soup of their weights."""
    two = two_models(doc)
    if doc.get("merge_method") != "linear" or two is None:
        return None
    task, lang, p = two
    base = doc.get("base_model")
    if base is not None and base not in (task, lang):
        refuse("base_model is a third input of a linear merge: layerswap's soup averages two")
    if not params(doc.get("parameters")).get("normalize", True):
        refuse("linear with normalize: false is a plain sum; layerswap's soup is an average")
    return dict(method="soup", w_task=number(p[0], "weight", task),
                w_lang=number(p[1], "weight", lang), task=task, lang=lang)


# the soup, then the magnitude soup (registered in this order by config.py)
DECLARED = (
    declare_method(
        "soup", "model soup", knobs=BLEND_KNOBS, sources=_soup_sources,
        describe=lambda config, num_layers: "model soup, " + weights_text(config),
        linear=True, blends=lambda config: True, to_mergekit=_to_mergekit,
        from_mergekit=_from_mergekit, mergekit_reads="linear"),
    declare_method(
        "magnitude_soup", "magnitude soup", sources=_soup_sources,
        describe=lambda config, num_layers: "magnitude-weighted soup",
        needs_base=True, blends=lambda config: True, magnitude=True),
)
