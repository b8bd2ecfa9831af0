"""Layer swapping (Algorithm 1 of the layer-swapping paper), declared once: its knobs (layer
counts, transitions, non-layer source, partition), its sources, its one-line description, the
checks that need the model's depth, the layer counts it records, and its mergekit YAML (slices)
out and in. The algorithm itself is told in ``plan.py``'s docstring.

mergekit: one slice per run of layers with one source (``passthrough`` when every tensor is a
copy, else ``linear``: a copied run is one source of weight 1, a transition run the two experts
with w_task / w_lang). mergekit takes the embeddings from the first slice's models and the final
norm / LM head from the last slice's; where those are not the non-layer choice, an empty slice
(``layer_range: [0, 0]`` first, ``[L, L]`` last) carries it. ``base_model`` is the task expert
(mergekit copies config.json and the tokenizer from it; the reader takes it as the task expert).
Partitions whose rules take whole layers are slices too; rules that split a layer by module kind
are refused (a mergekit slice takes whole layers). Read back: ``passthrough``/``linear`` slices
that keep every layer in place in the layer-swap pattern (language bottom, blend, task middle,
blend, language top).
"""
from __future__ import annotations

import re
from dataclasses import replace

from .errors import ConfigError
from .mergekit_parts import blend_sources, model_of, number, params, refuse
from .partition import check_partition_spec, value_text
from .registry import BLEND_KNOBS, Knob, Source, declare_method, weights_text

# Where the non-layer parameters come from under layer swapping (see ``plan.py``).
NON_LAYER_SOURCES = ("blend", "task", "lang")
PRE_KINDS = ("embed",)   # mergekit's pre_weights; final norm and LM head are its post_weights


def non_layer_text(config, blends: bool = False) -> str:
    if config.non_layer == "blend":
        return "non-layer parameters averaged, " + weights_text(config)
    src = "task expert" if config.non_layer == "task" else "language expert"
    return f"non-layer parameters from the {src}" + (", " + weights_text(config) if blends
                                                     else "")


BOTTOM = Knob("bottom", "count", None, optional=True, label="Bottom layers b (language)",
              help="bottom layers from the language expert (default: 5 of 32, scaled to the "
                   "model)")
TOP = Knob("top", "count", None, optional=True, label="Top layers u (language)",
           help="top layers from the language expert (default: 2 of 32, scaled)")
TRANSITION_BOTTOM = Knob("transition_bottom", "count", 0, label="Transition t_b (blended)",
                         short="t_b", help="blended layers above the bottom ones")
TRANSITION_TOP = Knob("transition_top", "count", 0, label="Transition t_u (blended)",
                      short="t_u", help="blended layers below the top ones")
NON_LAYER = Knob(
    "non_layer", "choice", "blend", choices=NON_LAYER_SOURCES, short="non-layer source",
    label="Non-layer parameters (embeddings, final norm, LM head)",
    help="layer swap: where the non-layer parameters (embeddings, final norm, LM head) come "
         "from: blend (default; Algorithm 1 averages them with the blend weights), task or lang")
PARTITION = Knob(
    "partition", "value", None, check=check_partition_spec, widget="partition",
    label="Partition (parameters to the language expert)",
    help="A, B, C (the published presets, in absolute layers), or a YAML file with a list of "
         "rules ({layers: '0-5', kinds: attention}; layers: non-layer addresses the embeddings, "
         "final norm and LM head)")
SCALE_PARTITION = Knob(
    "scale_partition", "bool", False, short="scale presets",
    label="Scale presets A/B/C to this depth (layerswap's own rule; the paper's presets are "
          "absolute layers)",
    help="scale the presets' published layer counts (for 32/36-layer models) to this model's "
         "depth: the tool's own rule, not the paper's")


def layer_zone(layer: int, num_layers: int, b: int, u: int, tb: int, tu: int) -> str:
    """"lang" | "blend" | "task" for a layer under Algorithm 1."""
    L = num_layers
    if layer < b or layer >= L - u:
        return "lang"
    if layer < b + tb or layer >= L - u - tu:
        return "blend"
    return "task"


def _swap_sources(config, names, arch, blend):
    L = arch.num_layers
    non_layer = blend if config.non_layer == "blend" else Source.copy(config.non_layer)
    sources = {}
    if config.partition is not None:
        part = config.partition_for(L)
        part.check_tied(names, arch)
        part.check_classified(names, arch)
        for n in names:
            to = part.rule_for(n, arch)
            sources[n] = Source.copy(to) if to is not None else \
                non_layer if arch.classify(n).layer is None else Source.copy("task")
        return sources
    b, u, tb, tu = config.layer_counts(L)
    zone_source = {"lang": Source.copy("lang"), "task": Source.copy("task"), "blend": blend}
    for n in names:
        layer = arch.classify(n).layer
        sources[n] = non_layer if layer is None else \
            zone_source[layer_zone(layer, L, b, u, tb, tu)]
    return sources


