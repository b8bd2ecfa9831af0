"""The merge methods a config can name, each registered ONCE (the one file to add a method to).

A ``MergeMethod`` declares its id (``MergeConfig.method``), the label the app shows, whether it
needs the base model, whether it is linear in the deltas (then LoRA experts merge exactly, see
``lora.py``), its knobs (``MergeConfig`` fields with default, bounds and help), how it sends
every parameter to a ``Source`` and how it describes itself in one line. ``MergeConfig``'s
fields and their checks (``Knob.refuses``; ``config.py``), ``build_plan`` (``plan.py``), the
CLI's flags and ``--method`` choices, the app's method radio and knob controls and the LoRA
path all read this registry.

A knob is a ``Knob`` in ``KNOBS``: declared once (several methods may read it, e.g. the blend
weights), it becomes a ``MergeConfig`` field when ``config.py`` is imported, so a new knob is
declared here, next to the method that reads it. A method without new knobs may also be
registered later (``register_method``; ``unregister_method`` takes it away).
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from collections.abc import Callable

from . import methods
from .errors import ConfigError
from .partition import check_partition_spec, value_text

# Bounds of the numeric knobs (larger magnitudes are refused, never silently merged):
# w_task/w_lang only set the ratio of a blend, so 0..1e4 allows any sensible ratio while
# w * tensor stays far from float32/bfloat16 overflow; a lambda scales a delta, and past 100
# (published values are around 0.3-2) it only pushes weights out of range (float16 max 65504).
MAX_WEIGHT = 1e4
MAX_LAMBDA = 100.0
# Where the non-layer parameters come from under layer swapping (see ``plan.py``).
NON_LAYER_SOURCES = ("blend", "task", "lang")


# --------------------------------------------------------------------------- sources
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
    def copy(cls, model: str) -> Source:
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
        return methods.get_method(self.method).cell

    @property
    def label(self) -> str:
        """The per-tensor method's own text for this source (``methods.Method.label``)."""
        return methods.get_method(self.method).label(self)

    @property
    def shares(self) -> dict[str, float]:
        """{model: its share of this tensor} (``methods.Method.shares``; {} for methods that move
        the base rather than mix the models)."""
        return methods.get_method(self.method).shares(self)

    def kwargs(self) -> dict:
        return dict(self.args)

    def resolved(self, magnitude: tuple[float, float]) -> Source:
        """This source with magnitude-adjusted weights filled in."""
        if self.weights is not None:
            return self
        return replace(self, weights=tuple(float(w) for w in magnitude))


# --------------------------------------------------------------------------- knobs
@dataclass(frozen=True)
class Knob:
    """One ``MergeConfig`` field: its kind and bounds (checked by ``refuses``), its
    default, the help of its CLI flag and the label of its app control.

    kind: "count" (a non-negative int), "number" (a finite float in [lo, hi], or (lo, hi] with
    ``lo_open``), "bool", "choice" (one of ``choices``, a tuple or a function returning one) or
    "value" (anything ``check(name, value)`` accepts; it raises ConfigError). ``optional``: None
    is allowed too. The CLI sets every knob with ``--NAME`` (a "value" knob's flag is text).
    """
    name: str
    kind: str
    default: Any = None
    help: str = ""
    label: str = ""
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    note: str = ""
    optional: bool = False
    choices: tuple | Callable[[], Any] = ()
    check: Callable[[str, Any], None] | None = None
    step: float | None = None      # the app control's step (None: 1)

    def options(self) -> tuple:
        return tuple(self.choices() if callable(self.choices) else self.choices)

    def refuses(self, value) -> bool:
        """Whether this knob refuses ``value``. Strict: never a number read from text, nor a
        bool taken for a number. "count": an int >= 0; "number": a finite real number (numpy's
        too) within the bounds; "bool": True/False; "choice": one of ``options()`` as text;
        None: only if ``optional``. A "value" knob's ``check`` raises its own ConfigError."""
        if self.kind == "value":
            if self.check is not None:
                self.check(self.name, value)
            return False
        if value is None:
            return not self.optional
        if self.kind == "bool":
            return not isinstance(value, bool)
        if self.kind == "choice":
            return not (isinstance(value, str) and value in self.options())
        if self.kind == "count":
            return isinstance(value, bool) or not isinstance(value, int) or value < 0
        if isinstance(value, bool) or not isinstance(value, numbers.Real) \
                or not math.isfinite(value) or (self.hi is not None and value > self.hi):
            return True
        return self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo)

    def message(self, value) -> str:
        """The one-line message for a value this knob refuses (naming the field)."""
        if self.kind == "count":
            return f"{self.name}: must be a non-negative integer, got {value_text(value)}"
        if self.kind == "bool":
            return f"{self.name}: must be true or false, got {value_text(value)}"
        if self.kind == "choice":
            shown = repr(value) if isinstance(value, str) else value_text(value)
            return f"{self.name}: unknown {shown}; choose one of {', '.join(self.options())}"
        span = f"in ({self.lo:g}, {self.hi:g}]" if self.lo_open else \
            f"from {self.lo:g} to {self.hi:g}"
        return f"{self.name}: must be a number {span}{self.note}, got {value_text(value)}"


