"""Cross-fitting: the demo's usable templates in two folds, so that every one is evaluated.

``demos.variants`` splits the usable templates (66) into two halves by a fixed rule (the
1st, 3rd, 5th, ... evaluated; the others trained on). That is fold 1, the shipped trio's.
Fold 2 swaps the halves: its experts train (the math expert's ``train`` variants, the
``validation`` variants that choose its checkpoint, the reading expert's statements and its
proxy) on the templates fold 1 evaluates, and it is evaluated on fold 1's training templates.
Each template is then evaluated by the trio that never saw it (issue #62).

A ``Fold`` (``demos.variants.Fold``, where the rules live) answers what ``demos.variants``
answers for fold 1 (``split_templates``, ``proxy_templates``, ``language_templates``,
``variant_items``, ``training_numbers``) with the same rules: the same seeds per template and
split (``SPLIT_SEEDS[split] + template``), the same counts, English-text disjointness against the fold's earlier splits of the template, and no
evaluated variant with the numbers of an item its fold's experts train on or are chosen with.
``FOLDS[1]`` gives exactly ``demos.variants``' sets (a test holds them equal); the recipes
of ``demos.recipes`` take a fold (``fold=``), so fold 2's data is the same code on the other
half. Fold 2's variants are drawn by the package's engine (minutes) and kept in
``FOLD2_FILE`` (``write_fold_file``), read back when its stamp is the installed package's.
"""
from __future__ import annotations

import functools
import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from ..checkpoints.embedded import ASSETS
from ..training.config import train_command
from ..training.recipes import recipe, write_jsonl
from . import recipes  # noqa: F401  (registers the demo's recipes, looked up by name here)
from . import variants as V

FOLD2_FILE = Path(__file__).resolve().parent / "fold2_variants.json.gz"
FOLD2_LANGS = ("eng", "swh")      # the Swahili trio's languages: what fold 2's experts read


@dataclass(frozen=True)
class Fold(V.Fold):
    """One half of the cross-fitting (``demos.variants.Fold``, its rules), whose fold-2
    variants come from ``FOLD2_FILE`` when it is current (else they are drawn again)."""

    def rows(self, lang: str, template: int, split: str) -> tuple[tuple[str, str, str], ...]:
        if self.number == 2:
            found = _fold2_file().get(V.row_key(lang, template, split))
            if found is not None:
                return found
        return super().rows(lang, template, split)


FOLDS = {1: V.FOLD1, 2: Fold(2)}   # fold 1 is variants' own (one cache of its sets, not two)


# --------------------------------------------------------------------------- fold 2's file
def _fold2_jobs() -> list[tuple[str, str, int]]:
    fold = FOLDS[2]
    return [(lang, split, t) for lang in FOLD2_LANGS for split in V.SPLITS
            for t in fold.split_templates(split) if V.variant_language(lang).has(t)]


@functools.lru_cache(maxsize=1)
def _fold2_file() -> dict[str, tuple[tuple[str, str, str], ...]]:
    """Fold 2's drawn variants by ``demos.variants._key``, when the file was made with the
    installed package, these seeds and counts (``demos.variants._file_stamp``); else
    empty (then they are drawn again)."""
    if not FOLD2_FILE.is_file():
        return {}
    data = json.loads(gzip.decompress(FOLD2_FILE.read_bytes()))
    if data.get("stamp") != json.loads(json.dumps(V.file_stamp())):
        return {}
    return {k: tuple(tuple(r) for r in rows) for k, rows in data["rows"].items()}


def write_fold_file(path: str | Path = FOLD2_FILE, progress=None) -> Path:
    """Draw fold 2's variants (English and Swahili, every split) with the package's engine
    (minutes) and write them, gzipped JSON with a fixed timestamp, to ``path``."""
    rows = {}
    jobs = _fold2_jobs()
    for i, (lang, split, t) in enumerate(jobs):
        if progress and i % 10 == 0:
            progress(i / len(jobs), f"{lang} {split} template {t:04d}")
        rows[V.row_key(lang, t, split)] = V.draw(lang, t, split)
    path = V.write_rows_file(path, rows)
    _fold2_file.cache_clear()
    V.clear_fold_caches()
    return path


# --------------------------------------------------------------------------- the fold trainings
@dataclass(frozen=True)
class FoldTraining:
    """One expert to train for the cross-fitting: ``recipe`` (a recipe of ``demos.recipes``
    that takes a fold) on ``fold``'s halves, with the flags of the shipped expert ``like``
    (its ``training_log.json``: the same rank, layers, steps, rate, seed, checkpoints)."""
    name: str
    recipe: str
    fold: int
    like: str
    role: str

    def data(self, split: str) -> list[dict]:
        return recipe(self.recipe)(split, fold=FOLDS[self.fold])

    def config(self) -> dict:
        return json.loads((ASSETS / self.like / "training_log.json").read_text())["config"]

    def command(self, folder: str | Path) -> list[str]:
        """`layerswap train` for this expert, its data and output under ``folder``."""
        folder = Path(folder)
        return train_command(self.config(), data=str(folder / "train.jsonl"),
                             eval_data=str(folder / "eval.jsonl"), output=str(folder / "out"))

    def write_data(self, folder: str | Path) -> None:
        """``train.jsonl`` and ``eval.jsonl`` (the recipe's ``eval`` split: validation or
        proxy) under ``folder``; a file already there is kept (the recipes are deterministic)."""
        for split, name in (("train", "train.jsonl"), ("eval", "eval.jsonl")):
            path = Path(folder) / name
            if not path.is_file():
                tmp = write_jsonl(self.data(split), path.with_name(name + ".tmp"))
                tmp.replace(path)


# What the cross-fitting trains (issue #62), in the order a driver starts them: fold 2's math
# and Swahili experts (the recipes of fold 1's, the halves swapped), then the prose control
# (v2) for each fold, with the Swahili expert's flags (its seed-0 run: checkpoints every 4).
TRAININGS = (
    FoldTraining("fold2-math", "math-variants", 2, "smollm2-math-en", "task"),
    FoldTraining("fold2-swahili", "swahili-reading", 2, "smollm2-swahili", "lang"),
    FoldTraining("fold1-control-v2", "english-prose-control", 1, "smollm2-swahili", "control"),
    FoldTraining("fold2-control-v2", "english-prose-control", 2, "smollm2-swahili", "control"),
)
