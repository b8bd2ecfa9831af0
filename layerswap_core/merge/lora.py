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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import torch

from ..checkpoints.references import ADAPTER_CONFIG, is_adapter, read_json_object  # noqa: F401  (lora.is_adapter: the same test)
from .registry import linear_methods

Progress = Callable[[float, str], None]
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."


class AdapterError(ValueError):
    """An adapter that cannot be used (missing files, other base, unsupported features)."""


def _say(progress: Progress | None, fraction: float, msg: str):
    if progress is not None:
        progress(fraction, msg)


def read_adapter_config(path) -> dict:
    """An adapter folder's adapter_config.json as a dict; AdapterError naming the file if it is
    missing or not a JSON object."""
    p = Path(str(path)).expanduser() / ADAPTER_CONFIG
    if not p.is_file():
        raise AdapterError(f"{p.parent}: no {ADAPTER_CONFIG} (not a PEFT adapter folder)")
    return read_json_object(p, AdapterError, "an adapter config")


@dataclass
class LoraModule:
    A: torch.Tensor        # r x in
    B: torch.Tensor        # out x r
    scale: float

    @property
    def rank(self) -> int:
        return self.A.shape[0]

    def delta(self) -> torch.Tensor:
        return self.scale * (self.B.float() @ self.A.float())


@dataclass
class LoraAdapter:
    path: Path
    config: dict
    modules: dict[str, LoraModule]        # base module name (e.g. model.layers.0.self_attn.q_proj)

    @property
    def base_ref(self) -> str | None:
        return self.config.get("base_model_name_or_path")


