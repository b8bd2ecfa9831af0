"""mergekit YAML out and in: ``to_mergekit`` writes the merge a ``MergeConfig`` builds as a
mergekit config, ``from_mergekit`` reads a mergekit config into a ``MergeConfig``.

Out. The YAML is written from the plan (which source for every tensor), so it is the merge
layerswap builds, or a one-line ``ConfigError`` naming what mergekit cannot express. Each method
writes its own part (``registry.MergeMethod.to_mergekit``, in its ``method_<id>.py``: a layer
swap as slices, a soup as ``linear``, task arithmetic as ``task_arithmetic`` (normalize false),
TIES as ``ties``); this module adds what every method shares: the models' paths, the refusal of
magnitude-adjusted weights (computed from the deltas at merge time; mergekit has no such
weighting, so the magnitude soup has no writer), ``dtype``/``out_dtype``, the notes on the
files mergekit copies, and the header.

Bit for bit: mergekit computes in float32 (``dtype: float32``; ``out_dtype`` the output's dtype),
copies are copies (a one-source ``linear`` slice of weight 1 only turns -0.0 into +0.0), task
arithmetic sums as mergekit does. Where the result can differ in the last bits, ``notes`` says so:
mergekit's ``linear`` fuses each product after the first into the sum (``addcmul``, one
rounding), layerswap rounds it first, so a blend is bit-identical when one of its weights is 0 or
a power of two (that expert is listed second: ``mergekit_parts.blend_sources``) and not
otherwise; TIES keeps every entry tied with a tensor's trim threshold, mergekit exactly k of them.

In. ``from_mergekit`` checks what every YAML shares (its keys, dtype, base_model, models or
slices) and hands the rest to the methods' readers in declaration order
(``registry.MergeMethod.from_mergekit``): the first that reads it gives the config, and a YAML no
method reads is refused with the reason. Roles: with ``models``, the first is the task expert and
the second the language expert (``base_model`` the base for task arithmetic / TIES); with
``slices``, ``base_model`` is the task expert.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from ..checkpoints.compatibility import open_models
from ..checkpoints.references import resolve
from .config import DTYPES, MergeConfig, load_yaml
from .errors import ConfigError
from .mergekit_parts import refuse
from .partition import value_text
from .plan import build_plan
from .registry import MERGE_METHODS, concrete, get_method

__all__ = ["to_mergekit", "from_mergekit", "mergekit_file", "read_mergekit", "Opened"]


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
    if method.to_mergekit is None:
        raise ConfigError(f"mergekit has no counterpart of method {config.method}")
    doc.update(method.to_mergekit(config, plan, paths, notes))
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
    not merge whole, a rule that takes single experts (a slice takes whole layers), a method
    whose record says why mergekit cannot express it on experts it writes fused
    (``MergeMethod.mergekit_fused_experts``: TIES, where mergekit trims a fused tensor of all a
    layer's experts and layerswap each expert's own); else a note where mergekit writes the
    experts fused."""
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
        method = get_method(plan.config.method)
        if method.mergekit_fused_experts:   # e.g. TIES (``MergeMethod.mergekit_fused_experts``)
            raise ConfigError(f"mergekit cannot express {method.label} on a {arch.model_type} "
                              f"model as layerswap merges it: {method.mergekit_fused_experts}")
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
def from_mergekit(text: str, num_layers: int | None = None) -> MergeConfig:
    """The ``MergeConfig`` of a mergekit YAML, read by the first method whose reader takes it
    (see the module docstring); ConfigError with the reason for anything else.
    ``num_layers``: the model's depth, checked against the layers the slices cover."""
    doc = load_yaml(text, "mergekit config")
    if not isinstance(doc, dict):
        refuse(f"must be a mapping, got {value_text(doc)}")
    known = {"merge_method", "base_model", "dtype", "out_dtype", "parameters", "models", "slices"}
    other = sorted(set(map(str, doc)) - known)
    if other:
        refuse(f"{', '.join(other)} not supported (layerswap reads merge_method, base_model, "
               "dtype, out_dtype, parameters, models, slices)")
    dtype = doc.get("out_dtype") or doc.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        refuse(f"dtype {value_text(dtype)}: layerswap writes {', '.join(DTYPES)}")
    method, base = doc.get("merge_method"), doc.get("base_model")
    if base is not None and not isinstance(base, str):
        refuse(f"base_model must be a model reference, got {value_text(base)}")
    if ("models" in doc) == ("slices" in doc):
        refuse("give exactly one of models or slices")
    for m in list(MERGE_METHODS.values()):
        fields = m.from_mergekit(doc, num_layers) if m.from_mergekit is not None else None
        if fields is not None:
            return MergeConfig(**fields, dtype=dtype)
    models = doc.get("models")
    if "models" in doc and (not isinstance(models, list) or len(models) != 2):
        refuse("layerswap merges exactly two models (the task expert first, the language expert "
               f"second), got {value_text(models)}")
    reads = [m.mergekit_reads for m in MERGE_METHODS.values() if m.mergekit_reads]
    refuse(f"merge_method {method!r} has no layerswap counterpart (layerswap reads "
           f"{', '.join(reads)})")


def read_mergekit(path, task=None) -> MergeConfig:
    """``from_mergekit`` of the file ``path``; slices are checked against the depth of the task
    expert (``task``, else the YAML's base_model) when it can be opened. Errors name the file."""
    try:
        text = Path(path).read_text()
        cfg = from_mergekit(text)
        if "slices" in load_yaml(text, "mergekit config"):   # layer ranges: the depth matters
            num_layers = open_models({"task": str(task or cfg.task)}).arch.num_layers
            from_mergekit(text, num_layers)
        return cfg
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
