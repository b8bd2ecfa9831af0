"""Which Configure controls the chosen method reads, and notes that keep the page truthful.

Pure functions over the merge registry (no session, no tensors): ``method_controls`` and
``control_spec`` say which control each method's own knobs get (from their declaration in
``merge/registry.py``: widget, label, default, bounds, step, options), ``control_states`` says,
for every control, None when the chosen method and partition use it, else the one-line reason it
is ignored (the page disables it and shows the reason, by the knobs' short names);
``outside_validated`` names the values that leave the paper's validated ranges; ``since_build``
says when the Configure tab no longer shows the model that was built.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..merge import registry
from ..merge.config import validated_ranges

LAYER_CONTROLS = ("bottom", "top", "transition_bottom", "transition_top")
NO_PARTITION = "none (bottom/top sliders)"
# The Configure tab's own layout of the layer swap's and the blends' knobs (and the custom
# rules of a partition); every other knob is its method's, laid out from ``control_spec``.
CONTROLS = (*LAYER_CONTROLS, "w_task", "w_lang", "magnitude_weights", "partition", "rules",
            "non_layer", "scale_partition")
DEFAULT_DEPTH = 30   # a count slider's maximum before a model is checked (the embedded base's)


def method_controls() -> dict[str, tuple[str, ...]]:
    """{method id: its knobs that the Configure tab does not lay out itself (not in
    ``CONTROLS``)}, in declaration order: a row of controls per method, shown with it."""
    return {m.id: tuple(k for k in m.knobs if k not in CONTROLS)
            for m in registry.MERGE_METHODS.values()}


@dataclass(frozen=True)
class ControlSpec:
    """One knob's control, as its declaration asks (``registry.Knob``): ``widget`` one of
    ``registry.WIDGETS``; ``kwargs()`` its value, label, bounds, step or options under the
    names Gradio's components take (gr.Number, gr.Slider, gr.Checkbox, gr.Radio, gr.Textbox)."""
    name: str
    widget: str
    label: str
    value: Any
    minimum: float | None = None
    maximum: float | None = None
    step: float | None = None
    choices: tuple = ()
    short: str = ""

    def kwargs(self) -> dict:
        out = {"value": self.value, "label": self.label}
        if self.widget in ("number", "slider"):
            out.update(minimum=self.minimum, maximum=self.maximum, step=self.step)
        elif self.widget == "choice":
            out["choices"] = list(self.choices)
        return out


def control_spec(name: str, depth: int = DEFAULT_DEPTH) -> ControlSpec:
    """The control of the knob ``name`` (``registry.KNOBS``); a count's slider goes from 0 to
    ``depth`` (the model's number of layers)."""
    k = registry.KNOBS[name]
    widget = k.control
    lo, hi = (0, depth) if k.kind == "count" else (k.lo, k.hi)
    step = (k.step or 1) if widget in ("number", "slider") else None
    value = k.default
    if widget == "choice" and value is None and k.options():
        value = k.options()[0]
    return ControlSpec(name, widget, k.label or name, value, lo, hi, step, k.options(),
                       k.short_name)


def field_value(name: str, value):
    """A control's value as the knob's ``MergeConfig`` field (a count int, a number float, a
    checkbox bool; ValueError naming the control if it is none)."""
    k = registry.KNOBS[name]
    cast = {"count": int, "number": float, "bool": bool}.get(k.kind)
    if cast is None or value is None and k.optional:
        return value
    try:
        return cast(value)
    except (TypeError, ValueError):
        raise ValueError(f"{k.label or name}: not a number: {value!r}") from None


def control_states(method: str, partition: str | None = None) -> dict[str, str | None]:
    """{control: None if used, else why it is ignored} for ``method`` (id or label) and the
    partition choice (None or ``NO_PARTITION``: the bottom/top sliders), for ``CONTROLS`` and
    every knob of the registered methods."""
    method_id = registry.METHOD_LABELS.get(method, method)
    m = registry.get_method(method_id)
    knobs = set(m.knobs)
    states: dict[str, str | None] = {}
    for name in (*CONTROLS, *registry.KNOBS):
        used = name in knobs or (name == "rules" and "partition" in knobs)
        states[name] = None if used else f"not used by {m.label}"
    if m.magnitude:
        for name in ("w_task", "w_lang", "magnitude_weights"):
            states[name] = f"{m.label} sets the weights from the deltas' magnitudes"
    if "partition" in knobs:
        part = None if partition in (None, "", NO_PARTITION) else partition
        if part is None:
            states["rules"] = "only for the custom partition"
            states["scale_partition"] = "only with a partition"
        else:
            for name in LAYER_CONTROLS:
                states[name] = f"ignored: partition {part} decides which layers come from the language expert"
            if part != "custom":
                states["rules"] = "only for the custom partition"
    return states


def short_name(name: str) -> str:
    """A control's name in the page's notes: its knob's declared short name (the custom rules
    are no knob)."""
    if name == "rules":
        return "custom rules"
    k = registry.KNOBS.get(name)
    return k.short_name if k is not None else name.replace("_", " ")


def ignored_text(states: dict[str, str | None], shown: set[str] | None = None) -> str:
    """One line naming the controls ``states`` marks ignored, grouped by reason ("" if none);
    ``shown``: only these controls (the others are hidden anyway)."""
    why: dict[str, list[str]] = {}
    for name, reason in states.items():
        if reason and (shown is None or name in shown):
            why.setdefault(reason, []).append(short_name(name))
    return ("Not used now: " + "; ".join(f"{', '.join(names)} ({reason})"
                                         for reason, names in why.items()) + ".") if why else ""


def outside_validated(counts: dict[str, int], num_layers: int) -> list[str]:
    """Phrases for the layer counts outside the paper's validated ranges (scaled to the depth
    by layerswap's own rule when it is not 32), e.g. "transition bottom 3 (validated: 0, 1, 2)"."""
    r = validated_ranges(num_layers)
    allowed = {"bottom": r.bottom, "top": r.top, "transition_bottom": r.transition,
               "transition_top": r.transition}
    out = []
    for name, value in counts.items():
        ok = allowed.get(name)
        if ok is not None and value not in ok:
            out.append(f"{name.replace('_', ' ')} {value} (validated: {', '.join(map(str, ok))})")
    return out


CHANGED = "changed since build — rebuild or save the built one"


def since_build(built, config, num_layers: int) -> str:
    """"" when nothing was built or the configuration is the built one; else one line saying the
    merged model (Save, Zip, Push, Evaluate, Chat) is still the built one."""
    if built is None or config is None or built == config:
        return ""
    return ("Changed since build: Save, Zip, Push, Evaluate and Chat still use the built model "
            f"({built.describe(num_layers)}); rebuild on the Build tab to use this one.")


def acts_on(who: str, built, config, num_layers: int, *, builds: bool = False) -> str:
    """One line for a tab: which merge ``who`` (e.g. "Save, Zip and Push write") acts on: the
    session's ``built`` configuration (None: nothing built), or with ``builds`` the Configure
    tab's ``config`` (None: its settings are not valid now)."""
    if builds:
        if config is None:
            return f"**{who}**: ⚠ the Configure tab's settings, not valid now (see there)."
        return f"**{who}**: {config.describe(num_layers)} (the Configure tab)."
    if built is None:
        return f"**{who}**: the built merge; nothing built yet (Build tab)."
    line = f"**{who}**: the built merge, {built.describe(num_layers)}."
    if config is None:
        return line + " ⚠ The Configure tab's settings are not valid now."
    if config != built:
        return line + f" ⚠ The Configure tab shows {config.describe(num_layers)}: {CHANGED}."
    return line
