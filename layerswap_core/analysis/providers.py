"""Delta providers: experts that are not dense checkpoints, seen as ``W_expert - W_base``.

A delta provider is any callable ``provider(name) -> torch.Tensor | None`` giving
``W_expert - W_base`` for the base parameter ``name`` (None: unchanged); ``delta_stats`` reads
it instead of an expert checkpoint. ``lora_delta_provider`` builds one from a PEFT LoRA adapter
folder (delta = B @ A * scale, the merged-adapter delta); a provider with an ``identity`` string
attribute is cached like a checkpoint.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import torch

from ..checkpoints.adapters import load_adapter


class DeltaProvider(Protocol):
    """``provider(name) -> W_expert - W_base`` for base parameter ``name``, or None if unchanged.

    Optional attribute ``identity: str``: a stable description of what the provider reads
    (e.g. adapter file path + size + mtime); providers that have one are cached on disk.
    The returned tensor must have the base tensor's shape (any float dtype, any device).
    """

    def __call__(self, name: str) -> torch.Tensor | None: ...


class LoraDeltaProvider:
    """Delta provider for a PEFT LoRA adapter folder, read by ``adapters.load_adapter`` (the one
    adapter reader, in checkpoints): the delta of base parameter ``<module>.weight`` is the module's
    ``scale * B @ A`` (transposed for embedding LoRA and fan_in_fan_out), as PEFT merges it.
    DoRA and saved modules are refused (their delta is not B @ A)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder).expanduser().resolve()
        self.adapter = load_adapter(self.folder)   # adapters are small (MBs): kept in memory
        self.config = self.adapter.config
        self.identity = json.dumps({"lora": str(self.folder),
                                    "files": [[f.name, f.stat().st_size, f.stat().st_mtime_ns]
                                              for f in self.adapter.files]})

    def names(self) -> list[str]:
        """Base parameter names this adapter changes."""
        return [m + ".weight" for m in self.adapter.modules]

    def __call__(self, name: str) -> torch.Tensor | None:
        module = self.adapter.modules.get(name.removesuffix(".weight"))
        return None if module is None or not name.endswith(".weight") else module.delta()


def lora_delta_provider(folder: str | Path) -> LoraDeltaProvider:
    return LoraDeltaProvider(folder)
