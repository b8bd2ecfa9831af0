"""Merge configuration -> per-parameter source. Pure data: no tensors are read here.

A ``MergeConfig`` describes a merge (method, layer counts, weights, partition, dtype, models).
``build_plan`` turns it, with the parameter names and the architecture table, into a
``MergePlan``: for every parameter name, a ``Source`` saying which model(s) it comes from and
which per-tensor method (``methods.py``) combines them. The UI and CLI show the plan before
anything runs; the streaming executor and the in-memory recomposer both follow it.

Layer swapping (Algorithm 1), with L layers (0-indexed), b bottom, u top, t_b / t_u transition:

    l < b                          language expert
    b <= l < b + t_b               blend
    b + t_b <= l < L - u - t_u     task expert
    L - u - t_u <= l < L - u       blend
    l >= L - u                     language expert
    non-layer parameters           task expert

blend = (w_task * task + w_lang * lang) / (w_task + w_lang), in float32.
"""
from __future__ import annotations

import math
import re
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Iterable

from .architectures import KIND_GROUPS, LAYER_KIND_ORDER, Architecture

MODELS = ("task", "lang", "base")
MERGE_METHODS = ("layer_swap", "soup", "magnitude_soup", "task_arithmetic", "ties")
DTYPES = ("bfloat16", "float16", "float32")
# Methods that need the base model.
NEEDS_BASE = ("magnitude_soup", "task_arithmetic", "ties")

# The published defaults are for 32-layer models; other depths scale them.
REFERENCE_LAYERS = 32
DEFAULT_BOTTOM, DEFAULT_TOP = 5, 2


class ConfigError(ValueError):
    """A merge configuration that cannot be applied; the message names the offending field."""


def scale_layers(n: int, num_layers: int, minimum: int = 1) -> int:
    """``n`` layers of a 32-layer model, scaled to ``num_layers`` (rounded half up, >= minimum)."""
    if n <= 0:
        return 0
    return max(minimum, math.floor(n * num_layers / REFERENCE_LAYERS + 0.5))


# --------------------------------------------------------------------------- partitions
def parse_layers(spec, num_layers: int) -> set[int]:
    """Layer selection: "all", "0-5", "7", "first 6", "last 2", comma-joined, or a list of ints."""
    if spec is None or spec == "all":
        return set(range(num_layers))
    if isinstance(spec, int):
        items: list = [spec]
    elif isinstance(spec, (list, tuple)):
        items = list(spec)
    else:
        items = [s.strip() for s in str(spec).split(",") if s.strip()]
    out: set[int] = set()
    for item in items:
        if isinstance(item, int):
            out.add(item)
            continue
        m = re.fullmatch(r"(first|last)\s+(\d+)", item)
        if m:
            n = min(int(m.group(2)), num_layers)
            out.update(range(n) if m.group(1) == "first" else range(num_layers - n, num_layers))
            continue
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", item)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if lo > hi:
                raise ConfigError(f"layer range {item!r}: start is after end")
            out.update(range(lo, hi + 1))
            continue
        if item.isdigit():
            out.add(int(item))
            continue
        raise ConfigError(f"cannot read layer selection {item!r} (use e.g. '0-5', '7', "
                          "'first 6', 'last 2' or 'all')")
    bad = sorted(l for l in out if not 0 <= l < num_layers)
    if bad:
        raise ConfigError(f"layer selection {spec!r} names layer {bad[0]}, but the model has "
                          f"layers 0..{num_layers - 1}")
    return out


def _all_kinds() -> set[str]:
    return set(LAYER_KIND_ORDER) | {"embed", "final_norm", "lm_head", "other"}


def parse_kinds(spec) -> set[str] | None:
    """Module kinds: "all" (None), group names (attention/mlp/norm) and kind names, comma-joined."""
    if spec is None or spec == "all":
        return None
    items = spec if isinstance(spec, (list, tuple)) else str(spec).split(",")
    out: set[str] = set()
    for item in (str(i).strip() for i in items):
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
    """Parameters in ``layers`` (None: every layer and the non-layer parameters) whose kind is in
    ``kinds`` (None: all) go to model ``to``."""
    layers: frozenset[int] | None
    kinds: frozenset[str] | None
    to: str = "lang"

    def matches(self, layer: int | None, kind: str) -> bool:
        if self.layers is not None and (layer is None or layer not in self.layers):
            return False
        return self.kinds is None or kind in self.kinds


