"""The embedded demo experts over the embedded SmolLM2-135M-Instruct, shipped as PEFT LoRA adapters.

* ``embedded:smollm2-math-en``  -- math expert: a LoRA (rank 32) trained on English worked
                                   solutions of the ``train`` seed set of GSM-Symbolic variants
                                   (recipe ``math-variants``);
* ``embedded:smollm2-swahili``  -- Swahili language expert: a full fine-tune on FreeDict
                                   Swahili<->English word exercises and the Swahili statements of
                                   13 templates that are neither evaluated nor MGSM items (recipe
                                   ``swahili-clean``; no worked math), shipped as the rank-16
                                   adapter ``layerswap extract-lora`` extracted from it.

The adapters ship in ``assets/experts/<name>/`` (bf16, with a card giving the exact commands and
why each expert took its form). On first use each is applied to the embedded base
(``lora.apply_adapter``: streamed, bit-identical to PEFT's merge_and_unload) and cached as a bf16
safetensors model, so the rest of the product sees two ordinary model folders.
"""
from __future__ import annotations

import functools
from pathlib import Path

from ..checkpoints import references as models   # the model references (embedded models)
from ..checkpoints.loading import load_model

MATH_EXPERT = "smollm2-math-en"
SWAHILI_EXPERT = "smollm2-swahili"
DEMO_TASK = models.EMBEDDED_PREFIX + MATH_EXPERT      # the demo's task (math) expert
DEMO_LANG = models.EMBEDDED_PREFIX + SWAHILI_EXPERT   # the demo's language (Swahili) expert
DEMO_BASE = models.DEFAULT_BASE


def _assets() -> Path:
    """assets/experts of the checkout (source tree, editable install, Space), else the copy a
    wheel installs under <prefix>/share/layerswap/experts."""
    import sys

    here = Path(__file__).resolve().parents[2] / "assets" / "experts"
    installed = Path(sys.prefix) / "share" / "layerswap" / "experts"
    return here if here.is_dir() or not installed.is_dir() else installed


ASSETS = _assets()
DESCRIPTIONS = {
    MATH_EXPERT: "SmolLM2-135M-Instruct + math LoRA (English worked solutions of GSM-Symbolic "
                 "variants, train seeds)",
    SWAHILI_EXPERT: "SmolLM2-135M-Instruct, full SFT on Swahili dictionary exercises and non-"
                    "evaluated problem statements (no math), shipped as an extracted LoRA",
}


def demo_adapter_dir(name: str) -> Path:
    """Folder of a shipped adapter; ``name`` with or without the ``embedded:`` prefix."""
    name = name[len(models.EMBEDDED_PREFIX):] if name.startswith(models.EMBEDDED_PREFIX) else name
    if name not in DESCRIPTIONS:
        raise models.ModelLoadError(f"unknown demo expert {name!r}; known: {', '.join(DESCRIPTIONS)}")
    return ASSETS / name


def _builder(name: str):
    def build(out: Path, progress=None):
        from ..merge.lora import apply_adapter

        adapter = demo_adapter_dir(name)
        if not (adapter / "adapter_model.safetensors").exists():
            raise models.ModelLoadError(f"the demo expert's adapter is missing: {adapter} "
                                        "(reinstall layerswap from a full checkout)")
        if progress is not None:
            progress(0.0, f"Building {models.EMBEDDED_PREFIX}{name}: base + {adapter.name} adapter...")
        apply_adapter(DEMO_BASE, adapter, out)
        for extra in ("README.md",):
            if (adapter / extra).exists():
                (out / extra).write_text((adapter / extra).read_text())
    return build


def _adapter_version(name: str) -> str:
    """Cache version of a built expert: a hash of its shipped adapter and card (a new adapter or a
    corrected card, a new build)."""
    import hashlib
    f = ASSETS / name / "adapter_model.safetensors"
    if not f.exists():
        return "missing"
    card = ASSETS / name / "README.md"
    h = hashlib.sha1(f.read_bytes())
    if card.exists():
        h.update(card.read_bytes())
    return h.hexdigest()[:10]


def register() -> None:
    """Register both demo experts as embedded models (``layerswap_core.EMBEDDED_PLUGINS``)."""
    for name, description in DESCRIPTIONS.items():
        models.register_embedded(name, description, _builder(name),
                                 version=functools.partial(_adapter_version, name))


# --------------------------------------------------------------------------- held-out measurements
def heldout_sets(limit: int | None = None) -> dict[str, list[dict]]:
    """The held-out chat sets (never trained on): each expert's own validation split, and the
    Swahili validation variants with their worked solutions (math in Swahili, which neither
    expert saw)."""
    from . import recipes as D
    sets = {"math (eng validation variants)": D.math_variant_examples("eval"),
            "swahili (held-out dictionary split)": D.swahili_clean_examples("eval"),
            "swh validation variants": D.variant_rows("sw", "validation")}
    return {k: v[:limit] for k, v in sets.items()}


DEMO_ROWS = ("base", "math expert", "swahili expert", "layer swap", "uniform soup")


def demo_nll_table(limit: int | None = None, threads: int | None = 1, rows=DEMO_ROWS,
                   progress=None, on_row=None) -> dict[str, dict[str, float]]:
    """{model: {held-out set: mean response-token NLL}} for base, both experts, the layer-swapped
    merge (default layer counts) and the uniform soup (1:1), all in float32 on the CPU.
    ``rows``: a subset of DEMO_ROWS (e.g. to split the work over processes)."""
    import torch

    from ..merge.live import LiveModel
    from ..merge.config import MergeConfig
    from .sft_data import heldout_nll

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
