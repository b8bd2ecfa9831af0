"""The Configure tab: a validated ``MergeConfig`` from the tab's controls (``make_config``),
its merge plan (pure data: no tensors read) and the plan drawn (the layer stack, the cells)."""
from __future__ import annotations

import math
from typing import Any

from ..checkpoints.reading import CheckpointReader
from ..merge import registry
from ..merge.config import MergeConfig
from ..merge.plan import build_plan
from . import controls
from . import figures as plots
from .served import LIMITS, WorkbenchError, capped
from .session import Session

METHOD_LABELS = registry.METHOD_LABELS  # UI label -> MergeConfig.method (the registry's)
PARTITION_CHOICES = ("none (bottom/top sliders)", "A", "B", "C", "custom")


def parse_custom_rules(text: str) -> list[dict]:
    """Custom partition rules, one per line: ``LAYERS [: KINDS]`` -> language expert.

    e.g. ``first 6, last 2 : mlp`` or ``all : attention`` or ``0-3``; lines starting with # are
    ignored. The rest of the parameters go to the task expert.
    """
    rules = []
    for line in (text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        layers, _, kinds = line.partition(":")
        rule = {"layers": layers.strip() or "all"}
        if kinds.strip():
            rule["kinds"] = kinds.strip()
        rules.append(rule)
    if not rules:
        raise WorkbenchError("custom partition: write at least one rule, e.g. 'first 6, last 2 : mlp'")
    return rules


NON_LAYER_CHOICES = {"blend (average, as in Algorithm 1)": "blend", "task expert": "task",
                     "language expert": "lang"}


def make_config(session: Session, method: str = "layer swap", bottom: int | None = None,
                top: int | None = None, transition_bottom: int = 0, transition_top: int = 0,
                w_task: float = 1.0, w_lang: float = 1.0, magnitude_weights: bool = False,
                partition: str = PARTITION_CHOICES[0], custom_rules: str = "", *,
                non_layer: str = "blend", scale_partition: bool = False, **knobs):
    """A validated MergeConfig from the Configure tab's controls (labels as shown there);
    ``knobs``: the other number knobs of the registered methods by name (lambda_task,
    ties_density, ...: ``registry.KNOBS``)."""
    custom_rules = capped("custom rules", custom_rules, LIMITS.rules_chars)
    method_id = METHOD_LABELS.get(method, method)
    part: Any = None
    if registry.takes_partition(method_id) and partition and partition != PARTITION_CHOICES[0]:
        part = parse_custom_rules(custom_rules) if partition == "custom" else partition
        transition_bottom = transition_top = 0  # a partition replaces the sliders
    numbers = {}
    for name, value in knobs.items():
        if name not in registry.KNOBS or name in controls.CONTROLS:
            raise TypeError(f"make_config: {name!r} is not a knob of a merge method's own row")
        try:   # the control's value as its field (a number, a checkbox, a choice)
            numbers[name] = controls.field_value(name, value)
        except ValueError as e:
            raise WorkbenchError(str(e)) from None
    config = MergeConfig(method=method_id, bottom=int(bottom) if bottom is not None else None,
                         top=int(top) if top is not None else None,
                         transition_bottom=int(transition_bottom or 0),
                         transition_top=int(transition_top or 0),
                         w_task=float(w_task), w_lang=float(w_lang),
                         magnitude_weights=bool(magnitude_weights),
                         non_layer=NON_LAYER_CHOICES.get(non_layer, non_layer),
                         partition=part, scale_partition=bool(scale_partition), **numbers,
                         task=session.recipe["task"], lang=session.recipe["lang"],
                         base=session.recipe.get("base"))
    return config.validate(session.num_layers, has_base=session.has_base)


def default_config(session: Session):
    return MergeConfig.default_for(session.num_layers, task=session.recipe["task"],
                                   lang=session.recipe["lang"], base=session.recipe.get("base"))


def merge_plan(session: Session, config):
    """The ``MergePlan`` of ``config`` over the session's models (pure data: no tensors read)."""
    return build_plan(config, session.param_names, session.arch)


def plan_view(session: Session, config) -> tuple[Any, str]:
    """(layer-stack figure, plan summary text) for a config. Reads no tensors: runs on every
    slider move."""
    p = merge_plan(session, config)
    fig = plots.layer_stack_figure(p.layer_rows(), non_layer=p.non_layer_sources(),
                                   kind_params=layer_kind_params(session))
    session.planned = config   # what the Configure tab shows (an invalid config then names it)
    return fig, p.summary_text()


def layer_kind_params(session: Session) -> dict[int, dict[str, int]]:
    """layer -> module kind -> parameter count, from the task expert's headers (computed once
    per session): the layer diagram splits a mixed layer by parameters."""
    if session.kind_params is None:
        out: dict[int, dict[str, int]] = {}
        with CheckpointReader(session.paths["task"]) as reader:
            for name in session.param_names:
                info = session.arch.classify(name)
                if info.layer is not None:
                    kinds = out.setdefault(info.layer, {})
                    kinds[info.kind] = kinds.get(info.kind, 0) + math.prod(reader.shape(name))
        session.kind_params = out
    return session.kind_params


def plan_cells_figure(session: Session, config, over: str | None = None,
                      tau: float | None = None):
    """Source of every (layer, module) cell; ``over`` = "task"/"lang" draws the plan over that
    expert's delta heatmap (Analyze first) at threshold ``tau`` (default: the one last drawn on
    the Deltas tab). Reads no tensors."""
    p = merge_plan(session, config)
    stats = None
    if over is not None:
        if over not in session.stats:
            raise WorkbenchError("analyze the deltas first (Deltas tab)")
        stats = session.stats[over]
        tau = tau if tau is not None else session.tau
    return plots.plan_heatmap(p.cells(), session.num_layers, stats=stats, tau=tau)

