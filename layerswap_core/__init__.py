"""layerswap: compose LLM capabilities across languages by layer swapping.

The Python API mirrors the CLI; names are imported lazily so ``import layerswap_core`` stays cheap::

    from layerswap_core import MergeConfig, merge_to_folder, plan_for, delta_stats, suggest_config
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_API = {
    # models and architectures
    "DEFAULT_BASE": "checkpoints.embedded", "ModelLoadError": "checkpoints.reading", "resolve": "checkpoints.references",
    "load_model": "checkpoints.loading", "load_tokenizer": "checkpoints.loading", "describe": "checkpoints.loading",
    "compatibility": "checkpoints.compatibility", "get_architecture": "checkpoints.architectures", "classify": "checkpoints.architectures",
    # merge engine
    "MergeConfig": "merge.config", "Partition": "merge.partition", "build_plan": "merge.plan", "ConfigError": "merge.partition",
    "merge_to_folder": "merge.executor", "plan_for": "merge.executor", "LiveModel": "merge.live", "MergeError": "merge.errors",
    "merge_adapters": "merge.lora", "apply_adapter": "checkpoints.adapters", "load_adapter": "checkpoints.adapters",
    # analysis
    "delta_stats": "analysis.deltas", "suggest_config": "analysis.suggest",
    # inference
    "generate": "inference.generation", "chat": "inference.chat",
    # evaluation
    "load_mgsm": "evaluation.data", "load_items": "evaluation.registry", "gsm_symbolic_items": "evaluation.data", "run_side_by_side": "evaluation.runner",
    # experts
    "TrainConfig": "training.config", "DEMO_TASK": "demos.trios", "DEMO_LANG": "demos.trios",
}
__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(f".{_API[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'layerswap_core' has no attribute {name!r}")
