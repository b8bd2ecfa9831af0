"""``MergeConfig``: everything that defines a merge, its fields declared once (as ``Knob``s) and
checked, read from and written to YAML; the layer-count defaults and the paper's ranges.

A config is plain data, its class fixed at import (as mergekit's: a method plus its parameters):
``method``, ``params`` (the values given of the registered methods' knobs, ``registry.KNOBS``:
layer counts, weights, partition, lambdas, ...; a knob not given reads its default, as an
attribute: ``config.bottom``) and the output/model fields below (dtype, tokenizer source, the
three model references). ``FIELDS`` lists them all, read from the registry when it is used, so a
method registered later (a plugin, a test) has its knobs as fields at once and nothing is
remade. Each field's kind and bounds are declared on its ``Knob``, which also checks them
(``Knob.refuses``, strict: no text read as a number, no bool as a number); a refused value
becomes a one-line ``ConfigError`` naming the field. (A pydantic model built from
the knobs did this check until 2026-11-27: importing it took about 0.15 s of a 1.2 s
``layerswap merge``, for nothing the knobs did not already declare.) A config is checked when
it is loaded (``from_dict``/YAML), validated (``validate``), and planned; constructing one
checks nothing (the caller may still fill it in).

Defaults for other depths (the tool's own rule, not the papers'): ``bottom``/``top`` None are
the 32-layer defaults 5/2 scaled to the model's depth; partition presets use the published layer
counts as given, scaled only with ``scale_partition``.
"""
from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from . import method_layer_swap, method_soup, method_task_arithmetic, method_ties
from .errors import ConfigError
from .partition import MODELS, REFERENCE_LAYERS, Partition, scale_layers, value_text
from .registry import KNOBS, MERGE_METHODS, Knob, get_method, register_method
from .. import __version__

# The built-in merge methods, one file each (its ``DECLARED``), registered here in this order:
# the CLI's --method choices, the app's radio and ``FIELDS`` follow it.
for _declared in (*method_layer_swap.DECLARED, *method_soup.DECLARED,
                  *method_task_arithmetic.DECLARED, *method_ties.DECLARED):
    register_method(*_declared)

DTYPES = ("bfloat16", "float16", "float32")

DEFAULT_BOTTOM, DEFAULT_TOP = 5, 2
# Layer counts the layer-swapping paper validated for its 32-layer models.
PAPER_RANGES_32 = {"bottom": (3, 4, 5), "top": (0, 1, 2), "transition": (0, 1, 2)}


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


# What a YAML may stand for once its aliases are expanded: its nodes and characters, at most this
# many more than its text has. An alias repeats a whole subtree, so nine levels of nine aliases
# (under 500 characters) stand for 9^9 strings; the loaded object shares them, but json.dumps or
# any walk then writes every one out (593 million characters from 480: the "billion laughs").
MAX_YAML_EXPANSION = 1_000_000


