"""mergekit YAML out and in: ``to_mergekit`` writes the merge a ``MergeConfig`` builds as a
mergekit config, ``from_mergekit`` reads a mergekit config into a ``MergeConfig``.

Out. The YAML is written from the plan (which source for every tensor), so it is the merge
layerswap builds, or a one-line ``ConfigError`` naming what mergekit cannot express:

- layer swap: one slice per run of layers with one source (``passthrough`` when every tensor is a
  copy, else ``linear``: a copied run is one source of weight 1, a transition run the two experts
  with w_task / w_lang). mergekit takes the embeddings from the first slice's models and the
  final norm / LM head from the last slice's; where those are not the non-layer choice, an empty
  slice (``layer_range: [0, 0]`` first, ``[L, L]`` last) carries it. ``base_model`` is the task
  expert (mergekit copies config.json and the tokenizer from it; ``from_mergekit`` reads it as the
  task expert). Partitions whose rules take whole layers are slices too.
- soup: ``linear`` over the two experts; task arithmetic: ``task_arithmetic`` (normalize false);
  TIES: ``ties`` (weights 1, normalize true, ``lambda``). Each method's own declaration says
  which (``registry.MergeMethod.mergekit``: ``SLICES``, ``BLEND`` or its own writer).
- refused: magnitude-adjusted weights (computed from the deltas at merge time; mergekit has no
  such weighting) and so the magnitude soup; partition rules that split a layer by module kind
  (a mergekit slice takes whole layers).

Bit for bit: mergekit computes in float32 (``dtype: float32``; ``out_dtype`` the output's dtype),
copies are copies (a one-source ``linear`` slice of weight 1 only turns -0.0 into +0.0), task
arithmetic sums as mergekit does. Where the result can differ in the last bits, ``notes`` says so:
mergekit's ``linear`` fuses each product after the first into the sum (``addcmul``, one
rounding), layerswap rounds it first, so a blend is bit-identical when one of its weights is 0 or
a power of two (that expert is listed second) and not otherwise; TIES keeps every entry tied with
a tensor's trim threshold, mergekit exactly k of them.

In. ``from_mergekit`` maps ``linear`` over two models (soup), ``task_arithmetic``, ``ties`` and
``passthrough``/``linear`` slices that keep every layer in place in the layer-swap pattern
(language bottom, blend, task middle, blend, language top) to a config, and refuses anything else
with the reason. Roles: with ``models``, the first is the task expert and the second the
language expert (``base_model`` the base for task arithmetic / TIES); with ``slices``,
``base_model`` is the task expert.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from ..checkpoints.compatibility import open_models
from ..checkpoints.references import resolve
from .config import DTYPES, MergeConfig, load_yaml
from .errors import ConfigError
from .partition import value_text
from .plan import build_plan
from .registry import BLEND, SLICES, Source, concrete, get_method

__all__ = ["to_mergekit", "from_mergekit", "mergekit_file", "read_mergekit", "Opened"]

PRE_KINDS = ("embed",)   # mergekit's pre_weights; final norm and LM head are its post_weights


class Opened(NamedTuple):
    """What the YAML needs of the models, already opened (headers): the references as given,
    their folders, the task expert's architecture, tensor names and dtypes (safetensors names)."""
    refs: dict
    paths: dict
    arch: Any
    names: list
    task_dtypes: set

    @classmethod
    def of(cls, models) -> Opened:
        """From a ``ModelSet`` (``checkpoints.compatibility``)."""
        task = models.readers["task"]
        return cls(dict(models.refs), {r: str(p) for r, p in models.paths.items()}, models.arch,
                   list(models.names), {task.dtype(n) for n in models.names})


