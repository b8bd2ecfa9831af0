"""Measuring the embedded demo experts over the embedded SmolLM2-135M-Instruct (held-out NLL).

The experts themselves are data rows of the embedded-model registry (``checkpoints.embedded``),
shipped as PEFT LoRA adapters:

* ``embedded:smollm2-math-en``  -- math expert: a LoRA (rank 32) on the middle layers 6-27 only
                                   (partial training, ``--mode partial_lora --partition C
                                   --train-part task``), trained on English worked solutions of
                                   the ``train`` seed set of the training templates' variants
                                   (recipe ``math-variants``);
* ``embedded:smollm2-swahili``  -- Swahili language expert: a LoRA (rank 64) on the outer layers
                                   0-5 and 28-29 only (``--train-part lang``: the complement),
                                   trained on Swahili<->English problem statements (never
                                   solutions) of non-evaluated templates, FreeDict exercises and
                                   Swahili numerals (recipe ``swahili-reading``), the checkpoint
                                   chosen by the reading proxy (Swahili -> English statements of
                                   held-out templates).

Partial training on complementary layers is the follow-up paper's method: the layer swap then
composes two changes that never overlap.
The adapters ship in ``assets/experts/<name>/`` (bf16, with a card giving the exact commands and
why each expert took its form). On first use each is applied to the embedded base
(``adapters.apply_adapter``: streamed, bit-identical to PEFT's merge_and_unload) and cached as a
bf16 safetensors model, so the rest of the product sees two ordinary model folders.
"""
from __future__ import annotations

from ..checkpoints.loading import load_model
from ..merge.config import MergeConfig
from ..merge.live import LiveModel
from ..training.sft_data import heldout_nll
from . import recipes as D
from .folds import FOLDS
from .measure import template_stats
from .trios import DEMO_BASE, DEMO_LANG, DEMO_TASK   # the Swahili trio's, which this measures

__all__ = ["DEMO_BASE", "DEMO_LANG", "DEMO_TASK", "DEMO_ROWS", "control_check", "demo_nll_table",
           "heldout_sets", "table_markdown"]


# --------------------------------------------------------------------------- held-out measurements
def heldout_sets(limit: int | None = None) -> dict[str, list[dict]]:
    """The held-out chat sets (never trained on, never evaluated): each expert's own validation
    split (the language expert's: its reading proxy), and the
    Swahili validation variants with their worked solutions (math in Swahili, which neither
    expert saw)."""
    sets = {"math (eng validation variants)": D.math_variant_examples("eval"),
            "swahili reading proxy (held-out templates)": D.reading_examples("eval"),
            "swh validation variants": D.variant_rows("sw", "validation")}
    return {k: v[:limit] for k, v in sets.items()}


DEMO_ROWS = ("base", "math expert", "swahili expert", "layer swap", "uniform soup")


def demo_nll_table(limit: int | None = None, threads: int | None = 1, rows=DEMO_ROWS,
                   progress=None, on_row=None) -> dict[str, dict[str, float]]:
    """{model: {held-out set: mean response-token NLL}} for base, both experts, the layer-swapped
    merge (default layer counts) and the uniform soup (1:1), all in float32 on the CPU.
    ``rows``: a subset of DEMO_ROWS (e.g. to split the work over processes)."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    sets = heldout_sets(limit)
    table: dict[str, dict[str, float]] = {}

    def measure(label, model, tok):
        table[label] = {}
        for name, items in sets.items():
            if progress is not None:
                progress(f"{label}: {name}")
            table[label][name] = heldout_nll(model, items, tokenizer=tok, max_length=512)
        if on_row is not None:  # long runs: hand each finished row out at once
            on_row(label, table[label])

    for label, ref in (("base", DEMO_BASE), ("math expert", DEMO_TASK), ("swahili expert", DEMO_LANG)):
        if label not in rows:
            continue
        model, tok = load_model(ref, device="cpu")
        measure(label, model, tok)
        del model
    if not {"layer swap", "uniform soup"} & set(rows):
        return table
    live = LiveModel.from_refs(DEMO_TASK, DEMO_LANG, device="cpu", dtype=torch.float32)
    num_layers = live.arch.num_layers
    swap = MergeConfig.default_for(num_layers)
    if "layer swap" in rows:
        live.show(swap)
        measure(f"layer swap ({swap.describe(num_layers)})", live.model, live.tokenizer)
    if "uniform soup" in rows:
        live.show(MergeConfig(method="soup", w_task=1.0, w_lang=1.0))
        measure("uniform soup (1:1)", live.model, live.tokenizer)
    return table


def table_markdown(table: dict[str, dict[str, float]]) -> str:
    cols = list(next(iter(table.values())))
    lines = ["| model | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for label, row in table.items():
        lines.append(f"| {label} | " + " | ".join(f"{row[c]:.3f}" for c in cols) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- the control's check
def control_check(control: str, *, task: str = DEMO_TASK, lang: str = DEMO_LANG, fold: int = 1,
                  limit: int | None = None, threads: int | None = 1, progress=None) -> dict:
    """Issue #62's criterion for an outer-layer control expert, before it is scaled to the
    language expert's norms: its outer layers, swapped into the math expert (the app's default
    swap), may raise the math expert's English held-out NLL (the English worked solutions of
    the fold's validation variants: never trained on, never evaluated) by no more than the
    language expert's outer layers do. Per item, the mean NLL per solution token of the math
    expert, the swap with ``lang`` and the swap with ``control``; the raises are compared with
    templates as the unit (``template_stats``). ``passes``: the control's mean raise is at most
    the language expert's."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    rows = D.math_variant_examples("eval", fold=FOLDS[fold])
    rows = sorted(rows, key=lambda r: r["source"])[:limit]
    templates = [int(r["source"].rsplit("-", 2)[-2]) for r in rows]

    def per_item(label, model, tok) -> list[float]:
        out = []
        for i, r in enumerate(rows):
            if progress is not None and i % 10 == 0:
                progress(f"{label}: item {i + 1}/{len(rows)}")
            out.append(heldout_nll(model, [r], tokenizer=tok, max_length=512))
        return out

    model, tok = load_model(task, device="cpu")
    nll = {"math expert": per_item("math expert", model, tok)}
    del model
    swap, layers = None, 0
    for label, outer in (("language expert's outer layers", lang),
                         ("control's outer layers", control)):
        live = LiveModel.from_refs(task, outer, device="cpu", dtype=torch.float32)
        layers = live.arch.num_layers
        swap = MergeConfig.default_for(layers)
        live.show(swap)
        nll[label] = per_item(label, live.model, live.tokenizer)
        del live
    math = nll["math expert"]
    raise_lang = [a - b for a, b in zip(nll["language expert's outer layers"], math)]
    raise_ctl = [a - b for a, b in zip(nll["control's outer layers"], math)]
    stats = {"language expert": template_stats(raise_lang, templates),
             "control": template_stats(raise_ctl, templates),
             "control minus language expert": template_stats(
                 [c - x for c, x in zip(raise_ctl, raise_lang)], templates)}
    return {"task": task, "lang": lang, "control": control, "fold": fold, "swap": swap.describe(layers), "n_items": len(rows), "nll": nll, "templates": templates,
            "raise": stats, "passes": stats["control"]["mean"] <= stats["language expert"]["mean"]}
