"""Which parameters a merge takes from which model: layer and kind selections, partition rules
and the published presets. Pure data: parameter names and the architecture table only.

A ``Partition`` (presets A/B/C of the modular fine-tuning paper, or custom rules) sends the
parameters its rules match to a model (the language expert by default); ``ConfigError``
(``errors.py``: a configuration that cannot be applied, the message naming the field) is raised
by every check of the merge configuration, here and in ``config.py``.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from collections.abc import Iterable

from ..checkpoints.architectures import KIND_GROUPS, LAYER_KIND_ORDER, Architecture
from .errors import ConfigError  # noqa: F401  (also re-exported for older imports)

MODELS = ("task", "lang", "base")
# The published defaults are for 32-layer models; other depths scale them (the tool's rule).
REFERENCE_LAYERS = 32

# Input size caps: a layer/kind selection of at most MAX_SPEC_CHARS characters and
# MAX_SPEC_ITEMS comma-separated items (or list entries); at most MAX_RULES partition rules.
MAX_SPEC_CHARS = 1000
MAX_SPEC_ITEMS = 256
MAX_RULES = 256
# Expert numbers a rule may name (more than any released MoE's experts per layer: 384).
MAX_EXPERTS = 4096
NON_LAYER_WORDS = ("non-layer", "non_layer")


def scale_layers(n: int, num_layers: int, minimum: int = 1) -> int:
    """``n`` layers of a 32-layer model, scaled to ``num_layers`` (rounded half up, >= minimum)."""
    if n <= 0:
        return 0
    return max(minimum, math.floor(n * num_layers / REFERENCE_LAYERS + 0.5))


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
        raise ConfigError(f"{what}: expected text like '0-5, 7' or a list, got {value_text(spec)}")
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
            raise ConfigError(f"layer selection: {value_text(item)} is not a layer number or range")
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
            raise ConfigError(f"module kinds: {value_text(item)} is not a kind name")
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


def parse_experts(spec) -> set[int]:
    """Expert numbers: "3", "0-2, 5", or a list of ints (each below ``MAX_EXPERTS``; the model's
    own count is checked by ``Partition.check_classified``)."""
    out: set[int] = set()
    for item in _selection_items(spec, "expert selection"):
        if isinstance(item, str) and re.fullmatch(r"\d+\s*-\s*\d+", item.strip()):
            lo, hi = (int(x) for x in item.split("-"))
        elif isinstance(item, int) and not isinstance(item, bool) or \
                isinstance(item, str) and item.strip().isdigit():
            lo = hi = int(item)
        else:
            raise ConfigError(f"expert selection: cannot read {value_text(item)} (use e.g. '3', "
                              "'0-2, 5')")
        if lo > hi or hi >= MAX_EXPERTS or lo < 0:
            raise ConfigError(f"expert selection {item!r}: expert numbers run from 0 up, start "
                              f"before end, below {MAX_EXPERTS}")
        out.update(range(lo, hi + 1))
    return out


@dataclass(frozen=True)
class Rule:
    """Parameters in ``layers`` whose kind is in ``kinds`` (None: all) go to model ``to``.

    ``layers`` None (the rule has no 'layers' key): every layer and the non-layer parameters.
    With explicit layers, the non-layer parameters (embeddings, final norm, LM head) match only
    when ``non_layer`` is set ('non-layer' in the selection).
    So a rule addresses the non-layer parameters with ``layers: non-layer`` (all of them, or
    some with ``kinds: embed, final_norm, lm_head``) or with kinds alone (``kinds: embed``).
    ``experts`` (None: not a selection) keeps only the routed experts with those numbers in the
    checkpoint's names (``model.layers.5.mlp.experts.3.*``: expert 3 of layer 5).
    """
    layers: frozenset[int] | None
    kinds: frozenset[str] | None
    to: str = "lang"
    non_layer: bool = False
    experts: frozenset[int] | None = None

    def matches(self, layer: int | None, kind: str, expert: int | None = None) -> bool:
        if self.experts is not None and expert not in self.experts:
            return False
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
    def preset(cls, name: str, num_layers: int, scale: bool = False) -> Partition:
        """A published preset in absolute layers (ConfigError where it does not fit); ``scale``:
        the counts scaled with depth (the tool's own rule)."""
        key = str(name).upper()
        first, last = preset_layer_counts(key, num_layers, scale)
        rules = [{**r, "layers": r["layers"].format(first=first, last=last)} if "layers" in r
                 else r for r in PRESET_RULES[key]]
        return replace(cls.from_rules(rules, num_layers, name=key), scaled=scale)

    @classmethod
    def from_rules(cls, rules: Iterable[dict], num_layers: int, name: str = "custom") -> Partition:
        """Rules: mappings with 'layers' (see ``parse_layer_selection``; absent: every layer and
        the non-layer parameters), 'kinds' (``parse_kinds``), 'experts' (``parse_experts``) and
        'to' (task/lang/base, default lang)."""
        rules = _check_rules(rules)
        parsed = []
        for i, r in enumerate(rules):
            try:
                layers, non_layer = (None, False) if "layers" not in r else \
                    parse_layer_selection(r["layers"], num_layers)
                kinds = parse_kinds(r.get("kinds"))
                experts = None if r.get("experts") is None else parse_experts(r["experts"])
            except ConfigError as e:
                raise ConfigError(f"partition rule {i + 1}: {e}") from None
            parsed.append(Rule(None if layers is None else frozenset(layers),
                               None if kinds is None else frozenset(kinds), r.get("to", "lang"),
                               non_layer, None if experts is None else frozenset(experts)))
        return cls(tuple(parsed), num_layers, name)

    @classmethod
    def from_spec(cls, spec, num_layers: int, scale: bool = False) -> Partition:
        """A preset name ("A"/"B"/"C") or a list of rule mappings."""
        if isinstance(spec, str):
            return cls.preset(spec, num_layers, scale)
        if isinstance(spec, Partition):
            return spec
        return cls.from_rules(spec, num_layers)

    def rule_for(self, name: str, arch: Architecture) -> str | None:
        """The model the last matching rule names, or None when no rule matches."""
        info = arch.classify(name)
        expert = arch.expert(name) if self._by_expert else None
        out = None
        for rule in self.rules:
            if rule.matches(info.layer, info.kind, expert):
                out = rule.to
        return out

    @property
    def _by_expert(self) -> bool:
        return any(r.experts is not None for r in self.rules)

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

    def check_classified(self, names: list[str], arch: Architecture):
        """A rule that selects kinds cannot see a tensor of kind "other" (a name the
        architecture table does not know): rather than silently leaving it to the task expert,
        such a rule is refused, naming the tensors, when they are in the layers it covers."""
        other = [(n, arch.classify(n).layer) for n in arch.unclassified(names)]
        for i, rule in enumerate(self.rules):
            if rule.kinds is None or "other" in rule.kinds:
                continue
            hit = [n for n, layer in other if rule.layers is None or layer in rule.layers or
                   (layer is None and rule.non_layer)]
            if hit:
                more = f" and {len(hit) - 3} more" if len(hit) > 3 else ""
                raise ConfigError(
                    f"partition rule {i + 1}: selects kinds, but {len(hit)} tensor(s) of what it "
                    f"covers have no kind layerswap knows for a {arch.model_type!r} model "
                    f"({', '.join(hit[:3])}{more}); add 'other' to its kinds or select by "
                    "layers alone")
        if self._by_expert:
            self._check_experts(names, arch)

    def _check_experts(self, names: list[str], arch: Architecture):
        """A rule that names experts must find them: numbers below the model's experts per
        layer, and, in the layers it covers, experts stored one per tensor (a checkpoint that
        stores a layer's experts in one tensor, gpt-oss's, cannot give one of them)."""
        experts = {}   # layer -> {name: expert number or None} of the layer's routed experts
        for n in names:
            info = arch.classify(n)
            if info.kind == "moe_experts":
                experts.setdefault(info.layer, {})[n] = arch.expert(n)
        for i, rule in enumerate(self.rules):
            if rule.experts is None:
                continue
            where = f"partition rule {i + 1}: selects experts {_numbers(rule.experts)}"
            if not experts:
                raise ConfigError(f"{where}, but this {arch.model_type!r} model has no routed "
                                  "experts layerswap knows; select by layers and kinds")
            if rule.kinds is not None and "moe_experts" not in rule.kinds:
                raise ConfigError(f"{where}, but its kinds leave out moe_experts (the experts' "
                                  "kind): add it, or leave kinds out")
            if arch.experts and max(rule.experts) >= arch.experts:
                raise ConfigError(f"{where}, but this {arch.model_type!r} model has "
                                  f"{arch.experts} experts per layer (0..{arch.experts - 1})")
            if rule.layers is not None and not rule.layers & set(experts):
                raise ConfigError(f"{where}, but layers {_numbers(rule.layers)} of this "
                                  f"{arch.model_type!r} model have no routed experts (layers "
                                  f"{_numbers(experts)} have)")
            fused = [n for layer, got in experts.items()
                     if rule.layers is None or layer in rule.layers
                     for n, e in got.items() if e is None]
            if fused:
                raise ConfigError(f"{where}, but this {arch.model_type!r} checkpoint stores a "
                                  f"layer's experts in one tensor ({fused[0]}): a rule takes all "
                                  "of them (kinds: moe_experts) or none")

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


def _numbers(xs) -> str:
    xs = sorted(xs)
    return ", ".join(map(str, xs[:5])) + (f" and {len(xs) - 5} more" if len(xs) > 5 else "")


def _check_rules(rules) -> list[dict]:
    """The rule list's shape: a list of at most MAX_RULES mappings with known keys."""
    if not isinstance(rules, (list, tuple)):
        raise ConfigError(f"partition: must be a preset name ({', '.join(PRESET_LAYERS)}) or a "
                          f"list of rules, got {value_text(rules)}")
    if len(rules) > MAX_RULES:
        raise ConfigError(f"partition: {len(rules)} rules, more than the {MAX_RULES} allowed")
    for i, r in enumerate(rules):
        if not isinstance(r, dict):
            raise ConfigError(f"partition rule {i + 1}: expected a mapping with 'layers' and/or "
                              f"'kinds', got {value_text(r)}")
        unknown = set(r) - {"layers", "kinds", "experts", "to"}
        if unknown:
            raise ConfigError(f"partition rule {i + 1}: unknown key(s) {sorted(map(str, unknown))}")
        to = r.get("to", "lang")
        if to not in MODELS:
            raise ConfigError(f"partition rule {i + 1}: 'to' must be one of {MODELS}, got {to!r}")
    return list(rules)


def value_text(v) -> str:
    """A value and its type for error messages (YAML users see null / text)."""
    if v is None:
        return "null (no value)"
    if isinstance(v, str):
        return f"{v[:60]!r} (text)"
    text = repr(v)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(v).__name__})"


def check_partition_spec(name: str, v):
    """A ``MergeConfig.partition`` value's shape: None, a Partition, a preset name or rules."""
    if v is None or isinstance(v, Partition):
        return
    if isinstance(v, str):
        if v.upper() not in PRESET_LAYERS:
            raise ConfigError(f"unknown partition preset {v!r}; known: {', '.join(PRESET_LAYERS)}")
        return
    _check_rules(v)