# --------------------------------------------------------------------------- out
def to_mergekit(config: MergeConfig, *, task=None, lang=None, base=None,
                models=None, folders: bool = True) -> tuple[str, list[str]]:
    """(the mergekit YAML of the merge ``config`` builds, notes). The models default to the
    config's; the task expert's headers are read (layers, tensor names, dtype) unless ``models``
    (an ``Opened``, e.g. a session's) gives them and the references.
    ConfigError (one line, naming the part) where mergekit cannot express the merge.
    ``folders=False``: every model as its reference, an ``embedded:NAME`` too (a server's
    visitor: the server's folders are not theirs), with a note where mergekit needs a folder.
    """
    given = models.refs if models is not None else {}
    refs = {"task": task or config.task, "lang": lang or config.lang, "base": base or config.base}
    refs = {r: v or given.get(r) for r, v in refs.items()}
    refs = {r: str(v) for r, v in refs.items() if v is not None}
    for role in ("task", "lang"):
        if role not in refs:
            raise ConfigError(f"mergekit YAML: the {role} expert is missing (give --{role})")
    config = replace(config, **{r: refs.get(r) for r in ("task", "lang", "base")})
    config.validate(has_base="base" in refs)
    if config.uses_magnitude:
        raise ConfigError("mergekit cannot express magnitude-adjusted weights (computed from the "
                          "deltas at merge time; it has no such weighting): give --w-task/--w-lang")
    if models is None:
        models = Opened.of(open_models({"task": refs["task"]}))
    config = concrete(config, models.arch.num_layers)
    plan = build_plan(config, models.names, models.arch)
    notes: list[str] = []
    _experts(plan, notes)
    paths = {}
    for role, ref in refs.items():  # mergekit reads folders and Hub ids, not embedded:NAME
        if ref.startswith("embedded:") and not folders:
            paths[role] = ref
            notes.append(f"{role}: {ref} is a model of layerswap's install: write its folder "
                         "there for mergekit (`layerswap prepare` prints it)")
        elif ref.startswith("embedded:"):
            paths[role] = str(models.paths[role] if role in models.paths else resolve(ref))
        else:
            paths[role] = ref
        if paths[role] != ref:
            notes.append(f"{role}: {ref} is written as its folder {paths[role]}")
    out_dtype = config.dtype or _torch_dtype_name(models.task_dtypes)
    doc: dict = {"merge_method": None}
    method = get_method(config.method)
    if method.mergekit == SLICES:
        doc.update(_slices(plan, paths, notes))
    elif method.mergekit == BLEND:
        doc.update(merge_method="linear", base_model=paths["task"],
                   models=_blend_sources(Source("linear", ("task", "lang"),
                                                (config.w_task, config.w_lang)),
                                         paths, notes, layers=None))
    elif method.mergekit is not None:
        doc.update(method.mergekit(config, paths, notes))
    else:
        raise ConfigError(f"mergekit has no counterpart of method {config.method}")
    donor = "base" if method.needs_base else "task"   # mergekit's base_model
    if donor == "base":
        notes.append("config.json and the tokenizer: mergekit copies them from base_model (the "
                     "base), layerswap from the task expert; the tensors are the same")
    tok = config.tokenizer_source or "task"
    if tok != donor:
        notes.append(f"tokenizer: layerswap takes it from the {tok} model, mergekit copies it "
                     f"from the {donor} model (mergekit's tokenizer_source would rebuild the "
                     "embeddings, so it is not written): copy the tokenizer files yourself")
    doc["dtype"] = "float32"
    if out_dtype != "float32":
        doc["out_dtype"] = out_dtype
    return _dump(doc, plan, notes), notes


# Mixture-of-experts types mergekit (0.1.5, requirements-dev.txt) merges whole, each checked
# against mergekit itself on a tiny trio (tests/test_moe_families.py): True where it writes the
# experts fused, as transformers 5 holds them (mlp.experts.gate_up_proj / down_proj), rather than
# as the checkpoint stores them. Any other MoE type is refused: deepseek_v3's merge leaves its
# experts out without a word (mergekit has no architecture for it).
MERGEKIT_MOE = {"mixtral": True, "qwen2_moe": True, "qwen3_moe": True, "glm4_moe": True,
                "granitemoe": True, "llama4_text": False, "gpt_oss": False}


def _experts(plan, notes: list[str]) -> None:
    """Refuse, in one line, a mixture-of-experts merge mergekit cannot express: a type it does
    not merge whole, a rule that takes single experts (a slice takes whole layers), TIES where
    mergekit trims a fused tensor of all a layer's experts and layerswap each expert's own;
    else a note where mergekit writes the experts fused."""
    arch = plan.arch
    if not arch.experts:
        return
    if arch.model_type not in MERGEKIT_MOE:
        raise ConfigError(f"mergekit YAML: mergekit does not merge the experts of a "
                          f"{arch.model_type} model (mixture-of-experts types it merges whole: "
                          f"{', '.join(MERGEKIT_MOE)})")
    by_layer: dict[int, set] = {}
    for name, src in plan.sources.items():
        if arch.classify(name).kind == "moe_experts":
            by_layer.setdefault(arch.classify(name).layer, set()).add(src)
    split = next((layer for layer, srcs in by_layer.items() if len(srcs) > 1), None)
    if split is not None:
        raise ConfigError(f"mergekit cannot express a rule that takes single experts (layer "
                          f"{split}): a mergekit slice takes whole layers")
    if MERGEKIT_MOE[arch.model_type]:
        if plan.config.method == "ties":
            raise ConfigError(f"mergekit cannot express TIES on a {arch.model_type} model as "
                              "layerswap merges it: mergekit trims each layer's fused tensor of "
                              "all its experts, layerswap each expert's own tensor")
        notes.append("experts: mergekit writes each layer's experts fused (one tensor per "
                     "projection, as transformers 5 holds them), layerswap one tensor per expert "
                     "as the checkpoint stores them; transformers loads both into the same model")