KNOBS: dict[str, Knob] = {}
_sealed: list[bool] = []  # set once config.py has made the knobs MergeConfig's fields


def knob(name: str, kind: str, default=None, **kw) -> Knob:
    """Declare a knob (a MergeConfig field) once, by name, in this file."""
    if _sealed:
        raise RuntimeError(f"knob {name!r}: declare knobs in merge/registry.py (MergeConfig's "
                           "fields are already made)")
    if name in KNOBS:
        raise ValueError(f"knob {name!r} is declared twice")
    KNOBS[name] = Knob(name, kind, default, **kw)
    return KNOBS[name]


def _weight(name: str, help: str) -> Knob:
    return knob(name, "number", 1.0, lo=0.0, hi=MAX_WEIGHT, help=help, label=name,
                note=" (only the ratio w_task : w_lang matters)")


def _lambda(name: str, help: str, label: str, default: float = 1.0) -> Knob:
    return knob(name, "number", default, lo=-MAX_LAMBDA, hi=MAX_LAMBDA, help=help, label=label)


# --------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class MergeMethod:
    """One merge method. ``sources(config, names, arch, blend)`` returns {name: Source} in the
    given order (``blend``: the task/lang weighted blend with the config's weights, None where
    magnitude-adjusted weights are not known yet); ``describe(config, num_layers)`` one line.
    ``blends(config)``: whether some tensors are that blend; ``magnitude``: the blend weights are
    always the magnitude-adjusted ones; ``check(config, num_layers)`` the checks that need the
    model's depth (raises ConfigError); ``concrete(config, num_layers)`` the config as merged at
    that depth, recorded with the output (e.g. the layer counts a depth-scaled default gives)."""
    id: str
    label: str
    knobs: tuple[str, ...]
    sources: Callable[..., dict]
    describe: Callable[..., str]
    needs_base: bool = False
    linear: bool = False
    blends: Callable[[Any], bool] = lambda config: False
    magnitude: bool = False
    check: Callable[[Any, int], None] | None = None
    concrete: Callable[[Any, int], Any] | None = None


MERGE_METHODS: dict[str, MergeMethod] = {}


def seal_knobs() -> dict[str, Knob]:
    """The knobs, for ``config.py`` to make them MergeConfig's fields; no knob may follow."""
    _sealed.append(True)
    return dict(KNOBS)


def register_method(method: MergeMethod) -> MergeMethod:
    unknown = [k for k in method.knobs if k not in KNOBS]
    if unknown:
        raise ValueError(f"method {method.id}: undeclared knob(s) {unknown} (declare them with "
                         "knob() in merge/registry.py)")
    MERGE_METHODS[method.id] = method
    return method


def unregister_method(method_id: str):
    MERGE_METHODS.pop(method_id, None)


def get_method(method_id: str) -> MergeMethod:
    if method_id not in MERGE_METHODS:
        raise ConfigError(f"method: unknown {method_id!r}; choose one of "
                          f"{', '.join(MERGE_METHODS)}")
    return MERGE_METHODS[method_id]


def concrete(config, num_layers: int):
    """``config`` as its method merges it at ``num_layers`` layers (``MergeMethod.concrete``)."""
    fix = get_method(config.method).concrete
    return config if fix is None else fix(config, num_layers)


def linear_methods() -> tuple[str, ...]:
    """Methods linear in the deltas (LoRA experts merge exactly under them)."""
    return tuple(m.id for m in MERGE_METHODS.values() if m.linear)


class _Labels(Mapping):
    """UI label -> method id, read from the registry on every use."""

    def __getitem__(self, label: str) -> str:
        for m in MERGE_METHODS.values():
            if m.label == label:
                return m.id
        raise KeyError(label)

    def __iter__(self):
        return iter([m.label for m in MERGE_METHODS.values()])

    def __len__(self) -> int:
        return len(MERGE_METHODS)


METHOD_LABELS: Mapping[str, str] = _Labels()


# --------------------------------------------------------------------------- the texts
def weights_text(config) -> str:
    if config.magnitude_weights:
        return "magnitude-adjusted weights"
    return f"weights task {config.w_task:g} : lang {config.w_lang:g}"


