"""Merge configuration -> per-parameter source. Pure data: no tensors are read here.

A ``MergeConfig`` describes a merge (method, layer counts, weights, partition, dtype, models).
``build_plan`` turns it, with the parameter names and the architecture table, into a
``MergePlan``: for every parameter name, a ``Source`` saying which model(s) it comes from and
which per-tensor method (``methods.py``) combines them; each merge method of the registry
(``registry.py``) says how it builds them. The UI and CLI show the plan before
anything runs; the streaming executor and the live model both follow it (``apply.py``).

Layer swapping (Algorithm 1 of the layer-swapping paper), with L layers (0-indexed), b bottom,
u top, t_b / t_u transition:

    l < b                          language expert
    b <= l < b + t_b               blend
    b + t_b <= l < L - u - t_u     task expert
    L - u - t_u <= l < L - u       blend
    l >= L - u                     language expert
    non-layer parameters           blend (``non_layer="blend"``, the default), or the task /
                                   language expert (``non_layer="task"`` / ``"lang"``)

blend = (w_task * task + w_lang * lang) / (w_task + w_lang), in float32 (the magnitude-adjusted
weights instead of w_task/w_lang when ``magnitude_weights`` is on). Non-layer parameters are
everything outside the decoder layers (embeddings, final norm, LM head: the architecture table
knows which): they have no layer number, so Algorithm 1's "language" and "task" branches do not
apply and they fall to its averaging branch (the paper: they "work best if they are also averages
of the two experts"). A tied LM head is the embedding tensor, so it always follows the embeddings.
With a ``partition`` (presets A/B/C or custom rules) the non-layer parameters also follow
``non_layer`` unless a rule addresses them (``layers: non-layer``, or the kinds embed,
final_norm, lm_head).
The other methods (soups, task arithmetic, TIES) combine every tensor alike; ``non_layer`` does
not apply to them.
A multimodal wrapper's vision tower and projector (kind ``vision``: gemma3) are not the decoder:
every method keeps them from the task expert (the live model's own), and the plan says so.

"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from collections.abc import Iterable

from ..checkpoints.architectures import KIND_GROUPS, LAYER_KIND_ORDER, Architecture
from .config import MergeConfig
from .registry import Source, get_method

# what a plan says of a multimodal wrapper's vision tower and projector
VISION_TEXT = ("vision tower and projector: kept from the task expert (a multimodal wrapper: "
               "only its decoder is merged)")


@dataclass
class LayerRow:
    """One layer of a plan: its label (one source's label, or "mixed"), each module kind's label
    and each kind's ``Source``s (distinct, in order): the figures read the sources' own weights
    (``Source.shares``), never the labels."""
    layer: int
    label: str                          # one label, or "mixed"
    kinds: dict[str, str] = field(default_factory=dict)  # kind -> label
    sources: dict[str, tuple[Source, ...]] = field(default_factory=dict)  # kind -> its sources

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

    def _by_layer(self) -> dict[int, dict[str, dict[Source, None]]]:
        """layer -> kind -> its distinct sources (an ordered set)."""
        layers: dict[int, dict[str, dict[Source, None]]] = {l: {} for l in range(self.num_layers)}
        for name, src in self.sources.items():
            info = self.arch.classify(name)
            if info.layer is not None and info.layer in layers:
                layers[info.layer].setdefault(info.kind, {})[src] = None
        return layers

    def layer_rows(self) -> list[LayerRow]:
        rows = []
        for l, kinds in self._by_layer().items():
            order = sorted(kinds, key=lambda k: LAYER_KIND_ORDER.index(k)
                           if k in LAYER_KIND_ORDER else len(LAYER_KIND_ORDER))
            kind_labels = {}
            for k in order:
                labels = {s.label for s in kinds[k]}
                kind_labels[k] = labels.pop() if len(labels) == 1 else "mixed"
            labels = set(kind_labels.values())
            rows.append(LayerRow(l, labels.pop() if len(labels) == 1 else "mixed", kind_labels,
                                 {k: tuple(kinds[k]) for k in order}))
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
        return {n: s.label for n, s in self.non_layer_sources().items()}

    def non_layer_sources(self) -> dict[str, Source]:
        """Non-layer parameter name -> its ``Source`` (the layer diagram's non-layer bar)."""
        return {n: s for n, s in self.sources.items() if self.arch.classify(n).layer is None}

    @property
    def tied_head(self) -> bool:
        """Whether the LM head is the embedding tensor (the names have embeddings, no head)."""
        kinds = {self.arch.classify(n).kind for n in self.global_sources()}
        return "embed" in kinds and "lm_head" not in kinds

    def non_layer_text(self) -> str:
        """Where the non-layer parameters come from, in words (layer swaps)."""
        how = {"blend": "averaged as in Algorithm 1", "task": "from the task expert",
               "lang": "from the language expert"}[self.config.non_layer]
        tied = "; the LM head is tied to the embeddings" if self.tied_head else ""
        return (f"non-layer parameters (embeddings, final norm, LM head): {how} "
                f"(non_layer: {self.config.non_layer}){tied}")

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
        vision = 0
        for n, lab in self.global_sources().items():
            if self.arch.classify(n).kind == "vision":
                vision += 1
                continue
            glob.setdefault(lab, []).append(n.removesuffix(".weight"))
        if "non_layer" in get_method(cfg.method).knobs and glob:
            lines.append(self.non_layer_text())
        for lab, names in glob.items():
            lines.append(f"{'non-layer':<9} {lab}: {', '.join(names)}")
        if vision:
            lines.append(f"{'non-layer':<9} {VISION_TEXT} ({vision} tensors)")
        c = self.counts()
        lines.append("tensors: " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
        return "\n".join(lines)

    def changed_names(self, other: MergePlan | None) -> list[str]:
        """Names whose source differs from ``other`` (all names when other is None)."""
        if other is None:
            return list(self.sources)
        return [n for n, s in self.sources.items() if other.sources.get(n) != s]

    def with_magnitude(self, magnitude: tuple[float, float]) -> MergePlan:
        return MergePlan(self.config, self.arch,
                         {n: s.resolved(magnitude) for n, s in self.sources.items()},
                         tuple(magnitude))



def build_plan(config: MergeConfig, param_names: Iterable[str], arch: Architecture,
               magnitude: tuple[float, float] | None = None) -> MergePlan:
    """The source of every parameter (the method's ``sources`` in ``registry.py``).
    ``magnitude``: magnitude-adjusted (w_task, w_lang) if known; without it, blends that need
    them carry weights=None (shown, not executable)."""
    config.validate(arch.num_layers)
    blend_w = magnitude if config.uses_magnitude else (config.w_task, config.w_lang)
    blend = Source("linear", ("task", "lang"), None if blend_w is None else tuple(map(float, blend_w)))
    names = list(param_names)
    sources = get_method(config.method).sources(config, names, arch, blend)
    keep = Source.copy("task")
    for n in arch.vision(names):   # a multimodal wrapper: only the decoder is merged
        sources[n] = keep
    return MergePlan(config, arch, sources,
                     tuple(magnitude) if magnitude is not None and config.uses_magnitude else None)