def _torch_dtype_name(st_dtypes: set[str]) -> str:
    names = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
    found = {names.get(d, d) for d in st_dtypes}
    if len(found) != 1 or not found <= set(DTYPES):
        raise ConfigError(f"mergekit YAML: the task expert's tensors are {', '.join(sorted(found))}"
                          " (one output dtype needed): give --dtype")
    return found.pop()


def _exact_product(w: float) -> bool:
    """Whether w * x is exact in float32 for every float32 x (0, or a power of two)."""
    import numpy as np
    w32 = float(np.float32(w))
    return w32 == 0 or math.frexp(abs(w32))[0] == 0.5


def _blend_sources(src: Source, paths: dict, notes: list, layers) -> list[dict]:
    """The sources of a ``linear`` blend, the expert with an exact product second (see the
    module docstring), a note where neither product is exact."""
    import numpy as np
    pairs = list(zip(src.models, src.weights))
    if len(pairs) == 2 and not _exact_product(pairs[1][1]) and _exact_product(pairs[0][1]):
        pairs.reverse()
    note = None
    if len(pairs) == 2 and not _exact_product(pairs[1][1]):
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


def _slices(plan, paths: dict, notes: list) -> dict:
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
            sources = _blend_sources(src, paths, notes, (start, end))
        else:
            raise ConfigError(f"mergekit cannot express per-tensor method {src.method} in slices")
        slices.append({"sources": sources})
    return {"merge_method": "passthrough" if copies_only else "linear",
            "base_model": paths["task"], "slices": slices}


def _dump(doc: dict, plan, notes: list[str]) -> str:
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def seq(dumper, data):  # numbers (layer ranges) in flow style
        flow = all(isinstance(x, (int, float)) for x in data)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)
    Dumper.add_representer(list, seq)
    head = [f"# mergekit config written by layerswap: {plan.config.describe(plan.num_layers)}",
            "# run: mergekit-yaml THIS_FILE OUTPUT_FOLDER"]
    if "slices" in doc:
        head.append("# mergekit takes the embeddings from the first slice's models and the final "
                    "norm / LM head from the last slice's (an empty slice there carries them)")
    head += [f"# note: {n}" for n in notes]
    return "\n".join(head) + "\n" + yaml.dump(doc, Dumper=Dumper, sort_keys=False)


def mergekit_file(config: MergeConfig, models: Opened, folders: bool = True) -> tuple[str, str]:
    """(file name, text) for a merge recipe over ``models`` (``Opened``):
    ("mergekit.yaml", the YAML) when mergekit can express the merge, else
    ("mergekit-not-expressible.txt", the reason). ``folders``: as ``to_mergekit``'s."""
    try:
        text, _ = to_mergekit(config, models=models, folders=folders)
        return "mergekit.yaml", text
    except ConfigError as e:
        return "mergekit-not-expressible.txt", f"{e}\n"


# --------------------------------------------------------------------------- in
def _refuse(why: str):
    raise ConfigError(f"mergekit YAML: {why}")


def _scalar(value, what: str):
    if isinstance(value, (list, dict)):
        _refuse(f"{what}: per-tensor filters and gradients ({value_text(value)}) have no layerswap "
                "counterpart")
    return value


def _params(*layers) -> dict:
    """Parameters with mergekit's precedence (first given wins), each a scalar."""
    out: dict = {}
    for layer in layers:
        if layer is None:
            continue
        if not isinstance(layer, dict):
            _refuse(f"parameters must be a mapping, got {value_text(layer)}")
        for k, v in layer.items():
            out.setdefault(k, _scalar(v, f"parameter {k}"))
    return out


def _number(params: dict, key: str, what: str, default=None) -> float:
    v = params.get(key, default)
    if v is None:
        _refuse(f"{what}: no {key} given")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        _refuse(f"{what}: {key} must be a number, got {value_text(v)}")
    return float(v)