def non_layer_text(config, blends: bool = False) -> str:
    if config.non_layer == "blend":
        return "non-layer parameters averaged, " + weights_text(config)
    src = "task expert" if config.non_layer == "task" else "language expert"
    return f"non-layer parameters from the {src}" + (", " + weights_text(config) if blends
                                                     else "")


# --------------------------------------------------------------------------- layer swap
knob("bottom", "count", None, optional=True, label="Bottom layers b (language)",
     help="bottom layers from the language expert (default: 5 of 32, scaled to the model)")
knob("top", "count", None, optional=True, label="Top layers u (language)",
     help="top layers from the language expert (default: 2 of 32, scaled)")
knob("transition_bottom", "count", 0, label="Transition t_b (blended)",
     help="blended layers above the bottom ones")
knob("transition_top", "count", 0, label="Transition t_u (blended)",
     help="blended layers below the top ones")
_weight("w_task", "blend weight of the task expert (0..1e4)")
_weight("w_lang", "blend weight of the language expert (0..1e4)")
knob("magnitude_weights", "bool", False, label="Magnitude-adjusted weights (needs base)",
     help="blend weights = inverse mean delta from the base (needs --base; replaces "
          "--w-task/--w-lang)")
knob("non_layer", "choice", "blend", choices=NON_LAYER_SOURCES,
     label="Non-layer parameters (embeddings, final norm, LM head)",
     help="layer swap: where the non-layer parameters (embeddings, final norm, LM head) come "
          "from: blend (default; Algorithm 1 averages them with the blend weights), task or lang")
knob("partition", "value", None, check=check_partition_spec,
     label="Partition (parameters to the language expert)",
     help="A, B, C (the published presets, in absolute layers), or a YAML file with a list of "
          "rules ({layers: '0-5', kinds: attention}; layers: non-layer addresses the embeddings, "
          "final norm and LM head)")
knob("scale_partition", "bool", False,
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


register_method(MergeMethod(
    "layer_swap", "layer swap",
    ("bottom", "top", "transition_bottom", "transition_top", "w_task", "w_lang",
     "magnitude_weights", "non_layer", "partition", "scale_partition"),
    _swap_sources, _swap_describe, linear=True, blends=_swap_blends, check=_swap_check,
    concrete=_swap_concrete))

# --------------------------------------------------------------------------- soups
register_method(MergeMethod(
    "soup", "model soup", ("w_task", "w_lang", "magnitude_weights"),
    lambda config, names, arch, blend: dict.fromkeys(names, blend),
    lambda config, num_layers: "model soup, " + weights_text(config),
    linear=True, blends=lambda config: True))
register_method(MergeMethod(
    "magnitude_soup", "magnitude soup", (),
    lambda config, names, arch, blend: dict.fromkeys(names, blend),
    lambda config, num_layers: "magnitude-weighted soup",
    needs_base=True, blends=lambda config: True, magnitude=True))

# --------------------------------------------------------------------------- task arithmetic
_lambda("lambda_task", "task arithmetic scale of the task delta (-100..100)",
        "task arithmetic: lambda task")
_lambda("lambda_lang", "task arithmetic scale of the language delta (-100..100)", "lambda lang")
register_method(MergeMethod(
    "task_arithmetic", "task arithmetic", ("lambda_task", "lambda_lang"),
    lambda config, names, arch, blend: dict.fromkeys(names, Source(
        "task_arithmetic", ("base", "task", "lang"),
        (float(config.lambda_task), float(config.lambda_lang)))),
    lambda config, num_layers: f"task arithmetic: lambda task {config.lambda_task:g}, "
                               f"lang {config.lambda_lang:g}",
    needs_base=True, linear=True))

# --------------------------------------------------------------------------- TIES
knob("ties_density", "number", 0.2, lo=0.0, hi=1.0, lo_open=True, step=0.05,
     label="TIES density (0-1]",
     note=" (the fraction of each delta kept)",
     help="TIES: fraction of each delta kept, per tensor (0 < d <= 1)")
_lambda("ties_lambda", "TIES: scale of the merged delta (-100..100)", "TIES lambda")
register_method(MergeMethod(
    "ties", "TIES", ("ties_density", "ties_lambda"),
    lambda config, names, arch, blend: dict.fromkeys(names, Source(
        "ties", ("base", "task", "lang"), (1.0, 1.0),
        (("density", float(config.ties_density)), ("lam", float(config.ties_lambda))))),
    lambda config, num_layers: f"TIES: density {config.ties_density:g}, "
                               f"lambda {config.ties_lambda:g}",
    needs_base=True))