def _swap_blends(config) -> bool:
    return config.non_layer == "blend" or (
        config.partition is None and bool(config.transition_bottom or config.transition_top))


def _swap_check(config, num_layers: int):
    if config.partition is not None:
        config.partition_for(num_layers)  # raises on bad rules
        return
    b, u, tb, tu = config.layer_counts(num_layers)
    if b + tb + tu + u > num_layers:
        raise ConfigError(
            f"bottom + transition_bottom + transition_top + top = {b}+{tb}+{tu}+{u} = "
            f"{b + tb + tu + u} exceeds the model's {num_layers} layers")


def _swap_concrete(config, num_layers: int):
    """The bottom/top counts actually used (the defaults scale with the depth)."""
    if config.partition is not None:
        return config
    b, u, _, _ = config.layer_counts(num_layers)
    return replace(config, bottom=b, top=u)


def _swap_describe(config, num_layers: int | None) -> str:
    if config.partition is not None:
        if num_layers is not None:
            p = config.partition_for(num_layers).describe()
        else:
            p = config.partition if isinstance(config.partition, str) else "custom rules"
        return f"layer swap with partition {p}, {non_layer_text(config)}"
    if num_layers is not None:
        b, u, tb, tu = config.layer_counts(num_layers)
    else:
        b, u, tb, tu = (config.bottom, config.top, config.transition_bottom, config.transition_top)
    return f"layer swap: bottom {b}, top {u}, transitions {tb}/{tu}, " + \
        non_layer_text(config, bool(tb or tu))


# --------------------------------------------------------------------------- mergekit
def _to_mergekit(config, plan, paths: dict, notes: list) -> dict:
    """A layer swap (or whole-layer partition) plan as mergekit slices."""
    arch, L = plan.arch, plan.num_layers
    per_layer: dict[int, dict[Source, list[str]]] = {l: {} for l in range(L)}
    pre: dict[Source, None] = {}
    post: dict[Source, None] = {}
    for name, src in plan.sources.items():
        info = arch.classify(name)
        if info.layer is None:
            (pre if info.kind in PRE_KINDS else post)[src] = None
        else:
            per_layer[info.layer].setdefault(src, []).append(info.kind)
    for l, by_src in per_layer.items():
        if len(by_src) > 1:
            parts = "; ".join(f"{s.label}: {', '.join(sorted(set(k)))}" for s, k in by_src.items())
            raise ConfigError(f"mergekit cannot express a partition that splits layer {l} by module "
                              f"kind ({parts}): a mergekit slice takes whole layers")
    for what, found in (("embeddings", pre), ("final norm and LM head", post)):
        if len(found) > 1:
            raise ConfigError(f"mergekit cannot express the {what} from different sources "
                              f"({', '.join(s.label for s in found)})")
    runs: list[list] = []   # [start, end, source]
    for l in range(L):
        (src,) = per_layer[l]
        if runs and runs[-1][2] == src:
            runs[-1][1] = l + 1
        else:
            runs.append([l, l + 1, src])
    pre_src = next(iter(pre or post), None)
    post_src = next(iter(post or pre), None)
    if pre_src is not None and runs[0][2] != pre_src:
        runs.insert(0, [0, 0, pre_src])
    if post_src is not None and runs[-1][2] != post_src:
        runs.append([L, L, post_src])
    if len(runs[0][2].models) != len(runs[-1][2].models):
        # mergekit reads the post weights with as many inputs as the FIRST slice has
        raise ConfigError("mergekit cannot express the embeddings and the final norm from a "
                          "different number of models")
    copies_only = all(s.method == "copy" for _, _, s in runs)
    slices = []
    for start, end, src in runs:
        if src.method == "copy":
            entry = {"model": paths[src.model], "layer_range": [start, end]}
            if not copies_only:
                entry["parameters"] = {"weight": 1.0}
            sources = [entry]
        elif src.method == "linear":
            sources = blend_sources(src, paths, notes, (start, end))
        else:
            raise ConfigError(f"mergekit cannot express per-tensor method {src.method} in slices")
        slices.append({"sources": sources})
    return {"merge_method": "passthrough" if copies_only else "linear",
            "base_model": paths["task"], "slices": slices}



def _from_mergekit(doc: dict, num_layers: int | None) -> dict | None:
    """Every YAML with slices is a layer swap's (or refused)."""
    if "slices" not in doc:
        return None
    return _from_slices(doc["slices"], doc.get("merge_method"), doc.get("base_model"),
                        doc.get("parameters"), num_layers)


