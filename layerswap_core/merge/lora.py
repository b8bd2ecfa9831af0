"""LoRA experts in the merge engine: layer swapping of PEFT adapters over one base.

Each adapted linear module ``m`` of an expert carries ``dW = s * B @ A`` (A: r x in, B: out x r,
s = alpha / r, or alpha / sqrt(r) with rsLoRA). The merge plan (``plan.build_plan``) says, per
base weight ``m.weight``, where it comes from; for adapters that means:

    copy task / copy lang   the task / language adapter's A and B for m (none if it has none)
    copy base               no adapter for m (the base weight)
    blend (w_t, w_l)        ranks concatenated:  A = [A_t; A_l],  B = [c_t s_t B_t, c_l s_l B_l]
                            with c = w / (w_t + w_l), so B @ A = c_t dW_t + c_l dW_l exactly
    task arithmetic         the same concatenation with c = lambda_task, lambda_lang

The result is written either as a PEFT adapter folder (per-module ranks in ``rank_pattern``,
``alpha_pattern`` = rank so every scaling is 1 and the scales live in B) or as a dense model
(base + delta). Methods that are not linear in the deltas (TIES, magnitude weights) are refused.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import replace
from pathlib import Path

import torch

from ..checkpoints.adapters import (ADAPTER_CONFIG, ADAPTER_WEIGHTS, PEFT_PREFIX, AdapterError,
                                    LoraAdapter, LoraModule, load_adapter, write_dense)
from ..progress import Progress, say
from .methods import get_method as get_tensor_method
from .registry import concrete, linear_methods
from ..checkpoints.architectures import PROJECTION_KINDS, get_architecture
from ..checkpoints.reading import CheckpointReader
from ..checkpoints.references import resolve
from ..checkpoints.writing import atomic_output_dir
from .plan import build_plan

# --------------------------------------------------------------------------- combining
def _coefficients(source, config) -> dict[str, float]:
    """{model: coefficient of its delta} for one plan source (``methods.Method.coefficients``)."""
    coefficients = get_tensor_method(source.method).coefficients
    if source.method != "copy" and source.weights is None:
        raise AdapterError("magnitude-adjusted weights are not supported for LoRA experts")
    if coefficients is not None:
        return coefficients(source)
    raise AdapterError(f"merge method {config.method} is not linear in the deltas; LoRA experts "
                       f"support {', '.join(linear_methods())}")


def combine_adapters(config, adapters: dict[str, LoraAdapter], arch) -> dict[str, LoraModule]:
    """The merged adapter's modules (scale 1: the coefficients and scales are folded into B)."""
    if config.method not in linear_methods() or config.uses_magnitude:
        raise AdapterError(f"merge method {config.method}"
                           f"{' with magnitude weights' if config.uses_magnitude else ''} is not "
                           f"linear in the deltas; LoRA experts support {', '.join(linear_methods())}")
    modules = sorted(set().union(*(a.modules for a in adapters.values())))
    plan = build_plan(config, [m + ".weight" for m in modules], arch)
    out = {}
    for m in modules:
        A_parts, B_parts, kinds = [], [], set()
        for model, coef in _coefficients(plan.sources[m + ".weight"], config).items():
            lm = adapters[model].modules.get(m)
            if lm is None or coef == 0:
                continue
            A_parts.append(lm.A.float())
            B_parts.append(lm.B.float() * (coef * lm.scale))
            kinds.add((lm.embedding, lm.fan_in_fan_out))
        if len(kinds) > 1:
            raise AdapterError(f"{m}: the adapters store it differently (fan_in_fan_out)")
        if A_parts:
            out[m] = LoraModule(torch.cat(A_parts, 0), torch.cat(B_parts, 1), 1.0, *kinds.pop())
    return out


def _adapter_config(modules: dict[str, LoraModule], base_ref: str, template: dict) -> dict:
    ranks = {m: lm.rank for m, lm in modules.items()}
    r = max(ranks.values()) if ranks else 1
    return {
        "peft_type": "LORA", "task_type": template.get("task_type", "CAUSAL_LM"),
        "base_model_name_or_path": base_ref, "r": r, "lora_alpha": r, "use_rslora": False,
        "lora_dropout": 0.0, "bias": "none", "init_lora_weights": True,
        "fan_in_fan_out": bool(template.get("fan_in_fan_out", False)),
        "target_modules": sorted(modules), "modules_to_save": None,
        "rank_pattern": {re.escape(m): k for m, k in ranks.items() if k != r},
        "alpha_pattern": {re.escape(m): k for m, k in ranks.items() if k != r},
        "inference_mode": True, "layers_to_transform": None, "layers_pattern": None,
    }


def _peft_tensors(module: str, lm: LoraModule, dtype) -> dict:
    """A merged module's A and B under PEFT's keys (an embedding's without ".weight")."""
    a, b = ("lora_embedding_A", "lora_embedding_B") if lm.embedding else \
        ("lora_A.weight", "lora_B.weight")
    return {f"{PEFT_PREFIX}{module}.{a}": lm.A.to(dtype).contiguous(),
            f"{PEFT_PREFIX}{module}.{b}": lm.B.to(dtype).contiguous()}


