"""layerswap: compose LLM capabilities across languages by layer swapping.

The Python API mirrors the CLI; names are imported lazily so ``import layerswap_core`` stays cheap::

    from layerswap_core import MergeConfig, merge_to_folder, plan_for, delta_stats, suggest_config
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Plugins that register embedded models, as "module:function" (called once, when models first
# lists or resolves an embedded model): the demo experts are built with lora, merge and train,
# so checkpoints.references, below them, names them here instead of importing them.
EMBEDDED_PLUGINS = ("layerswap_core.training.demo_experts:register",)

# public name -> module that defines it
_API = {
    # models and architectures
    "DEFAULT_BASE": "checkpoints.references", "ModelLoadError": "checkpoints.references", "resolve": "checkpoints.references",
    "load_model": "checkpoints.loading", "load_tokenizer": "checkpoints.loading", "describe": "checkpoints.loading",
    "compatibility": "checkpoints.compatibility", "get_architecture": "checkpoints.architectures", "classify": "checkpoints.architectures",
    # merge engine
    "MergeConfig": "merge.config", "Partition": "merge.partition", "build_plan": "merge.plan", "ConfigError": "merge.partition",
    "merge_to_folder": "merge.executor", "plan_for": "merge.executor", "LiveModel": "merge.live", "MergeError": "merge.errors",
    "merge_adapters": "merge.lora",
    # analysis
    "delta_stats": "analysis.deltas", "suggest_config": "analysis.suggest",
    # evaluation
    "load_mgsm": "evaluation.data", "load_items": "evaluation.data", "gsm_symbolic_items": "evaluation.data", "run_side_by_side": "evaluation.runner",
    "generate": "evaluation.generation", "chat": "evaluation.generation",
    # experts
    "TrainConfig": "training.config", "DEMO_TASK": "training.demo_experts", "DEMO_LANG": "training.demo_experts",
}
__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(f".{_API[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'layerswap_core' has no attribute {name!r}")
