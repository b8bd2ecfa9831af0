"""The grid of a sweep: ``bottom=3,4,5 top=0,1,2`` -> axes of ``MergeConfig`` values -> every
configuration (a point per cell, impossible cells set aside with the reason).

Any numeric ``MergeConfig`` field (a "count" or "number" knob of the registry) can be an axis,
as long as the method reads it; ``transition`` sets both transitions (the paper's single t), and
``b``, ``u``, ``t`` are the paper's names. Values: ``3,4,5``; count fields also take ranges
``0-4`` and steps ``0-8:2``. Every value is checked by ``MergeConfig`` itself."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ..merge.config import FIELDS, MergeConfig
from ..merge.partition import ConfigError, parse_layers
from ..merge.registry import get_method, partition_replaces

ALIASES = {"b": "bottom", "u": "top", "t": "transition", "t_b": "transition_bottom",
           "t_u": "transition_top"}
BOTH_TRANSITIONS = ("transition_bottom", "transition_top")
MAX_VALUES = 1000   # per axis: a typo such as 0-100000 is refused, not expanded


@dataclass(frozen=True)
class Cell:
    """One configuration of the grid: its point (axis -> value, in axis order) and config."""
    point: tuple[tuple[str, float | int], ...]
    config: MergeConfig
    index: tuple[int, ...] = ()   # position on each axis

    @property
    def values(self) -> dict:
        return dict(self.point)

    def label(self) -> str:
        return ", ".join(f"{k} {v:g}" for k, v in self.point)


def sweepable_fields(method: str) -> list[str]:
    """The numeric fields a sweep over ``method`` may vary (its count and number knobs)."""
    knobs = get_method(method).knobs
    out = [k for k in knobs if FIELDS[k].kind in ("count", "number")]
    if all(t in out for t in BOTH_TRANSITIONS):
        out.append("transition")
    return out


def _field(name: str, method: str) -> str:
    field = ALIASES.get(name, name)
    allowed = sweepable_fields(method)
    if field not in allowed:
        why = "is not a numeric merge field" if field not in FIELDS and field != "transition" \
            else f"is not a numeric knob of method {method}"
        raise ConfigError(f"grid: {name!r} {why}; sweepable: {', '.join(allowed)}")
    return field


def _number(text: str, kind: str, axis: str):
    try:
        if kind == "count":
            value = int(text)
        else:
            value = float(text)
    except ValueError:
        want = "a non-negative integer" if kind == "count" else "a number"
        raise ConfigError(f"grid: {axis}: {text!r} is not {want}") from None
    return value


def axis_values(text: str, axis: str, kind: str = "count", depth: int | None = None) -> list:
    """The one reader of a sweep axis's values (the CLI's ``--grid`` and the app's Sweep tab):
    '3,4,5', '0-4' or '0-8:2' (every 2nd of a range of counts), in the order given, each once.

    With ``depth`` (the model's layer count: counts run 0..depth) a count item is read by the
    merge's one layer parser (``partition.parse_layers`` over ``depth + 1`` values: bounds
    checked before any range is built), so 'first 3', 'last 2' and 'all' work too, and ':STEP'
    keeps every STEP-th value of that item; a value outside 0..depth is refused. Without a
    depth, counts are plain integers and ranges. ConfigError (one line) otherwise."""
    out: list = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        rng, _, step = part.partition(":")
        if kind == "count" and depth is not None:
            try:
                every = int(step) if step.strip() else 1
                values = sorted(parse_layers(rng, depth + 1)) if rng.strip() else []
            except ValueError:   # ConfigError is a ValueError: one message for both
                values = []
            if not values or every < 1:
                raise ConfigError(f"{axis}: {part!r} is not a value or range within 0..{depth} "
                                  "(use e.g. 0,2,4 or 0-6:2)")
            out += values[::every]
        elif kind == "count" and "-" in rng.strip().lstrip("-"):
            lo, _, hi = rng.partition("-")
            lo, hi = _number(lo.strip(), kind, axis), _number(hi.strip(), kind, axis)
            every = _number(step.strip(), kind, axis) if step.strip() else 1
            if lo > hi or every < 1 or (hi - lo) // every >= MAX_VALUES:
                raise ConfigError(f"grid: {axis}: {part!r} is not a range such as 0-4 or 0-8:2")
            out += list(range(lo, hi + 1, every))
        elif step:
            raise ConfigError(f"grid: {axis}: {part!r}: steps need a range of counts (0-8:2)")
        else:
            out.append(_number(part, kind, axis))
    values = list(dict.fromkeys(out))
    if not values:
        raise ConfigError(f"{'' if depth is not None else 'grid: '}{axis}: give at least one "
                          "value")
    if len(values) > MAX_VALUES:
        raise ConfigError(f"grid: {axis}: {len(values)} values; at most {MAX_VALUES} per axis")
    return values


def parse_grid(specs: list[str] | str, method: str = "layer_swap") -> dict[str, list]:
    """``["bottom=3,4,5", "top=0,1,2"]`` (or one string) -> {"bottom": [3, 4, 5], "top": [0, 1, 2]},
    in the order given; every value checked as that ``MergeConfig`` field."""
    if isinstance(specs, str):
        specs = specs.split()
    grid: dict[str, list] = {}
    for spec in specs:
        name, eq, text = spec.partition("=")
        if not eq or not name.strip():
            raise ConfigError(f"grid: {spec!r} is not FIELD=VALUES (e.g. bottom=3,4,5)")
        field = _field(name.strip(), method)
        if field in grid or (field == "transition" and set(BOTH_TRANSITIONS) & set(grid)) or \
                (field in BOTH_TRANSITIONS and "transition" in grid):
            raise ConfigError(f"grid: {name.strip()!r} is given twice")
        kind = FIELDS["transition_bottom" if field == "transition" else field].kind
        values = axis_values(text, name.strip(), kind)
        for v in values:   # the field's own bounds (Knob.refuses, one line naming the field)
            _with(MergeConfig(method=method), field, v).check_fields()
        grid[field] = values
    if not grid:
        raise ConfigError("grid: give at least one axis, e.g. bottom=3,4,5 top=0,1,2")
    return grid


def _axes_of(fields: tuple[str, ...]) -> set[str]:
    """The grid axes that set any of ``fields`` ("transition" sets both transitions)."""
    return set(fields) | ({"transition"} if set(fields) & set(BOTH_TRANSITIONS) else set())


def _with(config: MergeConfig, field: str, value) -> MergeConfig:
    if field == "transition":
        return replace(config, transition_bottom=value, transition_top=value)
    return replace(config, **{field: value})


def expand(grid: dict[str, list], base: MergeConfig, num_layers: int,
           has_base: bool) -> tuple[list[Cell], list[tuple[Cell, str]]]:
    """Every cell of the grid in row-major order (the first axis slowest), each ``base`` with
    the cell's values; cells the model cannot take (e.g. b + u > layers) come back apart, with
    the one-line reason. A config error common to every cell (a missing base) is raised."""
    axes = list(grid)
    cells, impossible = [], []
    for index in itertools.product(*(range(len(grid[a])) for a in axes)):
        values = [grid[a][i] for a, i in zip(axes, index)]
        config = base
        for a, v in zip(axes, values):
            config = _with(config, a, v)
        if config.partition is not None and \
                set(axes) & _axes_of(partition_replaces(config.method)):
            raise ConfigError("grid: layer counts do nothing with a partition; drop --partition")
        cell = Cell(tuple(zip(axes, values)), config, index)
        try:
            config.validate(num_layers, has_base=has_base)
        except ConfigError as e:
            if config.needs_base and not has_base:   # no cell can be made without the base
                raise
            impossible.append((cell, str(e)))
            continue
        cells.append(cell)
    return cells, impossible


def shape(grid: dict[str, list]) -> tuple[int, ...]:
    return tuple(len(v) for v in grid.values())