def load_yaml(text: str, what: str = "YAML"):
    """``yaml.safe_load`` that also reads exponent floats without a dot (``1e39``, ``1e-3``) as
    numbers, as YAML 1.2 does (PyYAML's 1.1 rules read them as text). Refused in one line
    (``ConfigError``) before anything is built: aliases that expand it past
    ``MAX_YAML_EXPANSION``, an alias inside itself, and nesting deeper than Python's stack."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass
    Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))
    loader = Loader(text)
    try:
        node = loader.get_single_node()       # the node graph: aliases are shared, not copied
        if node is None:
            return None
        _expanded(node, MAX_YAML_EXPANSION + 2 * len(text), what)   # its text always passes
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} is not valid YAML: {' '.join(str(e).split())}") from e
    except RecursionError:
        raise ConfigError(f"{what} is nested too deeply: refused") from None
    finally:
        loader.dispose()


def _expanded(root, limit: int, what: str) -> None:
    """ConfigError when the node graph ``root``, its aliases expanded, has more than ``limit``
    nodes and scalar characters, or an alias inside itself. Each node is sized once (aliases
    share nodes), depth first without recursion."""
    import yaml

    def kids(node):
        if isinstance(node, yaml.SequenceNode):
            return node.value
        return [x for pair in node.value for x in pair]
    sizes: dict[int, int] = {}
    open_: set[int] = set()             # the nodes on the path from the root
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            open_.discard(key)
            sizes[key] = 1 + sum(sizes[id(k)] for k in kids(node))
            if sizes[key] > limit:
                raise ConfigError(f"{what}: its aliases (*name) expand it to more than "
                                  f"{MAX_YAML_EXPANSION:,} nodes and characters: refused")
        elif key in sizes:
            continue
        elif isinstance(node, yaml.ScalarNode):
            sizes[key] = 1 + len(node.value)
        elif key in open_:
            raise ConfigError(f"{what}: an alias (*name) inside its own anchor: refused")
        else:
            open_.add(key)
            stack.append((node, True))
            stack.extend((k, False) for k in kids(node))


# --------------------------------------------------------------------------- the fields
def _check_ref(name, v):
    if v is not None and not isinstance(v, (str, os.PathLike)):
        raise ConfigError(f"{name}: must be a model reference (a folder, owner/name or "
                          f"embedded:NAME), got {value_text(v)}")


def _model(name: str, help: str) -> Knob:
    return Knob(name, "value", None, check=_check_ref, help=help)


# MergeConfig's fields in order: the method, the knobs of the registered methods, the output
# and the models (the CLI's --task/--lang/--base are written by hand, with --config).
METHOD = Knob("method", "choice", "layer_swap", choices=lambda: tuple(MERGE_METHODS),
              help="merge method")
OUTPUT_FIELDS = (
    Knob("dtype", "choice", None, optional=True, choices=DTYPES,
         help="output dtype (default: the task expert's)"),
    Knob("tokenizer_source", "choice", None, optional=True, choices=MODELS,
         help="take the tokenizer from this model (required if the vocabularies differ)"),
    _model("task", "task (e.g. math) expert: folder, owner/name or embedded:NAME"),
    _model("lang", "language expert"),
    _model("base", "common base model (magnitude weights, task arithmetic, TIES)"))
class _Fields(Mapping):
    """Field name -> its ``Knob``: the method, the registered methods' knobs (``registry.KNOBS``,
    in declaration order), the output and model fields; read from the registry on every use."""

    def _now(self) -> dict[str, Knob]:
        return {k.name: k for k in (METHOD, *KNOBS.values(), *OUTPUT_FIELDS)}

    def __getitem__(self, name: str) -> Knob:
        return self._now()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._now())

    def __len__(self) -> int:
        return len(self._now())


FIELDS: Mapping[str, Knob] = _Fields()


# --------------------------------------------------------------------------- config
@dataclass(init=False, eq=False)
class MergeConfig:
    """Everything that defines a merge: ``method``, ``params`` (knob name -> value given; the
    registered methods' knobs, each also an attribute, its default where not given), ``dtype``,
    ``tokenizer_source``, ``task``, ``lang``, ``base`` (all of them: ``FIELDS``).
    ``MergeConfig(method="soup", w_task=3.0)`` gives knobs by name; an unknown name is a
    TypeError, as for any class. Two configs are equal when every field is (``to_dict``).

    ``bottom``/``top`` None: the 32-layer defaults (5, 2) scaled to the model's depth. A
    ``partition`` (None | "A" | "B" | "C" | list of rule mappings) replaces bottom/top/
    transitions. ``dtype`` None: each tensor keeps the task expert's dtype; ``tokenizer_source``
    None: task (and the vocabularies must agree). Model references are optional here (the
    CLI/API may give them). Field types and bounds are checked by ``check_fields``.
    """
    method: str = "layer_swap"
    params: dict[str, Any] = field(default_factory=dict)
    dtype: str | None = None
    tokenizer_source: str | None = None
    task: Any = None
    lang: Any = None
    base: Any = None

    def __init__(self, method: str = "layer_swap", *, params: Mapping[str, Any] | None = None,
                 dtype=None, tokenizer_source=None, task=None, lang=None, base=None, **knobs):
        given = {**(params or {}), **knobs}
        unknown = [k for k in given if k not in KNOBS]
        if unknown:
            raise TypeError(f"MergeConfig: unknown field(s) {', '.join(map(str, unknown))} "
                            f"(known: {', '.join(FIELDS)})")
        self.method, self.params = method, given
        self.dtype, self.tokenizer_source = dtype, tokenizer_source
        self.task, self.lang, self.base = task, lang, base

    def __getattr__(self, name: str):
        """A knob's value (its default when not given); only called for names the instance and
        its class lack."""
        knob = KNOBS.get(name)
        if knob is None or name == "params":
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return self.params.get(name, knob.default)

    def __eq__(self, other) -> bool:
        if not isinstance(other, MergeConfig):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None   # mutable data, as before

    @classmethod
    def default_for(cls, num_layers: int, **kw) -> MergeConfig:
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
    def check_fields(self) -> MergeConfig:
        """Each field's type and bounds (``Knob.refuses``; one line naming the first refused
        field, in ``FIELDS`` order)."""
        for name, k in FIELDS.items():
            value = getattr(self, name)
            if k.refuses(value):
                raise ConfigError(k.message(value))
        return self

    def validate(self, num_layers: int | None = None, has_base: bool | None = None) -> MergeConfig:
        self.check_fields()
        if self.has_blends and not self.uses_magnitude and self.w_task + self.w_lang <= 0:
            raise ConfigError("w_task + w_lang is 0: the blend has no weight (give a positive weight)")
        if has_base is False and self.needs_base:
            what = "magnitude-adjusted weights" if self.magnitude_weights else f"method {self.method}"
            raise ConfigError(f"{what} need(s) the base model (--base)")
        check = get_method(self.method).check
        if num_layers is not None and check is not None:
            check(self, num_layers)
        return self

    def partition_for(self, num_layers: int) -> Partition:
        return Partition.from_spec(self.partition, num_layers, scale=self.scale_partition)

    @property
    def has_blends(self) -> bool:
        """Whether some tensors are a task/lang weighted blend (soups, transition layers,
        averaged non-layer parameters of a layer swap)."""
        method = MERGE_METHODS.get(self.method)
        return method is not None and method.blends(self)

    @property
    def needs_base(self) -> bool:
        method = MERGE_METHODS.get(self.method)
        return (method is not None and method.needs_base) or \
            (self.magnitude_weights and self.has_blends)

    @property
    def uses_magnitude(self) -> bool:
        """Whether the blend weights are the magnitude-adjusted ones (computed from the deltas)."""
        method = MERGE_METHODS.get(self.method)
        return (method is not None and method.magnitude) or \
            (self.magnitude_weights and self.has_blends)

    # ---- serialisation
    def to_dict(self) -> dict:
        """Every field (``FIELDS`` order) with its value: a knob not given, its default."""
        d = {name: copy.deepcopy(getattr(self, name)) for name in FIELDS}
        if isinstance(d["partition"], tuple):
            d["partition"] = list(d["partition"])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> MergeConfig:
        """A config from a mapping (YAML), every field checked (``check_fields``).

        A mapping written by an earlier layerswap (it has ``layerswap_version`` but lacks the
        newer keys) keeps that version's behaviour: non-layer parameters from the task expert
        and presets scaled with depth, so a saved ``layerswap.yaml`` reproduces its merge.
        """
        if not isinstance(d, dict):
            raise ConfigError(f"a merge config must be a mapping, got {value_text(d)}")
        d = dict(d)
        if "layerswap_version" in d:
            d.pop("layerswap_version")
            d.setdefault("non_layer", "task")
            d.setdefault("scale_partition", True)
        unknown = sorted(map(str, set(d) - set(FIELDS)))
        if unknown:
            raise ConfigError(f"unknown merge config key(s): {', '.join(unknown)} "
                              f"(known: {', '.join(sorted(FIELDS))})")
        for k, v in d.items():
            if FIELDS[k].kind == "number" and isinstance(v, int) and not isinstance(v, bool):
                d[k] = float(v)
        return cls(**d).check_fields()

    def to_yaml(self) -> str:
        import yaml
        return yaml.safe_dump({**self.to_dict(), "layerswap_version": __version__}, sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> MergeConfig:
        return cls.from_dict(load_yaml(text, "merge config") or {})

    @classmethod
    def load(cls, path) -> MergeConfig:
        from pathlib import Path
        try:
            return cls.from_yaml(Path(path).read_text())
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    def describe(self, num_layers: int | None = None) -> str:
        """One line, e.g. 'layer swap: bottom 5, top 2, transitions 0/0, non-layer averaged'."""
        return get_method(self.method).describe(self, num_layers)

