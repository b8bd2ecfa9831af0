"""Merge configuration -> per-parameter source. Pure data: no tensors are read here.

A ``MergeConfig`` describes a merge (method, layer counts, weights, partition, dtype, models).
``build_plan`` turns it, with the parameter names and the architecture table, into a
``MergePlan``: for every parameter name, a ``Source`` saying which model(s) it comes from and
which per-tensor method (``methods.py``) combines them. The UI and CLI show the plan before
anything runs; the streaming executor and the in-memory recomposer both follow it.

Layer swapping (Algorithm 1 of the layer-swapping paper), with L layers (0-indexed), b bottom,
u top, t_b / t_u transition:

    l < b                          language expert
    b <= l < b + t_b               blend
    b + t_b <= l < L - u - t_u     task expert
    L - u - t_u <= l < L - u       blend
    l >= L - u                     language expert
    non-layer parameters           blend (``non_layer="blend"``, the default), or the task /
                                   language expert (``non_layer="task"`` / ``"lang"``)

blend = (w_task * task + w_lang * lang) / (w_task + w_lang), in float32 (the magnitude-adjusted
weights instead of w_task/w_lang when ``magnitude_weights`` is on). Non-layer parameters are
everything outside the decoder layers (embeddings, final norm, LM head: the architecture table
knows which): they have no layer number, so Algorithm 1's "language" and "task" branches do not
apply and they fall to its averaging branch (the paper: they "work best if they are also averages
of the two experts"). A tied LM head is the embedding tensor, so it always follows the embeddings.
With a ``partition`` (presets A/B/C or custom rules) the non-layer parameters also follow
``non_layer`` unless a rule addresses them (``layers: non-layer``, or the kinds embed,
final_norm, lm_head).
The other methods (soups, task arithmetic, TIES) combine every tensor alike; ``non_layer`` does
not apply to them.

Defaults for other depths (the tool's own rule, not the papers'): ``bottom``/``top`` None are
the 32-layer defaults 5/2 scaled to the model's depth; partition presets use the published layer
counts as given, scaled only with ``scale_partition``.
"""
from __future__ import annotations

import math
import re
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Iterable

from ..checkpoints.architectures import KIND_GROUPS, LAYER_KIND_ORDER, Architecture

MODELS = ("task", "lang", "base")
MERGE_METHODS = ("layer_swap", "soup", "magnitude_soup", "task_arithmetic", "ties")
DTYPES = ("bfloat16", "float16", "float32")
# Where the non-layer parameters come from under layer swapping (see the module docstring).
NON_LAYER_SOURCES = ("blend", "task", "lang")
# Methods that need the base model.
NEEDS_BASE = ("magnitude_soup", "task_arithmetic", "ties")

# The published defaults are for 32-layer models; other depths scale them (the tool's rule).
REFERENCE_LAYERS = 32
DEFAULT_BOTTOM, DEFAULT_TOP = 5, 2
# Layer counts the layer-swapping paper validated for its 32-layer models.
PAPER_RANGES_32 = {"bottom": (3, 4, 5), "top": (0, 1, 2), "transition": (0, 1, 2)}

# Bounds of the numeric fields (larger magnitudes are refused, never silently merged):
# w_task/w_lang only set the ratio of a blend, so 0..1e4 allows any sensible ratio while
# w * tensor stays far from float32/bfloat16 overflow; a lambda scales a delta, and past 100
# (published values are around 0.3-2) it only pushes weights out of range (float16 max 65504).
MAX_WEIGHT = 1e4
MAX_LAMBDA = 100.0
# Input size caps: a layer/kind selection of at most MAX_SPEC_CHARS characters and
# MAX_SPEC_ITEMS comma-separated items (or list entries); at most MAX_RULES partition rules.
MAX_SPEC_CHARS = 1000
MAX_SPEC_ITEMS = 256
MAX_RULES = 256
NON_LAYER_WORDS = ("non-layer", "non_layer")


class ConfigError(ValueError):
    """A merge configuration that cannot be applied; the message names the offending field."""


def scale_layers(n: int, num_layers: int, minimum: int = 1) -> int:
    """``n`` layers of a 32-layer model, scaled to ``num_layers`` (rounded half up, >= minimum)."""
    if n <= 0:
        return 0
    return max(minimum, math.floor(n * num_layers / REFERENCE_LAYERS + 0.5))


@dataclass(frozen=True)
class LayerRanges:
    """Validated layer counts to show next to the sliders and to sweep by default."""
    bottom: tuple[int, ...]
    top: tuple[int, ...]
    transition: tuple[int, ...]    # for each of transition_bottom / transition_top
    num_layers: int
    published: bool                # True: the paper's values as given (32 layers)

    @property
    def note(self) -> str:
        def r(v):
            return "{" + ", ".join(map(str, v)) + "}"
        text = f"b in {r(self.bottom)}, u in {r(self.top)}, t in {r(self.transition)}"
        if self.published:
            return f"{text}: validated in the layer-swapping paper (32 layers)"
        return (f"{text}: the paper's 32-layer ranges (b in {{3, 4, 5}}, u and t in {{0, 1, 2}}) "
                f"scaled to {self.num_layers} layers by the tool's own rule, not from the paper")