def _from_slices(slices, method, task, glob, num_layers) -> dict:
    if method not in ("passthrough", "linear"):
        refuse(f"slices with merge_method {method!r}: layerswap reads slices of "
                "passthrough or linear (a layer swap)")
    if task is None:
        refuse("slices without base_model: set base_model to the task expert (the model whose "
                "middle layers are kept)")
    if not isinstance(slices, list) or not slices:
        refuse("slices must be a non-empty list")
    if not params(glob).get("normalize", True):
        refuse("linear with normalize: false is a plain sum; a layer-swap blend is an average")
    runs = []   # (start, end, {model: weight})
    at = 0
    for i, s in enumerate(slices):
        if not isinstance(s, dict) or not isinstance(s.get("sources"), list) or not s["sources"]:
            refuse(f"slice {i}: needs a list of sources")
        if set(s) - {"sources", "parameters"}:
            refuse(f"slice {i}: {', '.join(sorted(set(map(str, s)) - {'sources', 'parameters'}))}"
                    " not supported")
        ranges, weights = set(), {}
        for src in s["sources"]:
            model = model_of(src, f"slice {i}")
            r = src.get("layer_range")
            if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and
                                                                not isinstance(x, bool) for x in r)):
                refuse(f"slice {i}: layer_range must be [start, end], got {value_text(r)}")
            ranges.add(tuple(r))
            p = params(src.get("parameters"), s.get("parameters"), glob)
            if method == "passthrough" and p.get("scale") not in (None, 1, 1.0):
                refuse(f"slice {i}: passthrough scale has no layerswap counterpart")
            if model in weights:
                refuse(f"slice {i}: {model} is given twice")
            weights[model] = number(p, "weight", f"slice {i}", 1.0 if method == "passthrough"
                                     else None)
        if len(ranges) != 1:
            refuse(f"slice {i}: its sources take different layer ranges")
        (start, end), = ranges
        if start != at or end < start:
            refuse(f"slice {i} takes layers [{start}, {end}) at output layer {at}: layer swapping "
                    "keeps every layer in place (no moved, repeated or dropped layers)")
        at = end
        runs.append((start, end, weights))
    if num_layers is not None and at != num_layers:
        refuse(f"the slices cover {at} layers, the model has {num_layers}")
    models = {m for _, _, w in runs for m in w}
    if task not in models and models:
        models.add(task)
    if len(models) != 2:
        refuse(f"a layer swap takes two models (base_model is the task expert), got "
                f"{len(models)}: {', '.join(sorted(models))}")
    (lang,) = models - {task}

    def kind(w: dict) -> str:
        if len(w) == 1:
            return "task" if task in w else "lang"
        if any(v < 0 for v in w.values()) or sum(w.values()) <= 0:
            refuse(f"blend weights {value_text(w)}: a layer-swap blend is an average")
        return "blend"

    layers = [(kind(w), w) for s, e, w in runs for _ in range(e - s)]
    pattern = "".join({"lang": "L", "blend": "B", "task": "T"}[k] for k, _ in layers)
    m = re.fullmatch(r"(L*)(B*)(T*)(B*)(L*)", pattern)
    if m is None:
        refuse("the slices do not follow the layer-swap pattern (language bottom, blend, task "
                "middle, blend, language top)")
    blends = [w for k, w in layers if k == "blend"]
    # the non-layer choice: the first slice gives the embeddings, the last the norm / LM head
    pre, post = (kind(runs[0][2]), runs[0][2]), (kind(runs[-1][2]), runs[-1][2])
    if pre[0] != post[0] or (pre[0] == "blend" and pre[1] != post[1]):
        refuse("the embeddings (first slice) and the final norm / LM head (last slice) come from "
                "different sources: layerswap's non_layer takes one source for all of them")
    if pre[0] == "blend":
        blends.append(pre[1])
    if any(w != blends[0] for w in blends):
        refuse("blends with different weights: layerswap blends with one w_task : w_lang")
    w = blends[0] if blends else {task: 1.0, lang: 1.0}
    b, tb, _, tu, u = (len(g) for g in m.groups())
    return dict(method="layer_swap", bottom=b, top=u, transition_bottom=tb, transition_top=tu,
                w_task=w[task], w_lang=w[lang], non_layer=pre[0], task=task, lang=lang)



DECLARED = (declare_method(
    "layer_swap", "layer swap",
    knobs=(BOTTOM, TOP, TRANSITION_BOTTOM, TRANSITION_TOP, *BLEND_KNOBS, NON_LAYER, PARTITION,
           SCALE_PARTITION),
    sources=_swap_sources, describe=_swap_describe, linear=True, blends=_swap_blends,
    check=_swap_check, concrete=_swap_concrete, to_mergekit=_to_mergekit,
    from_mergekit=_from_mergekit, mergekit_reads="passthrough/linear slices",
    partition_replaces=(BOTTOM.name, TOP.name, TRANSITION_BOTTOM.name, TRANSITION_TOP.name)),)