def merge_adapters(config, task, lang, base, out, *, dense: bool = False, dtype=None,
                   overwrite: bool = False, force: bool = False,
                   progress: Progress | None = None) -> Path:
    """Layer-swap (or soup / task-arithmetic) two LoRA adapters over ``base`` into ``out``.

    ``dense=False``: a PEFT adapter folder (load with PeftModel.from_pretrained over the base).
    ``dense=True``: a full model folder, base + merged delta, in the base's dtype (or ``dtype``).
    """
    from safetensors.torch import save_file

    t0 = time.time()
    base_path = resolve(base)
    say(progress, 0.0, "reading the adapters")
    adapters = {"task": load_adapter(task, base_path), "lang": load_adapter(lang, base_path)}
    reader = CheckpointReader(base_path)
    arch = get_architecture(reader.config())
    config = replace(config, task=str(task), lang=str(lang), base=str(base))
    config.validate(arch.num_layers)
    config = concrete(config, arch.num_layers)
    merged = combine_adapters(config, adapters, arch)
    with atomic_output_dir(out, overwrite=overwrite, force=force,
                           inputs=[base_path, adapters["task"].path, adapters["lang"].path]) as tmp:
        if not dense:
            save_dtype = dtype or adapters["task"].modules[next(iter(adapters["task"].modules))].A.dtype
            tensors = {}
            for m, lm in merged.items():
                tensors.update(_peft_tensors(m, lm, save_dtype))
            save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
            acfg = _adapter_config(merged, str(base), adapters["task"].config)
            (tmp / ADAPTER_CONFIG).write_text(json.dumps(acfg, indent=2) + "\n")
        else:
            write_dense(reader, base_path, tmp, merged, dtype, "lora-merge", progress)
        (tmp / "layerswap.yaml").write_text(config.to_yaml())
    say(progress, 1.0, f"merged adapters into {out} in {time.time() - t0:.1f} s")
    return Path(out).expanduser().resolve()


def extract_adapter(base, tuned, out, *, rank: int = 16, dtype=torch.bfloat16,
                    overwrite: bool = False, force: bool = False,
                    progress: Progress | None = None) -> dict:
    """A fully fine-tuned model as a PEFT LoRA adapter over ``base``: each attention / MLP
    projection's change ``dW = W_tuned - W_base`` (float32) is cut to its best rank-``rank``
    approximation (truncated SVD, ``B = U_r sqrt(S_r)``, ``A = sqrt(S_r) V_r^T``, scaling 1).

    Other tensors (embeddings, norms) are not carried: the adapter changes projections only.
    Returns {"out", "modules", "kept"}: ``kept`` is the share of the projections' total
    squared change (Frobenius) the rank keeps, over all modules.
    """
    from safetensors.torch import save_file

    if int(rank) < 1:
        raise AdapterError(f"rank must be at least 1, got {rank}")
    base_path, tuned_path = resolve(base), resolve(tuned)
    b_reader, t_reader = CheckpointReader(base_path), CheckpointReader(tuned_path)
    arch = get_architecture(t_reader.config())
    names = [n for n in t_reader.names() if n.endswith(".weight")
             and arch.classify(n).kind in PROJECTION_KINDS and len(t_reader.shape(n)) == 2]
    if not names:
        raise AdapterError(f"{tuned}: no attention or MLP projection to extract")
    for n in names:
        if n not in b_reader or tuple(b_reader.shape(n)) != tuple(t_reader.shape(n)):
            raise AdapterError(f"{tuned} does not fit {base}: {n} differs in shape or is missing")
    modules, total, kept = {}, 0.0, 0.0
    for i, n in enumerate(names):
        delta = t_reader.read(n).float() - b_reader.read(n).float()
        U, S, Vh = torch.linalg.svd(delta, full_matrices=False)
        r = min(int(rank), S.numel())
        root = S[:r].sqrt()
        modules[n[:-len(".weight")]] = LoraModule(root[:, None] * Vh[:r], U[:, :r] * root, 1.0)
        total += float((S ** 2).sum())
        kept += float((S[:r] ** 2).sum())
        say(progress, 0.9 * (i + 1) / len(names), f"rank {r}: {n}")
    with atomic_output_dir(out, overwrite=overwrite, force=force,
                           inputs=[base_path, tuned_path]) as tmp:
        tensors = {}
        for m, lm in modules.items():
            tensors.update(_peft_tensors(m, lm, dtype))
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        acfg = _adapter_config(modules, str(base), {})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(acfg, indent=2) + "\n")
    share = kept / total if total else 1.0
    say(progress, 1.0, f"rank-{rank} adapter of {len(modules)} projections written to {out}: "
                       f"it keeps {share:.1%} of their squared change")
    return {"out": Path(out).expanduser().resolve(), "modules": len(modules), "kept": share}