def validated_ranges(num_layers: int) -> LayerRanges:
    """The paper's validated ranges (b in {3,4,5}, u in {0,1,2}, t in {0,1,2}) as published for
    32 layers; for other depths each value scaled by ``scale_layers`` (the tool's rule)."""
    if num_layers == REFERENCE_LAYERS:
        return LayerRanges(*(PAPER_RANGES_32[k] for k in ("bottom", "top", "transition")),
                           num_layers, True)

    def scaled(values):
        return tuple(sorted({min(scale_layers(v, num_layers), num_layers) for v in values}))
    return LayerRanges(*(scaled(PAPER_RANGES_32[k]) for k in ("bottom", "top", "transition")),
                       num_layers, False)


# --------------------------------------------------------------------------- partitions
def _selection_items(spec, what: str) -> list:
    """The comma-separated items (or list entries) of a selection, refused past the caps."""
    if isinstance(spec, (list, tuple)):
        items = list(spec)
    elif isinstance(spec, (int, str)) and not isinstance(spec, bool):
        if isinstance(spec, str) and len(spec) > MAX_SPEC_CHARS:
            raise ConfigError(f"{what}: {len(spec)} characters, more than the {MAX_SPEC_CHARS} "
                              "allowed")
        items = [spec] if isinstance(spec, int) else [s.strip() for s in spec.split(",")
                                                       if s.strip()]
    else:
        raise ConfigError(f"{what}: expected text like '0-5, 7' or a list, got {_got(spec)}")
    if len(items) > MAX_SPEC_ITEMS:
        raise ConfigError(f"{what}: {len(items)} items, more than the {MAX_SPEC_ITEMS} allowed")
    return items


def _out_of_range(item, num_layers: int) -> ConfigError:
    return ConfigError(f"layer selection {item!r} is outside the model's layers 0..{num_layers - 1}"
                       f" ({num_layers} layers)")


def parse_layer_selection(spec, num_layers: int) -> tuple[set[int], bool]:
    """(layers, non_layer) of a selection: "all", "0-5", "7", "first 6", "last 2", "non-layer"
    (the parameters outside the decoder layers), comma-joined, or a list of those / ints.

    Every number is checked against the model's layers before any range is built, and the
    text is capped (``MAX_SPEC_CHARS``, ``MAX_SPEC_ITEMS``): a huge range costs nothing.
    """
    if spec is None or spec == "all":
        return set(range(num_layers)), False
    out: set[int] = set()
    non_layer = False
    for item in _selection_items(spec, "layer selection"):
        if isinstance(item, int) and not isinstance(item, bool):
            if not 0 <= item < num_layers:
                raise _out_of_range(item, num_layers)
            out.add(item)
            continue
        if not isinstance(item, str):
            raise ConfigError(f"layer selection: {_got(item)} is not a layer number or range")
        item = item.strip()
        if item.lower() in NON_LAYER_WORDS:
            non_layer = True
            continue
        if item == "all":
            out.update(range(num_layers))
            continue
        m = re.fullmatch(r"(first|last)\s+(\d+)", item)
        if m:
            n = int(m.group(2))
            if n > num_layers:
                raise ConfigError(f"layer selection {item!r} asks for more layers than the "
                                  f"model's {num_layers} (layers 0..{num_layers - 1})")
            out.update(range(n) if m.group(1) == "first" else range(num_layers - n, num_layers))
            continue
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", item)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise ConfigError(f"layer range {item!r}: start is after end")
            if hi >= num_layers:
                raise _out_of_range(item, num_layers)
            out.update(range(lo, hi + 1))
            continue
        if item.isdigit():
            if int(item) >= num_layers:
                raise _out_of_range(item, num_layers)
            out.add(int(item))
            continue
        raise ConfigError(f"cannot read layer selection {item!r} (use e.g. '0-5', '7', "
                          "'first 6', 'last 2', 'non-layer' or 'all')")
    return out, non_layer


def parse_layers(spec, num_layers: int) -> set[int]:
    """Layer selection: "all", "0-5", "7", "first 6", "last 2", comma-joined, or a list of ints
    (bounds checked before anything is built; see ``parse_layer_selection``)."""
    layers, non_layer = parse_layer_selection(spec, num_layers)
    if non_layer:
        raise ConfigError(f"layer selection {spec!r}: 'non-layer' is not a layer number")
    return layers


def _all_kinds() -> set[str]:
    return set(LAYER_KIND_ORDER) | {"embed", "final_norm", "lm_head", "other"}


