"""The merge methods a config can name, each declared ONCE (the one place to add a method).

A method is one ``merge_method(...)`` declaration below (mergekit's ``@merge_method``): its id
(``MergeConfig.method``), its label and its knobs with their controls (``Knob``: kind, default,
bounds, CLI help, the app control's widget, label and short name), its own per-tensor
arithmetic (``arithmetic``: ``methods.tensor_method`` records of functions in ``methods.py``),
whether it needs the base model, whether it is linear in the deltas (then LoRA experts merge
exactly, see ``lora.py``), how it sends every parameter to a ``Source``, how it describes itself
in one line and how it is written as a mergekit YAML (``mergekit``). Everything else reads this
registry: ``MergeConfig``'s fields and their checks (``Knob.refuses``; ``config.py``),
``build_plan`` (``plan.py``), the CLI's flags and ``--method`` choices (``cli/merge.py``), the
app's method radio and controls (``workbench/controls.py``), the LoRA path and ``to_mergekit``.

A knob is declared once, by the first method that lists it as a ``Knob``; other methods may
list it again (the same ``Knob``, or its name). A method declared later (a plugin, a test) works
the same way: its knobs become ``MergeConfig`` fields at once (``on_change``), and
``unregister_method`` takes the method, its arithmetic and the knobs only it used away again.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

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
KINDS = ("count", "number", "bool", "choice", "value")
# The app controls a knob can ask for (the app lays "partition" out itself: presets and rules).
WIDGETS = {"slider": "a slider over [lo, hi] (a count: 0 to the model's depth)",
           "number": "a number box with the knob's bounds and step",
           "checkbox": "a checkbox", "choice": "a radio of the knob's options",
           "text": "a text box", "partition": "the partition presets and custom rules"}
DEFAULT_WIDGET = {"count": "slider", "number": "number", "bool": "checkbox", "choice": "choice",
                  "value": "text"}


@dataclass(frozen=True)
class Knob:
    """One ``MergeConfig`` field: its kind and bounds (checked by ``refuses``), its
    default, the help of its CLI flag and the label of its app control.

    kind: "count" (a non-negative int), "number" (a finite float in [lo, hi], or (lo, hi] with
    ``lo_open``), "bool", "choice" (one of ``choices``, a tuple or a function returning one) or
    "value" (anything ``check(name, value)`` accepts; it raises ConfigError). ``optional``: None
    is allowed too. The CLI sets every knob with ``--NAME`` (a "value" knob's flag is text).
    ``widget``: the app control (``WIDGETS``; default by kind: ``control``); ``short``: its name
    in the page's one-line notes (default: the name with spaces).
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
    widget: str = ""               # the app control: one of WIDGETS ("": by kind)
    short: str = ""                # its name in the page's notes ("": the name with spaces)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"knob {self.name}: unknown kind {self.kind!r}; one of {KINDS}")
        if self.widget and self.widget not in WIDGETS:
            raise ValueError(f"knob {self.name}: unknown widget {self.widget!r}; one of "
                             f"{tuple(WIDGETS)}")

    @property
    def control(self) -> str:
        """The app control's kind (``WIDGETS``): the declared widget, else the kind's default."""
        return self.widget or DEFAULT_WIDGET[self.kind]

    @property
    def short_name(self) -> str:
        return self.short or self.name.replace("_", " ")

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


KNOBS: dict[str, Knob] = {}   # the registered methods' knobs, in declaration order


def _weight(name: str, help: str) -> Knob:
    return Knob(name, "number", 1.0, lo=0.0, hi=MAX_WEIGHT, help=help, label=name,
                widget="slider", note=" (only the ratio w_task : w_lang matters)")


def _lambda(name: str, help: str, label: str, short: str, default: float = 1.0) -> Knob:
    return Knob(name, "number", default, lo=-MAX_LAMBDA, hi=MAX_LAMBDA, help=help, label=label,
                short=short)


# --------------------------------------------------------------------------- methods
@dataclass(frozen=True)
class MergeMethod:
    """One merge method. ``sources(config, names, arch, blend)`` returns {name: Source} in the
    given order (``blend``: the task/lang weighted blend with the config's weights, None where
    magnitude-adjusted weights are not known yet); ``describe(config, num_layers)`` one line.
    ``blends(config)``: whether some tensors are that blend; ``magnitude``: the blend weights are
    always the magnitude-adjusted ones; ``check(config, num_layers)`` the checks that need the
    model's depth (raises ConfigError); ``concrete(config, num_layers)`` the config as merged at
    that depth, recorded with the output (e.g. the layer counts a depth-scaled default gives);
    ``arithmetic``: the per-tensor methods it brings (``methods.METHODS`` names, registered and
    unregistered with it); ``mergekit``: how ``to_mergekit`` writes it: ``SLICES`` (the plan's
    copies and blends as slices), ``BLEND`` (mergekit's linear over the two experts),
    ``mergekit(config, paths, notes)`` returning the YAML's method, base model, parameters and
    models (it may append notes), or None (no mergekit counterpart)."""
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
    arithmetic: tuple[str, ...] = ()
    mergekit: str | Callable[..., dict] | None = None


SLICES, BLEND = "slices", "blend"   # MergeMethod.mergekit: the writers mergekit_yaml has
MERGE_METHODS: dict[str, MergeMethod] = {}
_BROUGHT: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # id -> (knobs, arithmetic)
_listeners: list[Callable[[], None]] = []


def on_change(listener: Callable[[], None]):
    """Call ``listener()`` whenever a method (and so the knobs) is registered or unregistered
    (``config.py`` remakes ``MergeConfig``'s fields)."""
    _listeners.append(listener)


def _changed():
    for listener in _listeners:
        listener()


def merge_method(id: str, label: str, *, knobs: Sequence[Knob | str] = (),
                 sources: Callable[..., dict], describe: Callable[..., str],
                 arithmetic: Sequence[methods.Method] = (), **hooks) -> MergeMethod:
    """Declare a merge method in one place: its id and label, its knobs (a ``Knob`` declares one;
    a name lists one another method declared), the per-tensor ``arithmetic`` it brings
    (``methods.tensor_method`` records), ``sources``, ``describe`` and the other ``MergeMethod``
    fields (``needs_base``, ``linear``, ``blends``, ``magnitude``, ``check``, ``concrete``,
    ``mergekit``). ValueError for a knob or arithmetic declared twice differently."""
    if id in MERGE_METHODS:
        raise ValueError(f"method {id!r} is registered twice")
    for k in knobs:
        if isinstance(k, Knob) and KNOBS.get(k.name, k) != k:
            raise ValueError(f"method {id}: knob {k.name!r} is declared twice, differently")
    for a in arithmetic:
        if methods.METHODS.get(a.name, a) != a:
            raise ValueError(f"method {id}: per-tensor method {a.name!r} is already registered")
    names = tuple(k.name if isinstance(k, Knob) else k for k in knobs)
    new = {k.name: k for k in knobs if isinstance(k, Knob) and k.name not in KNOBS}
    return register_method(
        MergeMethod(id, label, names, sources, describe,
                    arithmetic=tuple(a.name for a in arithmetic), **hooks),
        new, {a.name: a for a in arithmetic})


def register_method(method: MergeMethod, knobs: Mapping[str, Knob] | None = None,
                    arithmetic: Mapping[str, methods.Method] | None = None) -> MergeMethod:
    """Register ``method`` with the knobs and per-tensor methods it declares (``merge_method``
    is the one way to write a declaration)."""
    knobs, arithmetic = dict(knobs or {}), dict(arithmetic or {})
    if method.id in MERGE_METHODS:
        raise ValueError(f"method {method.id!r} is registered twice")
    unknown = [k for k in method.knobs if k not in KNOBS and k not in knobs]
    if unknown:
        raise ValueError(f"method {method.id}: undeclared knob(s) {unknown} (declare each as a "
                         "Knob in its method's merge_method(...))")
    missing = [a for a in method.arithmetic if a not in methods.METHODS and a not in arithmetic]
    if missing:
        raise ValueError(f"method {method.id}: unknown per-tensor method(s) {missing}")
    knobs = {k: v for k, v in knobs.items() if k not in KNOBS}
    arithmetic = {a: v for a, v in arithmetic.items() if a not in methods.METHODS}
    KNOBS.update(knobs)
    methods.METHODS.update(arithmetic)
    MERGE_METHODS[method.id] = method
    _BROUGHT[method.id] = (tuple(knobs), tuple(arithmetic))
    _changed()
    return method


def unregister_method(method_id: str):
    """Take ``method_id`` away, with the knobs and arithmetic it brought that no other method
    uses."""
    if MERGE_METHODS.pop(method_id, None) is None:
        return
    knobs, arithmetic = _BROUGHT.pop(method_id)
    used = {k for m in MERGE_METHODS.values() for k in m.knobs}
    for k in knobs:
        if k not in used:
            KNOBS.pop(k, None)
    kept = {a for m in MERGE_METHODS.values() for a in m.arithmetic}
    for a in arithmetic:
        if a not in kept:
            methods.METHODS.pop(a, None)
    _changed()


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
BOTTOM = Knob("bottom", "count", None, optional=True, label="Bottom layers b (language)",
              help="bottom layers from the language expert (default: 5 of 32, scaled to the "
                   "model)")
TOP = Knob("top", "count", None, optional=True, label="Top layers u (language)",
           help="top layers from the language expert (default: 2 of 32, scaled)")
TRANSITION_BOTTOM = Knob("transition_bottom", "count", 0, label="Transition t_b (blended)",
                         short="t_b", help="blended layers above the bottom ones")
TRANSITION_TOP = Knob("transition_top", "count", 0, label="Transition t_u (blended)",
                      short="t_u", help="blended layers below the top ones")
W_TASK = _weight("w_task", "blend weight of the task expert (0..1e4)")
W_LANG = _weight("w_lang", "blend weight of the language expert (0..1e4)")
MAGNITUDE_WEIGHTS = Knob(
    "magnitude_weights", "bool", False, label="Magnitude-adjusted weights (needs base)",
    help="blend weights = inverse mean delta from the base (needs --base; replaces "
         "--w-task/--w-lang)")
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
BLEND_KNOBS = (W_TASK, W_LANG, MAGNITUDE_WEIGHTS)


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


merge_method(
    "layer_swap", "layer swap",
    knobs=(BOTTOM, TOP, TRANSITION_BOTTOM, TRANSITION_TOP, *BLEND_KNOBS, NON_LAYER, PARTITION,
           SCALE_PARTITION),
    sources=_swap_sources, describe=_swap_describe, linear=True, blends=_swap_blends,
    check=_swap_check, concrete=_swap_concrete, mergekit=SLICES)


# --------------------------------------------------------------------------- soups
def _soup_sources(config, names, arch, blend):
    return dict.fromkeys(names, blend)


merge_method(
    "soup", "model soup", knobs=BLEND_KNOBS, sources=_soup_sources,
    describe=lambda config, num_layers: "model soup, " + weights_text(config),
    linear=True, blends=lambda config: True, mergekit=BLEND)
merge_method(
    "magnitude_soup", "magnitude soup", sources=_soup_sources,
    describe=lambda config, num_layers: "magnitude-weighted soup",
    needs_base=True, blends=lambda config: True, magnitude=True)


# --------------------------------------------------------------------------- task arithmetic
def _task_arithmetic_mergekit(config, paths, notes) -> dict:
    return dict(merge_method="task_arithmetic", base_model=paths["base"],
                parameters={"normalize": False},
                models=[{"model": paths["task"], "parameters": {"weight": config.lambda_task}},
                        {"model": paths["lang"], "parameters": {"weight": config.lambda_lang}}])


merge_method(
    "task_arithmetic", "task arithmetic",
    knobs=(_lambda("lambda_task", "task arithmetic scale of the task delta (-100..100)",
                   "task arithmetic: lambda task", "lambda task"),
           _lambda("lambda_lang", "task arithmetic scale of the language delta (-100..100)",
                   "lambda lang", "lambda lang")),
    arithmetic=(methods.tensor_method(
        "task_arithmetic", methods.task_arithmetic, "https://arxiv.org/abs/2212.04089",
        "base + sum(lambda_i * (t_i - base)) (the scaled deltas summed first, as mergekit does)",
        row_wise=True,
        label=lambda source: "task arithmetic " + "/".join(f"{w:g}"
                                                            for w in source.weights or ()),
        coefficients=lambda source: dict(zip(source.models[1:], source.weights))),),
    sources=lambda config, names, arch, blend: dict.fromkeys(names, Source(
        "task_arithmetic", ("base", "task", "lang"),
        (float(config.lambda_task), float(config.lambda_lang)))),
    describe=lambda config, num_layers: f"task arithmetic: lambda task {config.lambda_task:g}, "
                                        f"lang {config.lambda_lang:g}",
    needs_base=True, linear=True, mergekit=_task_arithmetic_mergekit)


# --------------------------------------------------------------------------- TIES
def _ties_mergekit(config, paths, notes) -> dict:
    if config.ties_density < 1:
        notes.append("TIES: an entry whose |delta| ties with its tensor's trim threshold is "
                     "kept by layerswap (all tied entries), by mergekit only within exactly k "
                     "= int(density * n) entries: such entries can differ, all others are "
                     "bit-identical")
    return dict(merge_method="ties", base_model=paths["base"],
                parameters={"normalize": True, "lambda": config.ties_lambda},
                models=[{"model": paths[r], "parameters": {"weight": 1.0,
                                                           "density": config.ties_density}}
                        for r in ("task", "lang")])


merge_method(
    "ties", "TIES",
    knobs=(Knob("ties_density", "number", 0.2, lo=0.0, hi=1.0, lo_open=True, step=0.05,
                label="TIES density (0-1]", short="TIES density",
                note=" (the fraction of each delta kept)",
                help="TIES: fraction of each delta kept, per tensor (0 < d <= 1)"),
           _lambda("ties_lambda", "TIES: scale of the merged delta (-100..100)", "TIES lambda",
                   "TIES lambda")),
    arithmetic=(methods.tensor_method(
        "ties", methods.ties, "https://arxiv.org/abs/2306.01708",
        "TIES: trim each delta to its top-density magnitudes (per tensor), elect the sign of "
        "the summed deltas (a zero sum counts as positive, as in mergekit), average the deltas "
        "that agree with it (disjoint mean), base + lam * mean",
        label=lambda source: f"ties d={dict(source.args).get('density', 0.2)}",
        row_wise=True, whole_tensor=methods.ties_thresholds),),
    sources=lambda config, names, arch, blend: dict.fromkeys(names, Source(
        "ties", ("base", "task", "lang"), (1.0, 1.0),
        (("density", float(config.ties_density)), ("lam", float(config.ties_lambda))))),
    describe=lambda config, num_layers: f"TIES: density {config.ties_density:g}, "
                                        f"lambda {config.ties_lambda:g}",
    needs_base=True, mergekit=_ties_mergekit)