# Partition presets as published for 32-layer models: (rules with layer counts "first N"/"last N").
PRESETS_32 = {
    "A": [{"kinds": "attention"}, {"layers": "first 6, last 2", "kinds": "mlp"}],
    "B": [{"layers": "first 8, last 4"}],
    "C": [{"layers": "first 6, last 2"}],
}
PRESET_DESCRIPTIONS = {
    "A": "all attention + MLP of the first 6 and last 2 layers (of 32) -> language expert",
    "B": "first 8 and last 4 layers (of 32) -> language expert",
    "C": "first 6 and last 2 layers (of 32) -> language expert",
}


def _scale_spec(spec, num_layers: int):
    """Rewrite "first N"/"last N" of a 32-layer preset for ``num_layers`` layers."""
    if not isinstance(spec, str):
        return spec
    return re.sub(r"(first|last)\s+(\d+)",
                  lambda m: f"{m.group(1)} {scale_layers(int(m.group(2)), num_layers)}", spec)


@dataclass(frozen=True)
class Partition:
    """Which parameters go to the language expert (the rest: task expert). Later rules win."""
    rules: tuple[Rule, ...]
    num_layers: int
    name: str = "custom"

    @classmethod
    def preset(cls, name: str, num_layers: int) -> "Partition":
        key = str(name).upper()
        if key not in PRESETS_32:
            raise ConfigError(f"unknown partition preset {name!r}; known: {', '.join(PRESETS_32)}")
        rules = [{**r, "layers": _scale_spec(r.get("layers"), num_layers)} if "layers" in r else r
                 for r in PRESETS_32[key]]
        return cls.from_rules(rules, num_layers, name=key)

    @classmethod
    def from_rules(cls, rules: Iterable[dict], num_layers: int, name: str = "custom") -> "Partition":
        parsed = []
        for i, r in enumerate(rules):
            if not isinstance(r, dict):
                raise ConfigError(f"partition rule {i + 1}: expected a mapping with 'layers' and/or "
                                  f"'kinds', got {r!r}")
            unknown = set(r) - {"layers", "kinds", "to"}
            if unknown:
                raise ConfigError(f"partition rule {i + 1}: unknown key(s) {sorted(unknown)}")
            to = r.get("to", "lang")
            if to not in MODELS:
                raise ConfigError(f"partition rule {i + 1}: 'to' must be one of {MODELS}, got {to!r}")
            layers = None if "layers" not in r else frozenset(parse_layers(r["layers"], num_layers))
            kinds = parse_kinds(r.get("kinds"))
            parsed.append(Rule(layers, None if kinds is None else frozenset(kinds), to))
        return cls(tuple(parsed), num_layers, name)

    @classmethod
    def from_spec(cls, spec, num_layers: int) -> "Partition":
        """A preset name ("A"/"B"/"C") or a list of rule mappings."""
        if isinstance(spec, str):
            return cls.preset(spec, num_layers)
        if isinstance(spec, Partition):
            return spec
        return cls.from_rules(spec, num_layers)

    def model_for(self, name: str, arch: Architecture) -> str:
        info = arch.classify(name)
        out = "task"
        for rule in self.rules:
            if rule.matches(info.layer, info.kind):
                out = rule.to
        return out

    def goes_to_lang(self, name: str, arch: Architecture) -> bool:
        return self.model_for(name, arch) == "lang"

    def parameter_names(self, names: Iterable[str], arch: Architecture) -> list[str]:
        """The names (in the given order) that go to the language expert."""
        return [n for n in names if self.goes_to_lang(n, arch)]