def parse_kinds(spec) -> set[str] | None:
    """Module kinds: "all" (None), group names (attention/mlp/norm) and kind names, comma-joined.
    The non-layer kinds are embed, final_norm and lm_head."""
    if spec is None or spec == "all":
        return None
    out: set[str] = set()
    for item in _selection_items(spec, "module kinds"):
        if not isinstance(item, str):
            raise ConfigError(f"module kinds: {_got(item)} is not a kind name")
        item = item.strip()
        if not item:
            continue
        if item == "all":
            return None
        if item in KIND_GROUPS:
            out.update(KIND_GROUPS[item])
        elif item in _all_kinds():
            out.add(item)
        else:
            raise ConfigError(f"unknown module kind {item!r}; use attention, mlp, norm, all or one "
                              f"of {', '.join(sorted(_all_kinds()))}")
    return out


@dataclass(frozen=True)
class Rule:
    """Parameters in ``layers`` whose kind is in ``kinds`` (None: all) go to model ``to``.

    ``layers`` None (the rule has no 'layers' key): every layer and the non-layer parameters.
    With explicit layers, the non-layer parameters (embeddings, final norm, LM head) match only
    when ``non_layer`` is set ('non-layer' in the selection).
    So a rule addresses the non-layer parameters with ``layers: non-layer`` (all of them, or
    some with ``kinds: embed, final_norm, lm_head``) or with kinds alone (``kinds: embed``).
    """
    layers: frozenset[int] | None
    kinds: frozenset[str] | None
    to: str = "lang"
    non_layer: bool = False

    def matches(self, layer: int | None, kind: str) -> bool:
        if self.layers is not None:
            if layer is None and not self.non_layer:
                return False
            if layer is not None and layer not in self.layers:
                return False
        return self.kinds is None or kind in self.kinds


# Partition presets of the follow-up paper (modular fine-tuning and merging), in ABSOLUTE layers
# as published for its 32- and 36-layer models: (first, last) layer counts and the rules.
PRESET_LAYERS = {"A": (6, 2), "B": (8, 4), "C": (6, 2)}
PRESET_RULES = {
    "A": [{"kinds": "attention"}, {"layers": "first {first}, last {last}", "kinds": "mlp"}],
    "B": [{"layers": "first {first}, last {last}"}],
    "C": [{"layers": "first {first}, last {last}"}],
}
PRESET_DESCRIPTIONS = {
    "A": "all attention + MLP of the first 6 and last 2 layers -> language expert",
    "B": "first 8 and last 4 layers -> language expert",
    "C": "first 6 and last 2 layers -> language expert",
}


def preset_layer_counts(name: str, num_layers: int, scale: bool = False) -> tuple[int, int]:
    """(first, last) of a preset: as published, or with ``scale`` the published counts times
    num_layers / 32 (``scale_layers``: the tool's own rule, not the paper's). ConfigError where
    they leave no middle layer to the task expert."""
    key = str(name).upper()
    if key not in PRESET_LAYERS:
        raise ConfigError(f"unknown partition preset {name!r}; known: {', '.join(PRESET_LAYERS)}")
    first, last = PRESET_LAYERS[key]
    if scale:
        first, last = scale_layers(first, num_layers), scale_layers(last, num_layers)
    if first + last >= num_layers:
        how = (f"scaled to first {first} + last {last}" if scale else
               f"first {first} + last {last} layers as published (for 32/36-layer models)")
        hint = "" if scale else (", or scale_partition / --scale-partition to scale the counts "
                                 "(the tool's own rule, not the paper's)")
        raise ConfigError(f"partition preset {key}: {how} leave no middle layer to the task "
                          f"expert in a model of {num_layers} layers; use custom rules{hint}")
    return first, last