def _pattern_value(pattern: dict, module: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup (a key matches a module-name suffix)."""
    for key, value in (pattern or {}).items():
        if re.match(rf"(.*\.)?{key}$", module):
            return value
    return default


def load_adapter(path, base=None) -> LoraAdapter:
    """Read a PEFT LoRA adapter folder; with ``base`` (reference or folder), check it fits."""
    from safetensors.torch import load_file

    path = Path(str(path)).expanduser()
    cfg = read_adapter_config(path)
    if cfg.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{path}: a {cfg.get('peft_type')} adapter; only LoRA is supported")
    for feature in ("use_dora", "modules_to_save"):
        if cfg.get(feature):
            raise AdapterError(f"{path}: {feature} adapters are not supported (only plain LoRA)")
    weights = path / ADAPTER_WEIGHTS
    if not weights.exists():
        raise AdapterError(f"{path}: no {ADAPTER_WEIGHTS}")
    sd = load_file(str(weights))
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in sd.items():
        m = re.match(r"^(?:base_model\.model\.)?(.+)\.lora_([AB])(?:\.[^.]+)?\.weight$", name)
        if not m:
            raise AdapterError(f"{path}: tensor {name!r} is not a LoRA A/B matrix (embedding, bias "
                               "or saved-module adapters are not supported)")
        pairs.setdefault(m.group(1), {})[m.group(2)] = t
    modules = {}
    for mod, ab in pairs.items():
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"{path}: module {mod} has lora_{''.join(ab)} but not both A and B")
        r = ab["A"].shape[0]
        alpha = _pattern_value(cfg.get("alpha_pattern"), mod, cfg.get("lora_alpha", r))
        scale = alpha / (r ** 0.5) if cfg.get("use_rslora") else alpha / r
        modules[mod] = LoraModule(ab["A"], ab["B"], float(scale))
    adapter = LoraAdapter(path, cfg, modules)
    if base is not None:
        check_adapter_base(adapter, base)
    return adapter


def check_adapter_base(adapter: LoraAdapter, base) -> None:
    """Raise AdapterError unless every adapted module exists in ``base`` with matching shapes."""
    from ..checkpoints.reading import CheckpointReader
    from ..checkpoints.references import resolve

    reader = CheckpointReader(resolve(base))
    names = set(reader.names())
    for mod, lm in adapter.modules.items():
        w = mod + ".weight"
        if w not in names:
            raise AdapterError(f"adapter {adapter.path} was not made for base {base}: it adapts "
                               f"{mod}, which the base does not have (adapter base: "
                               f"{adapter.base_ref})")
        out_f, in_f = reader.shape(w)
        if lm.A.shape[1] != in_f or lm.B.shape[0] != out_f:
            raise AdapterError(f"adapter {adapter.path} was not made for base {base}: {mod} is "
                               f"{out_f}x{in_f} in the base but {lm.B.shape[0]}x{lm.A.shape[1]} in "
                               f"the adapter (adapter base: {adapter.base_ref})")


# --------------------------------------------------------------------------- combining
def _coefficients(source, config) -> dict[str, float]:
    """{model: coefficient of its delta} for one plan source."""
    if source.method == "copy":
        return {} if source.model == "base" else {source.model: 1.0}
    if source.method == "linear":
        if source.weights is None:
            raise AdapterError("magnitude-adjusted weights are not supported for LoRA experts")
        total = sum(source.weights)
        return {m: w / total for m, w in zip(source.models, source.weights)}
    if source.method == "task_arithmetic":
        return {m: w for m, w in zip(source.models[1:], source.weights)}
    raise AdapterError(f"merge method {config.method} is not linear in the deltas; LoRA experts "
                       f"support {', '.join(linear_methods())}")


def combine_adapters(config, adapters: dict[str, LoraAdapter], arch) -> dict[str, LoraModule]:
    """The merged adapter's modules (scale 1: the coefficients and scales are folded into B)."""
    from .plan import build_plan

    if config.method not in linear_methods() or config.uses_magnitude:
        raise AdapterError(f"merge method {config.method}"
                           f"{' with magnitude weights' if config.uses_magnitude else ''} is not "
                           f"linear in the deltas; LoRA experts support {', '.join(linear_methods())}")
    modules = sorted(set().union(*(a.modules for a in adapters.values())))
    plan = build_plan(config, [m + ".weight" for m in modules], arch)
    out = {}
    for m in modules:
        A_parts, B_parts = [], []
        for model, coef in _coefficients(plan.sources[m + ".weight"], config).items():
            lm = adapters[model].modules.get(m)
            if lm is None or coef == 0:
                continue
            A_parts.append(lm.A.float())
            B_parts.append(lm.B.float() * (coef * lm.scale))
        if A_parts:
            out[m] = LoraModule(torch.cat(A_parts, 0), torch.cat(B_parts, 1), 1.0)
    return out


def _adapter_config(modules: dict[str, LoraModule], base_ref: str, template: dict) -> dict:
    ranks = {m: lm.rank for m, lm in modules.items()}
    r = max(ranks.values()) if ranks else 1
    return {
        "peft_type": "LORA", "task_type": template.get("task_type", "CAUSAL_LM"),
        "base_model_name_or_path": base_ref, "r": r, "lora_alpha": r, "use_rslora": False,
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "init_lora_weights": True,
        "target_modules": sorted(modules), "modules_to_save": None,
        "rank_pattern": {re.escape(m): k for m, k in ranks.items() if k != r},
        "alpha_pattern": {re.escape(m): k for m, k in ranks.items() if k != r},
        "inference_mode": True, "layers_to_transform": None, "layers_pattern": None,
    }


def _write_dense(reader, base_path: Path, tmp: Path, modules: dict[str, LoraModule], dtype,
                 tag: str, progress: Progress | None) -> None:
    """Base + LoRA modules as a full model folder in ``tmp``, one tensor at a time: each adapted
    weight becomes ``W + (B @ A) * scale`` in float32 (as PEFT's merge_and_unload computes it),
    then ``dtype`` (None: the base's dtype). Config, tokenizer and generation config follow."""
    from ..checkpoints.reading import ST_TO_DTYPE
    from ..checkpoints.writing import ShardedWriter
    from ..checkpoints.tokenizers import TOKENIZER_FILES

    names = reader.names()
    writer = ShardedWriter(tmp, "2GB", metadata={"layerswap": tag})
    for n in names:
        writer.declare(n, reader.shape(n), dtype or ST_TO_DTYPE[reader.dtype(n)])
    try:
        for i, n in enumerate(names):
            t = reader.read(n)
            target = dtype or t.dtype
            lm = modules.get(n[:-len(".weight")]) if n.endswith(".weight") else None
            if lm is not None:
                t = t.float() + (lm.B.float() @ lm.A.float()) * lm.scale
            writer.write(n, t.to(target))
            _say(progress, 0.1 + 0.85 * (i + 1) / len(names), n)
        writer.finish()
    finally:
        writer.close()
    cfg = reader.config()
    if dtype is not None:
        cfg["dtype"] = str(dtype).replace("torch.", "")
        cfg.pop("torch_dtype", None)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in TOKENIZER_FILES + ("generation_config.json",):
        if (base_path / f).exists():
            (tmp / f).write_bytes((base_path / f).read_bytes())


def merge_adapters(config, task, lang, base, out, *, dense: bool = False, dtype=None,
                   overwrite: bool = False, force: bool = False,
                   progress: Progress | None = None) -> Path:
    """Layer-swap (or soup / task-arithmetic) two LoRA adapters over ``base`` into ``out``.

    ``dense=False``: a PEFT adapter folder (load with PeftModel.from_pretrained over the base).
    ``dense=True``: a full model folder, base + merged delta, in the base's dtype (or ``dtype``).
    """
    from safetensors.torch import save_file

    from ..checkpoints.architectures import get_architecture
    from ..checkpoints.reading import CheckpointReader
    from ..checkpoints.writing import atomic_output_dir
    from ..checkpoints.references import resolve

    t0 = time.time()
    base_path = resolve(base)
    _say(progress, 0.0, "reading the adapters")
    adapters = {"task": load_adapter(task, base_path), "lang": load_adapter(lang, base_path)}
    reader = CheckpointReader(base_path)
    arch = get_architecture(reader.config())
    config = replace(config, task=str(task), lang=str(lang), base=str(base))
    config.validate(arch.num_layers)
    if config.method == "layer_swap" and config.partition is None:
        b, u, _, _ = config.layer_counts(arch.num_layers)
        config = replace(config, bottom=b, top=u)
    merged = combine_adapters(config, adapters, arch)
    with atomic_output_dir(out, overwrite=overwrite, force=force,
                           inputs=[base_path, adapters["task"].path, adapters["lang"].path]) as tmp:
        if not dense:
            save_dtype = dtype or adapters["task"].modules[next(iter(adapters["task"].modules))].A.dtype
            tensors = {}
            for m, lm in merged.items():
                tensors[f"{PEFT_PREFIX}{m}.lora_A.weight"] = lm.A.to(save_dtype).contiguous()
                tensors[f"{PEFT_PREFIX}{m}.lora_B.weight"] = lm.B.to(save_dtype).contiguous()
            save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
            acfg = _adapter_config(merged, str(base), adapters["task"].config)
            (tmp / ADAPTER_CONFIG).write_text(json.dumps(acfg, indent=2) + "\n")
        else:
            _write_dense(reader, base_path, tmp, merged, dtype, "lora-merge", progress)
        (tmp / "layerswap.yaml").write_text(config.to_yaml())
    _say(progress, 1.0, f"merged adapters into {out} in {time.time() - t0:.1f} s")
    return Path(out).expanduser().resolve()


def apply_adapter(base, adapter, out, *, dtype=torch.bfloat16, progress=None) -> Path:
    """Write base + adapter as a full model folder in ``dtype``, one tensor at a time.

    Each adapted weight becomes ``W + (B @ A) * scale``, computed as PEFT's ``merge_and_unload``
    does over a float32 base (float32 throughout), then cast to ``dtype``; the result is
    bit-identical to PEFT's (tested) without building a model. ``out`` is replaced atomically.
    """
    from ..checkpoints.reading import CheckpointReader
    from ..checkpoints.writing import atomic_output_dir
    from ..checkpoints.references import resolve

    t0 = time.time()
    base_path = resolve(base)
    lora = load_adapter(adapter, base_path)
    _say(progress, 0.0, f"applying {adapter} to {base}")
    reader = CheckpointReader(base_path)
    with atomic_output_dir(out, overwrite=True, inputs=[base_path, lora.path]) as tmp:
        _write_dense(reader, base_path, tmp, lora.modules, dtype, "lora-apply", progress)
    _say(progress, 1.0, f"wrote {out} in {time.time() - t0:.1f} s")
    return Path(out).expanduser().resolve()