def _model(entry, what: str) -> str:
    if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
        _refuse(f"{what}: each entry needs a model (a folder or Hub id)")
    return entry["model"]


def from_mergekit(text: str, num_layers: int | None = None) -> MergeConfig:
    """The ``MergeConfig`` of a mergekit YAML (see the module docstring for what maps);
    ConfigError with the reason for anything else. ``num_layers``: the model's depth, checked
    against the layers the slices cover."""
    doc = load_yaml(text, "mergekit config")
    if not isinstance(doc, dict):
        _refuse(f"must be a mapping, got {value_text(doc)}")
    known = {"merge_method", "base_model", "dtype", "out_dtype", "parameters", "models", "slices"}
    other = sorted(set(map(str, doc)) - known)
    if other:
        _refuse(f"{', '.join(other)} not supported (layerswap reads merge_method, base_model, "
                "dtype, out_dtype, parameters, models, slices)")
    dtype = doc.get("out_dtype") or doc.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        _refuse(f"dtype {value_text(dtype)}: layerswap writes {', '.join(DTYPES)}")
    method, base = doc.get("merge_method"), doc.get("base_model")
    if base is not None and not isinstance(base, str):
        _refuse(f"base_model must be a model reference, got {value_text(base)}")
    glob = doc.get("parameters")
    if ("models" in doc) == ("slices" in doc):
        _refuse("give exactly one of models or slices")
    if "slices" in doc:
        return _from_slices(doc["slices"], method, base, glob, dtype, num_layers)
    models = doc["models"]
    if not isinstance(models, list) or len(models) != 2:
        _refuse("layerswap merges exactly two models (the task expert first, the language expert "
                f"second), got {value_text(models)}")
    task, lang = (_model(m, "models") for m in models)
    p = [_params(m.get("parameters"), glob) for m in models]
    if method == "linear":
        if base is not None and base not in (task, lang):
            _refuse("base_model is a third input of a linear merge: layerswap's soup averages two")
        if not _params(glob).get("normalize", True):
            _refuse("linear with normalize: false is a plain sum; layerswap's soup is an average")
        return MergeConfig(method="soup", w_task=_number(p[0], "weight", task),
                           w_lang=_number(p[1], "weight", lang), dtype=dtype, task=task, lang=lang)
    if method not in ("task_arithmetic", "ties"):
        _refuse(f"merge_method {method!r} has no layerswap counterpart (layerswap reads "
                "linear, task_arithmetic, ties, and passthrough/linear slices)")
    if base is None:
        _refuse(f"{method} needs base_model")
    shared = _params(glob)
    lam = _number(shared, "lambda", method, 1.0)
    if shared.get("rescale") or any(k in pp for pp in p for k in ("gamma", "epsilon")):
        _refuse(f"{method} with rescale/gamma/epsilon has no layerswap counterpart")
    w = [_number(pp, "weight", m) for pp, m in zip(p, (task, lang))]
    if method == "task_arithmetic":
        if any(_number(pp, "density", "task_arithmetic", 1.0) != 1 for pp in p):
            _refuse("task_arithmetic with density < 1 (sparsified) has no layerswap counterpart")
        scale = lam / (sum(w) if shared.get("normalize", False) and abs(sum(w)) >= 1e-8 else 1)
        return MergeConfig(method="task_arithmetic", lambda_task=w[0] * scale,
                           lambda_lang=w[1] * scale, dtype=dtype, task=task, lang=lang, base=base)
    d = [_number(pp, "density", "ties", 1.0) for pp in p]
    if d[0] != d[1] or w[0] != w[1] or w[0] <= 0:
        _refuse("ties with different weights or densities per model: layerswap's TIES weighs the "
                "two experts alike")
    if not shared.get("normalize", True):
        _refuse("ties with normalize: false has no layerswap counterpart")
    return MergeConfig(method="ties", ties_density=d[0], ties_lambda=lam, dtype=dtype,
                       task=task, lang=lang, base=base)