@dataclass(frozen=True)
class Partition:
    """Which parameters go to which model. Later rules win; parameters no rule matches come from
    the task expert (decoder layers) or follow ``MergeConfig.non_layer`` (non-layer ones)."""
    rules: tuple[Rule, ...]
    num_layers: int
    name: str = "custom"
    scaled: bool = False

    @classmethod
    def preset(cls, name: str, num_layers: int, scale: bool = False) -> "Partition":
        """A published preset in absolute layers (ConfigError where it does not fit); ``scale``:
        the counts scaled with depth (the tool's own rule)."""
        key = str(name).upper()
        first, last = preset_layer_counts(key, num_layers, scale)
        rules = [{**r, "layers": r["layers"].format(first=first, last=last)} if "layers" in r
                 else r for r in PRESET_RULES[key]]
        return replace(cls.from_rules(rules, num_layers, name=key), scaled=scale)

    @classmethod
    def from_rules(cls, rules: Iterable[dict], num_layers: int, name: str = "custom") -> "Partition":
        """Rules: mappings with 'layers' (see ``parse_layer_selection``; absent: every layer and
        the non-layer parameters), 'kinds' (``parse_kinds``) and 'to' (task/lang/base, default
        lang)."""
        rules = _check_rules(rules)
        parsed = []
        for i, r in enumerate(rules):
            try:
                layers, non_layer = (None, False) if "layers" not in r else \
                    parse_layer_selection(r["layers"], num_layers)
                kinds = parse_kinds(r.get("kinds"))
            except ConfigError as e:
                raise ConfigError(f"partition rule {i + 1}: {e}") from None
            parsed.append(Rule(None if layers is None else frozenset(layers),
                               None if kinds is None else frozenset(kinds), r.get("to", "lang"),
                               non_layer))
        return cls(tuple(parsed), num_layers, name)

    @classmethod
    def from_spec(cls, spec, num_layers: int, scale: bool = False) -> "Partition":
        """A preset name ("A"/"B"/"C") or a list of rule mappings."""
        if isinstance(spec, str):
            return cls.preset(spec, num_layers, scale)
        if isinstance(spec, Partition):
            return spec
        return cls.from_rules(spec, num_layers)

    def rule_for(self, name: str, arch: Architecture) -> str | None:
        """The model the last matching rule names, or None when no rule matches."""
        info = arch.classify(name)
        out = None
        for rule in self.rules:
            if rule.matches(info.layer, info.kind):
                out = rule.to
        return out

    def model_for(self, name: str, arch: Architecture) -> str:
        """The rule's model, else "task" (training's sides; merges use ``rule_for``)."""
        return self.rule_for(name, arch) or "task"

    def goes_to_lang(self, name: str, arch: Architecture) -> bool:
        return self.model_for(name, arch) == "lang"

    def parameter_names(self, names: Iterable[str], arch: Architecture) -> list[str]:
        """The names (in the given order) that go to the language expert."""
        return [n for n in names if self.goes_to_lang(n, arch)]

    def describe(self) -> str:
        if self.name not in PRESET_LAYERS:
            return f"custom rules ({len(self.rules)})"
        first, last = preset_layer_counts(self.name, self.num_layers, self.scaled)
        how = (f"first {first} + last {last} of {self.num_layers} layers, scaled from the "
               "published counts by the tool's own rule" if self.scaled else "as published")
        return f"{self.name} ({how})"

    def check_tied(self, names: list[str], arch: Architecture):
        """A tied LM head is the embedding tensor: it always follows the embeddings (a rule for
        ``embed`` moves both). A rule naming ``lm_head`` without ``embed`` would silently do
        nothing, so it is refused."""
        kinds = {arch.classify(n).kind for n in names if arch.classify(n).layer is None}
        if "embed" not in kinds or "lm_head" in kinds:
            return
        for i, rule in enumerate(self.rules):
            if rule.kinds is not None and "lm_head" in rule.kinds and "embed" not in rule.kinds:
                raise ConfigError(f"partition rule {i + 1}: this model ties its LM head to the "
                                  "embeddings (one tensor, which follows the embeddings), so "
                                  "address kinds 'embed, lm_head' together, or 'embed'")


def _check_rules(rules) -> list[dict]:
    """The rule list's shape: a list of at most MAX_RULES mappings with known keys."""
    if not isinstance(rules, (list, tuple)):
        raise ConfigError(f"partition: must be a preset name ({', '.join(PRESET_LAYERS)}) or a "
                          f"list of rules, got {_got(rules)}")
    if len(rules) > MAX_RULES:
        raise ConfigError(f"partition: {len(rules)} rules, more than the {MAX_RULES} allowed")
    for i, r in enumerate(rules):
        if not isinstance(r, dict):
            raise ConfigError(f"partition rule {i + 1}: expected a mapping with 'layers' and/or "
                              f"'kinds', got {_got(r)}")
        unknown = set(r) - {"layers", "kinds", "to"}
        if unknown:
            raise ConfigError(f"partition rule {i + 1}: unknown key(s) {sorted(map(str, unknown))}")
        to = r.get("to", "lang")
        if to not in MODELS:
            raise ConfigError(f"partition rule {i + 1}: 'to' must be one of {MODELS}, got {to!r}")
    return list(rules)


def _got(v) -> str:
    """A value and its type for error messages (YAML users see null / text)."""
    if v is None:
        return "null (no value)"
    if isinstance(v, str):
        return f"{v[:60]!r} (text)"
    text = repr(v)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(v).__name__})"


