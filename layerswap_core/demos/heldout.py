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
from ..training import recipes as D
from ..training.sft_data import heldout_nll
from .trios import DEMO_BASE, DEMO_LANG, DEMO_TASK   # the Swahili trio's, which this measures

__all__ = ["DEMO_BASE", "DEMO_LANG", "DEMO_TASK", "DEMO_ROWS", "demo_nll_table", "heldout_sets",
           "table_markdown"]


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
