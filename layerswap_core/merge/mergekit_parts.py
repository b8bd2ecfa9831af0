"""The parts a merge method's mergekit writer and reader are made of (``MergeMethod.to_mergekit``
and ``from_mergekit`` in each ``method_<id>.py``; ``mergekit_yaml.py`` runs them): a blend's
sources written as mergekit's ``linear`` computes them, and a mergekit YAML's parameters,
numbers and model entries read with mergekit's precedence, each refusal one line."""
from __future__ import annotations

import math

from .errors import ConfigError
from .partition import value_text
from .registry import Source


# --------------------------------------------------------------------------- out
def exact_product(w: float) -> bool:
    """Whether w * x is exact in float32 for every float32 x (0, or a power of two)."""
    import numpy as np
    w32 = float(np.float32(w))
    return w32 == 0 or math.frexp(abs(w32))[0] == 0.5


def blend_sources(src: Source, paths: dict, notes: list, layers) -> list[dict]:
    """The sources of a ``linear`` blend, the expert with an exact product second (see
    ``mergekit_yaml``'s docstring), a note where neither product is exact."""
    import numpy as np
    pairs = list(zip(src.models, src.weights))
    if len(pairs) == 2 and not exact_product(pairs[1][1]) and exact_product(pairs[0][1]):
        pairs.reverse()
    note = None
    if len(pairs) == 2 and not exact_product(pairs[1][1]):
        note = (f"blend weights {src.weights[0]:g} : {src.weights[1]:g}: mergekit's linear fuses "
                "the second product into the sum (one rounding), layerswap rounds it first: "
                "blended entries can differ in the last bit (bit-identical when a weight is 0 or "
                "a power of two, e.g. 1:1, 3:1)")
    elif np.float32(pairs[0][1]) + np.float32(pairs[1][1]) != np.float32(sum(src.weights)):
        note = (f"blend weights {src.weights[0]:g} : {src.weights[1]:g}: their float32 sum differs "
                "from the float32 of their sum: blended entries can differ in the last bit")
    if note and note not in notes:
        notes.append(note)
    out = []
    for model, w in pairs:
        entry = {"model": paths[model]}
        if layers is not None:
            entry["layer_range"] = list(layers)
        entry["parameters"] = {"weight": float(w)}
        out.append(entry)
    return out


# --------------------------------------------------------------------------- in
def refuse(why: str):
    raise ConfigError(f"mergekit YAML: {why}")


def scalar(value, what: str):
    if isinstance(value, (list, dict)):
        refuse(f"{what}: per-tensor filters and gradients ({value_text(value)}) have no layerswap "
               "counterpart")
    return value


def params(*layers) -> dict:
    """Parameters with mergekit's precedence (first given wins), each a scalar."""
    out: dict = {}
    for layer in layers:
        if layer is None:
            continue
        if not isinstance(layer, dict):
            refuse(f"parameters must be a mapping, got {value_text(layer)}")
        for k, v in layer.items():
            out.setdefault(k, scalar(v, f"parameter {k}"))
    return out


def number(params: dict, key: str, what: str, default=None) -> float:
    v = params.get(key, default)
    if v is None:
        refuse(f"{what}: no {key} given")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        refuse(f"{what}: {key} must be a number, got {value_text(v)}")
    return float(v)


def model_of(entry, what: str) -> str:
    if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
        refuse(f"{what}: each entry needs a model (a folder or Hub id)")
    return entry["model"]


def two_models(doc: dict) -> tuple[str, str, list[dict]] | None:
    """(task, lang, each one's parameters over the global ones) of a YAML's two ``models``
    (the task expert first, the language expert second); None unless it has two."""
    models = doc.get("models")
    if not isinstance(models, list) or len(models) != 2:
        return None
    task, lang = (model_of(m, "models") for m in models)
    return task, lang, [params(m.get("parameters"), doc.get("parameters")) for m in models]


def task_vectors(doc: dict) -> tuple[str, str, str, dict, list[dict], list[float]] | None:
    """(task, lang, base, the global parameters, each model's parameters, each model's weight)
    of a YAML of mergekit's task-vector family (``task_arithmetic``, ``ties``: the deltas of
    two ``models`` from ``base_model``), after the checks they share; None unless two models."""
    method, two = doc.get("merge_method"), two_models(doc)
    if two is None:
        return None
    task, lang, p = two
    base = doc.get("base_model")
    if base is None:
        refuse(f"{method} needs base_model")
    shared = params(doc.get("parameters"))
    if shared.get("rescale") or any(k in pp for pp in p for k in ("gamma", "epsilon")):
        refuse(f"{method} with rescale/gamma/epsilon has no layerswap counterpart")
    return task, lang, base, shared, p, [number(pp, "weight", m) for pp, m in zip(p, (task, lang))]
