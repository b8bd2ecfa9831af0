"""The merge-method machinery: ``declare_method(...)`` declares a method once, in its own file
(``method_<id>.py``, mergekit's ``merge_methods/<name>.py``: the one place to add a method), and
``register_method`` registers it (``config.py`` the built-ins, in their order; a plugin or a
test both at once: ``merge_method(...)``).

A method is one declaration: its id (``MergeConfig.method``), its label
and its knobs with their controls (``Knob``: kind, default, bounds, CLI help, the app control's
widget, label and short name), its own per-tensor arithmetic (``arithmetic``:
``methods.tensor_method`` records), whether it needs the base model, whether it is linear in the
deltas (then LoRA experts merge exactly, see ``lora.py``), how it sends every parameter to a
``Source``, how it describes itself in one line and how it writes and reads itself as a mergekit
YAML (``to_mergekit``, ``from_mergekit``; the parts they share: ``mergekit_parts.py``).
Everything else reads this registry when it is used: ``MergeConfig``'s fields and their checks
(``Knob.refuses``; ``config.py``), ``build_plan`` (``plan.py``), the CLI's flags and
``--method`` choices (``cli/merge.py``), the app's method radio and controls
(``workbench/controls.py``), the LoRA path and ``mergekit_yaml.py``.

A knob is declared once, by the first method that lists it as a ``Knob``; other methods may
list it again (the same ``Knob``, or its name). A method declared later (a plugin, a test) works
the same way: its knobs are ``MergeConfig`` fields from then on, and ``unregister_method`` takes
the method, its arithmetic and the knobs only it used away again.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from . import methods
from .errors import ConfigError
from .partition import value_text

# Bounds of the numeric knobs (larger magnitudes are refused, never silently merged):
# w_task/w_lang only set the ratio of a blend, so 0..1e4 allows any sensible ratio while
# w * tensor stays far from float32/bfloat16 overflow; a lambda scales a delta, and past 100
# (published values are around 0.3-2) it only pushes weights out of range (float16 max 65504).
MAX_WEIGHT = 1e4
MAX_LAMBDA = 100.0


# --------------------------------------------------------------------------- sources
@dataclass(frozen=True)
class Source:
    """Where one output tensor comes from.

    ``method`` is a per-tensor method of ``methods.METHODS`` ("copy", "linear", and those a merge
    method brings, e.g. "task_arithmetic", "ties"); ``models`` its inputs in order; ``weights`` the per-model weights (None: magnitude-
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


def weight_knob(name: str, help: str) -> Knob:
    return Knob(name, "number", 1.0, lo=0.0, hi=MAX_WEIGHT, help=help, label=name,
                widget="slider", note=" (only the ratio w_task : w_lang matters)")


def lambda_knob(name: str, help: str, label: str, short: str, default: float = 1.0) -> Knob:
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
    unregistered with it). mergekit: ``to_mergekit(config, plan, paths, notes)`` returns the
    YAML's ``merge_method``, ``base_model``, ``parameters`` and ``models`` or ``slices`` for the
    merge ``plan`` builds (``paths``: role -> model path; it may append notes, and raises
    ConfigError where mergekit cannot express the config), None: no mergekit counterpart;
    ``from_mergekit(doc, num_layers)``: the ``MergeConfig`` fields (method, knobs, models) of a
    mergekit YAML ``doc`` (a mapping, its ``dtype`` already read) this method reads, None for a
    YAML that is not its kind (another method's, tried in declaration order), ConfigError for
    its kind that it cannot map; ``mergekit_reads``: what it reads, for the refusal of a YAML
    no method reads (e.g. "task_arithmetic"); ``mergekit_fused_experts``: why mergekit cannot
    express it on a mixture-of-experts model whose experts mergekit writes fused ("": it can).
    A method that lists the ``partition`` knob takes a partition (``takes_partition``);
    ``partition_replaces``: the knobs a partition takes the place of (set, they do nothing)."""
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
    to_mergekit: Callable[..., dict] | None = None
    from_mergekit: Callable[..., dict | None] | None = None
    mergekit_reads: str = ""
    mergekit_fused_experts: str = ""
    partition_replaces: tuple[str, ...] = ()


MERGE_METHODS: dict[str, MergeMethod] = {}
_BROUGHT: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}  # id -> (knobs, arithmetic)


class Declared(NamedTuple):
    """A merge method as declared, not registered yet: its record, the ``Knob``s it declares and
    the per-tensor methods it brings (``register_method``'s arguments)."""
    method: MergeMethod
    knobs: dict[str, Knob]
    arithmetic: dict[str, methods.Method]


def declare_method(id: str, label: str, *, knobs: Sequence[Knob | str] = (),
                   sources: Callable[..., dict], describe: Callable[..., str],
                   arithmetic: Sequence[methods.Method] = (), **hooks) -> Declared:
    """A merge method in one place: its id and label, its knobs (a ``Knob`` declares one; a name
    lists one another method declared), the per-tensor ``arithmetic`` it brings
    (``methods.tensor_method`` records), ``sources``, ``describe`` and the other ``MergeMethod``
    fields (``needs_base``, ``linear``, ``blends``, ``magnitude``, ``check``, ``concrete``,
    ``to_mergekit``, ``from_mergekit``, ``mergekit_reads``, ``mergekit_fused_experts``,
    ``partition_replaces``). Registered by ``register_method``:
    a built-in's file declares it and ``config.py`` registers the built-ins in their order, so
    the order (the CLI's choices, the app's radio, ``FIELDS``) never depends on which module was
    imported first."""
    names = tuple(k.name if isinstance(k, Knob) else k for k in knobs)
    return Declared(MergeMethod(id, label, names, sources, describe,
                                arithmetic=tuple(a.name for a in arithmetic), **hooks),
                    {k.name: k for k in knobs if isinstance(k, Knob)},
                    {a.name: a for a in arithmetic})


def merge_method(id: str, label: str, **declaration) -> MergeMethod:
    """Declare and register a merge method at once (a plugin, a test): ``declare_method``'s
    arguments."""
    return register_method(*declare_method(id, label, **declaration))


def register_method(method: MergeMethod, knobs: Mapping[str, Knob] | None = None,
                    arithmetic: Mapping[str, methods.Method] | None = None) -> MergeMethod:
    """Register ``method`` with the knobs and per-tensor methods it declares (a ``Declared``).
    ValueError for a method registered twice, a knob or per-tensor method declared twice
    differently, or a knob or per-tensor method it names that nothing declares."""
    knobs, arithmetic = dict(knobs or {}), dict(arithmetic or {})
    if method.id in MERGE_METHODS:
        raise ValueError(f"method {method.id!r} is registered twice")
    for name, k in knobs.items():
        if KNOBS.get(name, k) != k:
            raise ValueError(f"method {method.id}: knob {name!r} is declared twice, differently")
    for name, a in arithmetic.items():
        if methods.METHODS.get(name, a) != a:
            raise ValueError(f"method {method.id}: per-tensor method {name!r} is already "
                             "registered")
    unknown = [k for k in method.knobs if k not in KNOBS and k not in knobs]
    if unknown:
        raise ValueError(f"method {method.id}: undeclared knob(s) {unknown} (declare each as a "
                         "Knob in its method's declaration)")
    missing = [a for a in method.arithmetic if a not in methods.METHODS and a not in arithmetic]
    if missing:
        raise ValueError(f"method {method.id}: unknown per-tensor method(s) {missing}")
    knobs = {k: v for k, v in knobs.items() if k not in KNOBS}
    arithmetic = {a: v for a, v in arithmetic.items() if a not in methods.METHODS}
    KNOBS.update(knobs)
    methods.METHODS.update(arithmetic)
    MERGE_METHODS[method.id] = method
    _BROUGHT[method.id] = (tuple(knobs), tuple(arithmetic))
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


def get_method(method_id: str) -> MergeMethod:
    if method_id not in MERGE_METHODS:
        raise ConfigError(f"method: unknown {method_id!r}; choose one of "
                          f"{', '.join(MERGE_METHODS)}")
    return MERGE_METHODS[method_id]


def concrete(config, num_layers: int):
    """``config`` as its method merges it at ``num_layers`` layers (``MergeMethod.concrete``)."""
    fix = get_method(config.method).concrete
    return config if fix is None else fix(config, num_layers)


def takes_partition(method_id: str) -> bool:
    """Whether ``method_id`` is a registered method that lists the ``partition`` knob."""
    method = MERGE_METHODS.get(method_id)
    return method is not None and "partition" in method.knobs


def partition_replaces(method_id: str) -> tuple[str, ...]:
    """The knobs a partition takes the place of in ``method_id`` (``MergeMethod``); () for a
    method that takes none, or is not registered."""
    method = MERGE_METHODS.get(method_id)
    return () if method is None else method.partition_replaces


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




# --------------------------------------------------------------------------- the blend
# The task/lang weighted blend ``build_plan`` hands every method (``sources(..., blend)``) and
# ``MergeConfig.validate`` checks: its knobs, listed by each method that blends.
W_TASK = weight_knob("w_task", "blend weight of the task expert (0..1e4)")
W_LANG = weight_knob("w_lang", "blend weight of the language expert (0..1e4)")
MAGNITUDE_WEIGHTS = Knob(
    "magnitude_weights", "bool", False, label="Magnitude-adjusted weights (needs base)",
    help="blend weights = inverse mean delta from the base (needs --base; replaces "
         "--w-task/--w-lang)")
BLEND_KNOBS = (W_TASK, W_LANG, MAGNITUDE_WEIGHTS)


def weights_text(config) -> str:
    if config.magnitude_weights:
        return "magnitude-adjusted weights"
    return f"weights task {config.w_task:g} : lang {config.w_lang:g}"
