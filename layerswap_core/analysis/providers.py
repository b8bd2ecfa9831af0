"""Delta providers: experts that are not dense checkpoints, seen as ``W_expert - W_base``.

A delta provider is any callable ``provider(name) -> torch.Tensor | None`` giving
``W_expert - W_base`` for the base parameter ``name`` (None: unchanged); ``delta_stats`` reads
it instead of an expert checkpoint. ``lora_delta_provider`` builds one from a PEFT LoRA adapter
folder (delta = B @ A * scale, the merged-adapter delta); a provider with an ``identity`` string
attribute is cached like a checkpoint.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Protocol

import torch

from ..merge.lora import read_adapter_config


class DeltaProvider(Protocol):
    """``provider(name) -> W_expert - W_base`` for base parameter ``name``, or None if unchanged.

    Optional attribute ``identity: str``: a stable description of what the provider reads
    (e.g. adapter file path + size + mtime); providers that have one are cached on disk.
    The returned tensor must have the base tensor's shape (any float dtype, any device).
    """

    def __call__(self, name: str) -> torch.Tensor | None: ...


class LoraDeltaProvider:
    """Delta provider for a PEFT LoRA adapter folder: delta = B @ A * scale per target module.

    Keys ``base_model.model.<module>.lora_A.weight`` map to the base parameter
    ``<module>.weight``; scale = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora), with
    per-module ``rank_pattern``/``alpha_pattern`` as PEFT resolves them. Embedding LoRA
    (lora_embedding_A/B) is supported; DoRA is not (its delta is not B @ A).
    """

    def __init__(self, folder: str | Path):
        from safetensors.torch import load_file

        self.folder = Path(folder).expanduser().resolve()
        cfg_path = self.folder / "adapter_config.json"
        cfg = read_adapter_config(self.folder)
        if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
            raise ValueError(f"{cfg_path}: peft_type {cfg.get('peft_type')!r} is not LORA")
        if cfg.get("use_dora"):
            raise ValueError(f"{cfg_path}: DoRA adapters are not supported (delta is not B @ A)")
        weights = self.folder / "adapter_model.safetensors"
        if not weights.exists():
            raise ValueError(f"{self.folder}: no adapter_model.safetensors")
        self.config = cfg
        self.fan_in_fan_out = bool(cfg.get("fan_in_fan_out"))
        self._tensors = load_file(str(weights))  # adapters are small (MBs): keep them in memory
        self._modules: dict[str, tuple[str, str, bool]] = {}  # base name -> (A key, B key, embedding)
        rx = re.compile(r"^(?:base_model\.model\.)?(.*)\.(lora_A|lora_embedding_A)"
                        r"(?:\.[^.]+)?(?:\.weight)?$")
        for key in self._tensors:
            m = rx.match(key)
            if not m:
                continue
            module, which = m.group(1), m.group(2)
            b_key = key.replace(".lora_A", ".lora_B").replace(".lora_embedding_A", ".lora_embedding_B")
            if b_key not in self._tensors:
                raise ValueError(f"{weights}: {key} has no matching {b_key}")
            self._modules[module + ".weight"] = (key, b_key, which == "lora_embedding_A")
        self.identity = json.dumps({"lora": str(self.folder),
                                    "files": [[f.name, f.stat().st_size, f.stat().st_mtime_ns]
                                              for f in (cfg_path, weights)]})

    def names(self) -> list[str]:
        """Base parameter names this adapter changes."""
        return list(self._modules)

    def _scale(self, module: str, r: int) -> float:
        def pattern(d: dict, default):
            for k, v in (d or {}).items():
                if re.match(rf"(.*\.)?({k})$", module):
                    return v
            return default
        alpha = pattern(self.config.get("alpha_pattern"), self.config.get("lora_alpha", 8))
        return alpha / math.sqrt(r) if self.config.get("use_rslora") else alpha / r

    def __call__(self, name: str) -> torch.Tensor | None:
        entry = self._modules.get(name)
        if entry is None:
            return None
        a_key, b_key, embedding = entry
        A, B = self._tensors[a_key].float(), self._tensors[b_key].float()
        delta = B @ A * self._scale(name[: -len(".weight")], A.shape[0])
        if embedding:
            delta = delta.T  # lora_embedding_A: (r, vocab), B: (dim, r) -> (vocab, dim)
        elif self.fan_in_fan_out:
            delta = delta.T
        return delta


def lora_delta_provider(folder: str | Path) -> LoraDeltaProvider:
    return LoraDeltaProvider(folder)