# --------------------------------------------------------------------------- config
@dataclass
class MergeConfig:
    """Everything that defines a merge. ``bottom``/``top`` None: the 32-layer defaults (5, 2)
    scaled to the model's depth. A ``partition`` replaces bottom/top/transitions (they are then
    ignored). Model references are optional here (the CLI/API may give them)."""
    method: str = "layer_swap"
    bottom: int | None = None
    top: int | None = None
    transition_bottom: int = 0
    transition_top: int = 0
    w_task: float = 1.0
    w_lang: float = 1.0
    magnitude_weights: bool = False
    partition: Any = None            # None | "A" | "B" | "C" | list of rule mappings
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
    def validate(self, num_layers: int | None = None, has_base: bool | None = None) -> "MergeConfig":
        if self.method not in MERGE_METHODS:
            raise ConfigError(f"method: unknown {self.method!r}; choose one of {', '.join(MERGE_METHODS)}")
        for f in ("bottom", "top", "transition_bottom", "transition_top"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ConfigError(f"{f}: must be a non-negative integer, got {v!r}")
        for f in ("w_task", "w_lang"):
            v = getattr(self, f)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{f}: must be a non-negative number, got {v!r}")
        if self.has_blends and not self.uses_magnitude and self.w_task + self.w_lang <= 0:
            raise ConfigError("w_task + w_lang is 0: the blend has no weight (give a positive weight)")
        if not 0 < self.ties_density <= 1:
            raise ConfigError(f"ties_density: must be in (0, 1], got {self.ties_density!r}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ConfigError(f"dtype: unknown {self.dtype!r}; choose one of {', '.join(DTYPES)}")
        if self.tokenizer_source is not None and self.tokenizer_source not in MODELS:
            raise ConfigError(f"tokenizer_source: must be one of {', '.join(MODELS)}, "
                              f"got {self.tokenizer_source!r}")
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
                Partition.from_spec(self.partition, num_layers)  # raises on bad rules
        return self

    @property
    def has_blends(self) -> bool:
        """Whether some tensors are a task/lang weighted blend (soups, transition layers)."""
        return self.method in ("soup", "magnitude_soup") or (
            self.method == "layer_swap" and self.partition is None
            and bool(self.transition_bottom or self.transition_top))

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
        if not isinstance(d, dict):
            raise ConfigError(f"a merge config must be a mapping, got {type(d).__name__}")
        d = dict(d)
        d.pop("layerswap_version", None)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown merge config key(s): {', '.join(unknown)} "
                              f"(known: {', '.join(sorted(known))})")
        for k in ("w_task", "w_lang", "lambda_task", "lambda_lang", "ties_density", "ties_lambda"):
            if isinstance(d.get(k), int) and not isinstance(d.get(k), bool):
                d[k] = float(d[k])
        return cls(**d)

    def to_yaml(self) -> str:
        import yaml
        from . import __version__
        return yaml.safe_dump({**self.to_dict(), "layerswap_version": __version__}, sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> "MergeConfig":
        import yaml
        try:
            d = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ConfigError(f"merge config is not valid YAML: {e}") from e
        return cls.from_dict(d or {})

    @classmethod
    def load(cls, path) -> "MergeConfig":
        from pathlib import Path
        try:
            return cls.from_yaml(Path(path).read_text())
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    def describe(self, num_layers: int | None = None) -> str:
        """One line, e.g. 'layer swap: bottom 5, top 2, transitions 0/0'."""
        if self.method == "layer_swap":
            if self.partition is not None:
                p = self.partition if isinstance(self.partition, str) else "custom rules"
                return f"layer swap with partition {p}"
            if num_layers is not None:
                b, u, tb, tu = self.layer_counts(num_layers)
            else:
                b, u, tb, tu = (self.bottom, self.top, self.transition_bottom, self.transition_top)
            s = f"layer swap: bottom {b}, top {u}, transitions {tb}/{tu}"
            if tb or tu:
                s += ", " + self._weights_text()
            return s
        if self.method == "soup":
            return "model soup, " + self._weights_text()
        if self.method == "magnitude_soup":
            return "magnitude-weighted soup"
        if self.method == "task_arithmetic":
            return f"task arithmetic: lambda task {self.lambda_task:g}, lang {self.lambda_lang:g}"
        return f"TIES: density {self.ties_density:g}, lambda {self.ties_lambda:g}"

    def _weights_text(self) -> str:
        if self.magnitude_weights:
            return "magnitude-adjusted weights"
        return f"weights task {self.w_task:g} : lang {self.w_lang:g}"


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
        for lab, names in glob.items():
            lines.append(f"{'other':<9} {lab}: {', '.join(names)}")
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
        part = Partition.from_spec(config.partition, L)
        sources = {n: Source.copy(part.model_for(n, arch)) for n in names}
    else:
        b, u, tb, tu = config.layer_counts(L)
        zone_source = {"lang": Source.copy("lang"), "task": Source.copy("task"), "blend": blend}
        for n in names:
            layer = arch.classify(n).layer
            sources[n] = zone_source["task"] if layer is None else \
                zone_source[layer_zone(layer, L, b, u, tb, tu)]
    return MergePlan(config, arch, sources,
                     tuple(magnitude) if magnitude is not None and config.uses_magnitude else None)
