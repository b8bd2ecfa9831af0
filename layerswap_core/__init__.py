"""layerswap: compose LLM capabilities across languages by layer swapping.

The Python API mirrors the CLI; names are imported lazily so ``import layerswap_core`` stays cheap::

    from layerswap_core import MergeConfig, merge_to_folder, plan_for, delta_stats, suggest_config
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Plugins that register embedded models, as "module:function" (called once, when models first
# lists or resolves an embedded model): the demo experts are built with lora, merge and train,
# so models, below them, names them here instead of importing them.
EMBEDDED_PLUGINS = ("layerswap_core.experts:register",)

# public name -> module that defines it
_API = {
    # models and architectures
    "DEFAULT_BASE": "models", "ModelLoadError": "models", "resolve": "models",
    "load_model": "models", "load_tokenizer": "models", "describe": "models",
    "compatibility": "models", "get_architecture": "architectures", "classify": "architectures",
    # merge engine
    "MergeConfig": "plan", "Partition": "plan", "build_plan": "plan", "ConfigError": "plan",
    "merge_to_folder": "merge", "plan_for": "merge", "Recomposer": "merge", "MergeError": "merge",
    "merge_adapters": "lora",
    # analysis
    "delta_stats": "analysis", "suggest_config": "analysis",
    # evaluation
    "load_mgsm": "data", "load_items": "data", "gsm_symbolic_items": "data", "run_side_by_side": "evaluate",
    "generate": "generation", "chat": "generation",
    # experts
    "TrainConfig": "train", "DEMO_TASK": "experts", "DEMO_LANG": "experts",
}
__all__ = sorted(_API) + ["__version__"]


def __getattr__(name: str):
    if name in _API:
        value = getattr(importlib.import_module(f".{_API[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'layerswap_core' has no attribute {name!r}")