# --------------------------------------------------------------------------- config
@dataclass
class MergeConfig:
    """Everything that defines a merge. ``bottom``/``top`` None: the 32-layer defaults (5, 2)
    scaled to the model's depth. A ``partition`` replaces bottom/top/transitions (they are then
    ignored). Model references are optional here (the CLI/API may give them).

    Field types and bounds are checked by ``check_fields`` (the table ``FIELD_CHECKS``): weights
    in [0, MAX_WEIGHT], lambdas in [-MAX_LAMBDA, MAX_LAMBDA], ties_density in (0, 1], all finite.
    """
    method: str = "layer_swap"
    bottom: int | None = None
    top: int | None = None
    transition_bottom: int = 0
    transition_top: int = 0
    w_task: float = 1.0
    w_lang: float = 1.0
    magnitude_weights: bool = False
    non_layer: str = "blend"         # layer swap: non-layer parameters from blend | task | lang
    partition: Any = None            # None | "A" | "B" | "C" | list of rule mappings
    scale_partition: bool = False    # presets scaled with depth (the tool's rule, not the paper's)
    lambda_task: float = 1.0         # task arithmetic: base + sum(lambda * delta)
    lambda_lang: float = 1.0
    ties_density: float = 0.2        # TIES: fraction of each delta kept (largest magnitudes)
    ties_lambda: float = 1.0         # TIES: scale of the merged delta
    dtype: str | None = None         # None: each tensor keeps the task expert's dtype
    tokenizer_source: str | None = None  # None: task (and the vocabularies must agree)
    task: str | None = None
    lang: str | None = None
    base: str | None = None

    @classmethod
    def default_for(cls, num_layers: int, **kw) -> "MergeConfig":
        """Defaults with concrete layer counts for a model of ``num_layers`` layers."""
        cfg = cls(**kw)
        b, u = cfg.layer_counts(num_layers)[:2]
        return replace(cfg, bottom=b, top=u)

    def layer_counts(self, num_layers: int) -> tuple[int, int, int, int]:
        """(b, u, t_b, t_u) with None resolved to the scaled defaults."""
        b = scale_layers(DEFAULT_BOTTOM, num_layers) if self.bottom is None else self.bottom
        u = scale_layers(DEFAULT_TOP, num_layers) if self.top is None else self.top
        if self.bottom is None and self.top is None:
            while b + u > num_layers and b > 0:  # tiny models: keep the defaults feasible
                b -= 1
        return b, u, self.transition_bottom, self.transition_top

    # ---- validation
    def check_fields(self) -> "MergeConfig":
        """Each field's type and bounds (one line naming the field; nothing else is checked)."""
        for f in fields(self):
            FIELD_CHECKS[f.name](f.name, getattr(self, f.name))
        return self

    def validate(self, num_layers: int | None = None, has_base: bool | None = None) -> "MergeConfig":
        self.check_fields()
        if self.has_blends and not self.uses_magnitude and self.w_task + self.w_lang <= 0:
            raise ConfigError("w_task + w_lang is 0: the blend has no weight (give a positive weight)")
        if has_base is False and self.needs_base:
            what = "magnitude-adjusted weights" if self.magnitude_weights else f"method {self.method}"
            raise ConfigError(f"{what} need(s) the base model (--base)")
        if num_layers is not None:
            b, u, tb, tu = self.layer_counts(num_layers)
            if self.method == "layer_swap" and self.partition is None and b + tb + tu + u > num_layers:
                raise ConfigError(
                    f"bottom + transition_bottom + transition_top + top = {b}+{tb}+{tu}+{u} = "
                    f"{b + tb + tu + u} exceeds the model's {num_layers} layers")
            if self.method == "layer_swap" and self.partition is not None:
                self.partition_for(num_layers)  # raises on bad rules
        return self

    def partition_for(self, num_layers: int) -> "Partition":
        return Partition.from_spec(self.partition, num_layers, scale=self.scale_partition)

    @property
    def has_blends(self) -> bool:
        """Whether some tensors are a task/lang weighted blend (soups, transition layers,
        averaged non-layer parameters of a layer swap)."""
        if self.method in ("soup", "magnitude_soup"):
            return True
        if self.method != "layer_swap":
            return False
        return self.non_layer == "blend" or (
            self.partition is None and bool(self.transition_bottom or self.transition_top))

    @property
    def needs_base(self) -> bool:
        return self.method in NEEDS_BASE or (self.magnitude_weights and self.has_blends)

    @property
    def uses_magnitude(self) -> bool:
        """Whether the blend weights are the magnitude-adjusted ones (computed from the deltas)."""
        return self.method == "magnitude_soup" or (self.magnitude_weights and self.has_blends)

    # ---- serialisation
    def to_dict(self) -> dict:
        d = asdict(self)
        if isinstance(d["partition"], tuple):
            d["partition"] = list(d["partition"])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "MergeConfig":
        """A config from a mapping (YAML), every field checked (``check_fields``).

        A mapping written by an earlier layerswap (it has ``layerswap_version`` but lacks the
        newer keys) keeps that version's behaviour: non-layer parameters from the task expert
        and presets scaled with depth, so a saved ``layerswap.yaml`` reproduces its merge.
        """
        if not isinstance(d, dict):
            raise ConfigError(f"a merge config must be a mapping, got {_got(d)}")
        d = dict(d)
        if "layerswap_version" in d:
            d.pop("layerswap_version")
            d.setdefault("non_layer", "task")
            d.setdefault("scale_partition", True)
        known = {f.name for f in fields(cls)}
        unknown = sorted(map(str, set(d) - known))
        if unknown:
            raise ConfigError(f"unknown merge config key(s): {', '.join(unknown)} "
                              f"(known: {', '.join(sorted(known))})")
        for k in ("w_task", "w_lang", "lambda_task", "lambda_lang", "ties_density", "ties_lambda"):
            if isinstance(d.get(k), int) and not isinstance(d.get(k), bool):
                d[k] = float(d[k])
        return cls(**d).check_fields()

    def to_yaml(self) -> str:
        import yaml
        from .. import __version__
        return yaml.safe_dump({**self.to_dict(), "layerswap_version": __version__}, sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> "MergeConfig":
        return cls.from_dict(load_yaml(text, "merge config") or {})

    @classmethod
    def load(cls, path) -> "MergeConfig":
        from pathlib import Path
        try:
            return cls.from_yaml(Path(path).read_text())
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    def describe(self, num_layers: int | None = None) -> str:
        """One line, e.g. 'layer swap: bottom 5, top 2, transitions 0/0, non-layer averaged'."""
        if self.method == "layer_swap":
            if self.partition is not None:
                if num_layers is not None:
                    p = self.partition_for(num_layers).describe()
                else:
                    p = self.partition if isinstance(self.partition, str) else "custom rules"
                return f"layer swap with partition {p}, {self._non_layer_text()}"
            if num_layers is not None:
                b, u, tb, tu = self.layer_counts(num_layers)
            else:
                b, u, tb, tu = (self.bottom, self.top, self.transition_bottom, self.transition_top)
            return f"layer swap: bottom {b}, top {u}, transitions {tb}/{tu}, " + \
                self._non_layer_text(bool(tb or tu))
        if self.method == "soup":
            return "model soup, " + self._weights_text()
        if self.method == "magnitude_soup":
            return "magnitude-weighted soup"
        if self.method == "task_arithmetic":
            return f"task arithmetic: lambda task {self.lambda_task:g}, lang {self.lambda_lang:g}"
        return f"TIES: density {self.ties_density:g}, lambda {self.ties_lambda:g}"

    def _non_layer_text(self, blends: bool = False) -> str:
        if self.non_layer == "blend":
            return "non-layer parameters averaged, " + self._weights_text()
        src = "task expert" if self.non_layer == "task" else "language expert"
        return f"non-layer parameters from the {src}" + (", " + self._weights_text() if blends
                                                         else "")

    def _weights_text(self) -> str:
        if self.magnitude_weights:
            return "magnitude-adjusted weights"
        return f"weights task {self.w_task:g} : lang {self.w_lang:g}"


def _check_int(name, v, optional: bool = False):
    if v is None and optional:
        return
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ConfigError(f"{name}: must be a non-negative integer, got {_got(v)}")


def _check_number(name, v, lo: float, hi: float, what: str = "", lo_open: bool = False):
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
        (lo < v if lo_open else lo <= v) and v <= hi
    if not ok:
        span = f"in ({lo:g}, {hi:g}]" if lo_open else f"from {lo:g} to {hi:g}"
        raise ConfigError(f"{name}: must be a number {span}{what}, got {_got(v)}")


def _check_choice(name, v, choices, optional: bool = False):
    if v is None and optional:
        return
    if not isinstance(v, str) or v not in choices:
        shown = repr(v) if isinstance(v, str) else _got(v)
        raise ConfigError(f"{name}: unknown {shown}; choose one of {', '.join(choices)}")


def _check_bool(name, v):
    if not isinstance(v, bool):
        raise ConfigError(f"{name}: must be true or false, got {_got(v)}")


def _check_ref(name, v):
    import os
    if v is not None and not isinstance(v, (str, os.PathLike)):
        raise ConfigError(f"{name}: must be a model reference (a folder, owner/name or "
                          f"embedded:NAME), got {_got(v)}")


def _check_partition(name, v):
    if v is None or isinstance(v, Partition):
        return
    if isinstance(v, str):
        if v.upper() not in PRESET_LAYERS:
            raise ConfigError(f"unknown partition preset {v!r}; known: {', '.join(PRESET_LAYERS)}")
        return
    _check_rules(v)


_WEIGHT = (0.0, MAX_WEIGHT, " (only the ratio w_task : w_lang matters)")
_LAMBDA = (-MAX_LAMBDA, MAX_LAMBDA)
# The declarative type table of MergeConfig: field -> check(name, value) raising ConfigError.
FIELD_CHECKS = {
    "method": lambda n, v: _check_choice(n, v, MERGE_METHODS),
    "bottom": lambda n, v: _check_int(n, v, optional=True),
    "top": lambda n, v: _check_int(n, v, optional=True),
    "transition_bottom": _check_int,
    "transition_top": _check_int,
    "w_task": lambda n, v: _check_number(n, v, *_WEIGHT),
    "w_lang": lambda n, v: _check_number(n, v, *_WEIGHT),
    "magnitude_weights": _check_bool,
    "non_layer": lambda n, v: _check_choice(n, v, NON_LAYER_SOURCES),
    "partition": _check_partition,
    "scale_partition": _check_bool,
    "lambda_task": lambda n, v: _check_number(n, v, *_LAMBDA),
    "lambda_lang": lambda n, v: _check_number(n, v, *_LAMBDA),
    "ties_density": lambda n, v: _check_number(n, v, 0.0, 1.0, " (the fraction of each delta "
                                               "kept)", lo_open=True),
    "ties_lambda": lambda n, v: _check_number(n, v, *_LAMBDA),
    "dtype": lambda n, v: _check_choice(n, v, DTYPES, optional=True),
    "tokenizer_source": lambda n, v: _check_choice(n, v, MODELS, optional=True),
    "task": _check_ref,
    "lang": _check_ref,
    "base": _check_ref,
}


def load_yaml(text: str, what: str = "YAML"):
    """``yaml.safe_load`` that also reads exponent floats without a dot (``1e39``, ``1e-3``) as
    numbers, as YAML 1.2 does (PyYAML's 1.1 rules read them as text)."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))
    try:
        return yaml.load(text, Loader=Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} is not valid YAML: {' '.join(str(e).split())}") from e


# --------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class Source:
    """Where one output tensor comes from.

    ``method`` is a per-tensor function of ``methods.py`` ("copy", "linear", "task_arithmetic",
    "ties"); ``models`` its inputs in order; ``weights`` the per-model weights (None: magnitude-
    adjusted weights not computed yet); ``args`` extra keyword arguments as sorted pairs.
    """
    method: str
    models: tuple[str, ...]
    weights: tuple[float, ...] | None = ()
    args: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def copy(cls, model: str) -> "Source":
        return cls("copy", (model,))

    @property
    def model(self) -> str | None:
        """The single source model of a copy, else None."""
        return self.models[0] if self.method == "copy" else None

    @property
    def cell(self) -> str:
        """Short category: task / lang / base / blend / task_arithmetic / ties."""
        if self.method == "copy":
            return self.models[0]
        return "blend" if self.method == "linear" else self.method

    @property
    def label(self) -> str:
        if self.method == "copy":
            return self.models[0]
        if self.method == "linear":
            if self.weights is None:
                return "blend (magnitude weights)"
            total = sum(self.weights)
            return "blend " + "/".join(f"{w / total:.2f}" for w in self.weights)
        if self.method == "task_arithmetic":
            return "task arithmetic " + "/".join(f"{w:g}" for w in self.weights or ())
        args = dict(self.args)
        return f"ties d={args.get('density', '?')}"

    def kwargs(self) -> dict:
        return dict(self.args)

    def resolved(self, magnitude: tuple[float, float]) -> "Source":
        """This source with magnitude-adjusted weights filled in."""
        if self.weights is not None:
            return self
        return replace(self, weights=tuple(float(w) for w in magnitude))


@dataclass
class LayerRow:
    layer: int
    label: str                          # one label, or "mixed"
    kinds: dict[str, str] = field(default_factory=dict)  # kind -> label

    def text(self) -> str:
        if self.label != "mixed":
            return self.label
        by_label: dict[str, list[str]] = OrderedDict()
        for k, lab in self.kinds.items():
            by_label.setdefault(lab, []).append(k)
        return "; ".join(f"{lab}: {_kinds_text(ks)}" for lab, ks in by_label.items())


def _kinds_text(kinds: list[str]) -> str:
    """Kind names, with whole groups written as the group name ("attention, mlp")."""
    left, parts = list(kinds), []
    for group, members in KIND_GROUPS.items():
        covered = [k for k in left if k in members]
        if covered and len(covered) >= 2:
            parts.append(group)
            left = [k for k in left if k not in covered]
    return ", ".join(parts + left)


@dataclass
class MergePlan:
    config: MergeConfig
    arch: Architecture
    sources: dict[str, Source]          # in output order
    magnitude: tuple[float, float] | None = None

    @property
    def num_layers(self) -> int:
        return self.arch.num_layers

    @property
    def needs(self) -> set[str]:
        """Models whose tensors the plan reads."""
        return {m for s in self.sources.values() for m in s.models}

    @property
    def resolved(self) -> bool:
        return all(s.weights is not None for s in self.sources.values())

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.sources.values():
            out[s.cell] = out.get(s.cell, 0) + 1
        return out

    def _by_layer(self) -> dict[int, dict[str, set[str]]]:
        layers: dict[int, dict[str, set[str]]] = {l: {} for l in range(self.num_layers)}
        for name, src in self.sources.items():
            info = self.arch.classify(name)
            if info.layer is not None and info.layer in layers:
                layers[info.layer].setdefault(info.kind, set()).add(src.label)
        return layers

    def layer_rows(self) -> list[LayerRow]:
        rows = []
        for l, kinds in self._by_layer().items():
            order = sorted(kinds, key=lambda k: LAYER_KIND_ORDER.index(k)
                           if k in LAYER_KIND_ORDER else len(LAYER_KIND_ORDER))
            kind_labels = {k: (next(iter(kinds[k])) if len(kinds[k]) == 1 else "mixed") for k in order}
            labels = set(kind_labels.values())
            rows.append(LayerRow(l, labels.pop() if len(labels) == 1 else "mixed", kind_labels))
        return rows

    def cells(self) -> dict[tuple[int, str], str]:
        """(layer, kind) -> "task" | "lang" | "base" | "blend" | method name | "mixed"."""
        out: dict[tuple[int, str], str] = {}
        for name, src in self.sources.items():
            info = self.arch.classify(name)
            if info.layer is None:
                continue
            key = (info.layer, info.kind)
            out[key] = src.cell if out.get(key, src.cell) == src.cell else "mixed"
        return out

    def global_sources(self) -> dict[str, str]:
        """Non-layer parameter name -> label."""
        return {n: s.label for n, s in self.sources.items() if self.arch.classify(n).layer is None}

    @property
    def tied_head(self) -> bool:
        """Whether the LM head is the embedding tensor (the names have embeddings, no head)."""
        kinds = {self.arch.classify(n).kind for n in self.global_sources()}
        return "embed" in kinds and "lm_head" not in kinds

    def non_layer_text(self) -> str:
        """Where the non-layer parameters come from, in words (layer swaps)."""
        how = {"blend": "averaged as in Algorithm 1", "task": "from the task expert",
               "lang": "from the language expert"}[self.config.non_layer]
        tied = "; the LM head is tied to the embeddings" if self.tied_head else ""
        return (f"non-layer parameters (embeddings, final norm, LM head): {how} "
                f"(non_layer: {self.config.non_layer}){tied}")

    def summary_text(self) -> str:
        cfg = self.config
        lines = [f"{cfg.describe(self.num_layers)} ({self.arch.describe()})"]
        if self.magnitude is not None:
            t, g = self.magnitude
            lines.append(f"magnitude-adjusted weights: task {t / (t + g):.3f}, lang {g / (t + g):.3f}")
        lines.append("layers    source")
        rows = self.layer_rows()
        i = 0
        while i < len(rows):  # runs of equal rows in one line
            j = i
            while j + 1 < len(rows) and rows[j + 1].text() == rows[i].text():
                j += 1
            span = f"{rows[i].layer}" if i == j else f"{rows[i].layer}-{rows[j].layer}"
            lines.append(f"{span:<9} {rows[i].text()}")
            i = j + 1
        glob: dict[str, list[str]] = OrderedDict()
        for n, lab in self.global_sources().items():
            glob.setdefault(lab, []).append(n.removesuffix(".weight"))
        if cfg.method == "layer_swap" and glob:
            lines.append(self.non_layer_text())
        for lab, names in glob.items():
            lines.append(f"{'non-layer':<9} {lab}: {', '.join(names)}")
        c = self.counts()
        lines.append("tensors: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
        return "\n".join(lines)

    def changed_names(self, other: "MergePlan | None") -> list[str]:
        """Names whose source differs from ``other`` (all names when other is None)."""
        if other is None:
            return list(self.sources)
        return [n for n, s in self.sources.items() if other.sources.get(n) != s]

    def with_magnitude(self, magnitude: tuple[float, float]) -> "MergePlan":
        return MergePlan(self.config, self.arch,
                         {n: s.resolved(magnitude) for n, s in self.sources.items()},
                         tuple(magnitude))


def layer_zone(layer: int, num_layers: int, b: int, u: int, tb: int, tu: int) -> str:
    """"lang" | "blend" | "task" for a layer under Algorithm 1."""
    L = num_layers
    if layer < b or layer >= L - u:
        return "lang"
    if layer < b + tb or layer >= L - u - tu:
        return "blend"
    return "task"


def build_plan(config: MergeConfig, param_names: Iterable[str], arch: Architecture,
               magnitude: tuple[float, float] | None = None) -> MergePlan:
    """The source of every parameter. ``magnitude``: magnitude-adjusted (w_task, w_lang) if known;
    without it, blends that need them carry weights=None (shown, not executable)."""
    config.validate(arch.num_layers)
    names = list(param_names)
    L = arch.num_layers
    blend_w = magnitude if config.uses_magnitude else (config.w_task, config.w_lang)
    blend = Source("linear", ("task", "lang"), None if blend_w is None else tuple(map(float, blend_w)))
    non_layer = blend if config.non_layer == "blend" else Source.copy(config.non_layer)
    sources: dict[str, Source] = {}
    m = config.method
    if m in ("soup", "magnitude_soup"):
        sources = {n: blend for n in names}
    elif m == "task_arithmetic":
        src = Source("task_arithmetic", ("base", "task", "lang"),
                     (float(config.lambda_task), float(config.lambda_lang)))
        sources = {n: src for n in names}
    elif m == "ties":
        src = Source("ties", ("base", "task", "lang"), (1.0, 1.0),
                     (("density", float(config.ties_density)), ("lam", float(config.ties_lambda))))
        sources = {n: src for n in names}
    elif config.partition is not None:
        part = config.partition_for(L)
        part.check_tied(names, arch)
        for n in names:
            to = part.rule_for(n, arch)
            sources[n] = Source.copy(to) if to is not None else \
                non_layer if arch.classify(n).layer is None else Source.copy("task")
    else:
        b, u, tb, tu = config.layer_counts(L)
        zone_source = {"lang": Source.copy("lang"), "task": Source.copy("task"), "blend": blend}
        for n in names:
            layer = arch.classify(n).layer
            sources[n] = non_layer if layer is None else \
                zone_source[layer_zone(layer, L, b, u, tb, tu)]
    return MergePlan(config, arch, sources,
                     tuple(magnitude) if magnitude is not None and config.uses_magnitude else None)