def _from_slices(slices, method, task, glob, dtype, num_layers) -> MergeConfig:
    if method not in ("passthrough", "linear"):
        _refuse(f"slices with merge_method {method!r}: layerswap reads slices of "
                "passthrough or linear (a layer swap)")
    if task is None:
        _refuse("slices without base_model: set base_model to the task expert (the model whose "
                "middle layers are kept)")
    if not isinstance(slices, list) or not slices:
        _refuse("slices must be a non-empty list")
    if not _params(glob).get("normalize", True):
        _refuse("linear with normalize: false is a plain sum; a layer-swap blend is an average")
    runs = []   # (start, end, {model: weight})
    at = 0
    for i, s in enumerate(slices):
        if not isinstance(s, dict) or not isinstance(s.get("sources"), list) or not s["sources"]:
            _refuse(f"slice {i}: needs a list of sources")
        if set(s) - {"sources", "parameters"}:
            _refuse(f"slice {i}: {', '.join(sorted(set(map(str, s)) - {'sources', 'parameters'}))}"
                    " not supported")
        ranges, weights = set(), {}
        for src in s["sources"]:
            model = _model(src, f"slice {i}")
            r = src.get("layer_range")
            if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and
                                                                not isinstance(x, bool) for x in r)):
                _refuse(f"slice {i}: layer_range must be [start, end], got {value_text(r)}")
            ranges.add(tuple(r))
            p = _params(src.get("parameters"), s.get("parameters"), glob)
            if method == "passthrough" and p.get("scale") not in (None, 1, 1.0):
                _refuse(f"slice {i}: passthrough scale has no layerswap counterpart")
            if model in weights:
                _refuse(f"slice {i}: {model} is given twice")
            weights[model] = _number(p, "weight", f"slice {i}", 1.0 if method == "passthrough"
                                     else None)
        if len(ranges) != 1:
            _refuse(f"slice {i}: its sources take different layer ranges")
        (start, end), = ranges
        if start != at or end < start:
            _refuse(f"slice {i} takes layers [{start}, {end}) at output layer {at}: layer swapping "
                    "keeps every layer in place (no moved, repeated or dropped layers)")
        at = end
        runs.append((start, end, weights))
    if num_layers is not None and at != num_layers:
        _refuse(f"the slices cover {at} layers, the model has {num_layers}")
    models = {m for _, _, w in runs for m in w}
    if task not in models and models:
        models.add(task)
    if len(models) != 2:
        _refuse(f"a layer swap takes two models (base_model is the task expert), got "
                f"{len(models)}: {', '.join(sorted(models))}")
    (lang,) = models - {task}

    def kind(w: dict) -> str:
        if len(w) == 1:
            return "task" if task in w else "lang"
        if any(v < 0 for v in w.values()) or sum(w.values()) <= 0:
            _refuse(f"blend weights {value_text(w)}: a layer-swap blend is an average")
        return "blend"

    layers = [(kind(w), w) for s, e, w in runs for _ in range(e - s)]
    pattern = "".join({"lang": "L", "blend": "B", "task": "T"}[k] for k, _ in layers)
    m = re.fullmatch(r"(L*)(B*)(T*)(B*)(L*)", pattern)
    if m is None:
        _refuse("the slices do not follow the layer-swap pattern (language bottom, blend, task "
                "middle, blend, language top)")
    blends = [w for k, w in layers if k == "blend"]
    # the non-layer choice: the first slice gives the embeddings, the last the norm / LM head
    pre, post = (kind(runs[0][2]), runs[0][2]), (kind(runs[-1][2]), runs[-1][2])
    if pre[0] != post[0] or (pre[0] == "blend" and pre[1] != post[1]):
        _refuse("the embeddings (first slice) and the final norm / LM head (last slice) come from "
                "different sources: layerswap's non_layer takes one source for all of them")
    if pre[0] == "blend":
        blends.append(pre[1])
    if any(w != blends[0] for w in blends):
        _refuse("blends with different weights: layerswap blends with one w_task : w_lang")
    w = blends[0] if blends else {task: 1.0, lang: 1.0}
    b, tb, _, tu, u = (len(g) for g in m.groups())
    return MergeConfig(method="layer_swap", bottom=b, top=u, transition_bottom=tb,
                       transition_top=tu, w_task=w[task], w_lang=w[lang], non_layer=pre[0],
                       dtype=dtype, task=task, lang=lang)


def read_mergekit(path, task=None) -> MergeConfig:
    """``from_mergekit`` of the file ``path``; slices are checked against the depth of the task
    expert (``task``, else the YAML's base_model) when it can be opened. Errors name the file."""
    try:
        text = Path(path).read_text()
        cfg = from_mergekit(text)
        if cfg.method == "layer_swap":
            num_layers = open_models({"task": str(task or cfg.task)}).arch.num_layers
            from_mergekit(text, num_layers)
        return cfg
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
