"""Which Configure controls the chosen method reads, and notes that keep the page truthful.

Pure functions over the merge registry (no session, no tensors): ``control_states`` says, for
every control, None when the chosen method and partition use it, else the one-line reason it is
ignored (the page disables it and shows the reason); ``outside_validated`` names the values that
leave the paper's validated ranges; ``since_build`` says when the Configure tab no longer shows
the model that was built.
"""
from __future__ import annotations

from ..merge import registry
from ..merge.config import validated_ranges

LAYER_CONTROLS = ("bottom", "top", "transition_bottom", "transition_top")
NO_PARTITION = "none (bottom/top sliders)"
CONTROLS = (*LAYER_CONTROLS, "w_task", "w_lang", "magnitude_weights", "partition", "rules",
            "non_layer", "scale_partition")


def control_states(method: str, partition: str | None = None) -> dict[str, str | None]:
    """{control: None if used, else why it is ignored} for ``method`` (id or label) and the
    partition choice (None or ``NO_PARTITION``: the bottom/top sliders), for ``CONTROLS`` and
    every number knob of the registered methods."""
    method_id = registry.METHOD_LABELS.get(method, method)
    m = registry.get_method(method_id)
    knobs = set(m.knobs)
    numbers = [k for mm in registry.MERGE_METHODS.values() for k in mm.knobs
               if registry.KNOBS[k].kind == "number"]
    states: dict[str, str | None] = {}
    for name in (*CONTROLS, *numbers):
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


SHORT_NAMES = {"transition_bottom": "t_b", "transition_top": "t_u", "rules": "custom rules",
               "non_layer": "non-layer source", "scale_partition": "scale presets",
               "lambda_task": "lambda task", "lambda_lang": "lambda lang",
               "ties_density": "TIES density", "ties_lambda": "TIES lambda"}


def ignored_text(states: dict[str, str | None], shown: set[str] | None = None) -> str:
    """One line naming the controls ``states`` marks ignored, grouped by reason ("" if none);
    ``shown``: only these controls (the others are hidden anyway)."""
    why: dict[str, list[str]] = {}
    for name, reason in states.items():
        if reason and (shown is None or name in shown):
            why.setdefault(reason, []).append(SHORT_NAMES.get(name, name.replace("_", " ")))
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
