"""Cross-fitting: the demo's usable templates in two folds, so that every one is evaluated.

``demos.variants`` splits the usable templates (66) into two halves by a fixed rule (the
1st, 3rd, 5th, ... evaluated; the others trained on). That is fold 1, the shipped trio's.
Fold 2 swaps the halves: its experts train (the math expert's ``train`` variants, the
``validation`` variants that choose its checkpoint, the reading expert's statements and its
proxy) on the templates fold 1 evaluates, and it is evaluated on fold 1's training templates.
Each template is then evaluated by the trio that never saw it (issue #62).

A ``Fold`` answers what ``demos.variants`` answers for fold 1 (``split_templates``,
``proxy_templates``, ``language_templates``, ``variant_items``, ``training_numbers``) with the
same rules: the same seeds per template and split (``SPLIT_SEEDS[split] + template``), the same
counts, English-text disjointness against the fold's earlier splits of the template, and no
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
from ..evaluation.data import DataError, Item
from ..evaluation.languages import mgsm_lang, symbolic_lang
from ..training.config import train_command
from ..training.recipes import recipe, write_jsonl
from . import recipes  # noqa: F401  (registers the demo's recipes, looked up by name here)
from . import variants as V

FOLD2_FILE = Path(__file__).resolve().parent / "fold2_variants.json.gz"
FOLD2_LANGS = ("eng", "swh")      # the Swahili trio's languages: what fold 2's experts read


@dataclass(frozen=True)
class Fold:
    """One half of the cross-fitting (module docstring): ``number`` 1 evaluates the 1st, 3rd,
    5th, ... usable template (``demos.variants``' split), 2 the others."""
    number: int

    def split_templates(self, split: str) -> tuple[int, ...]:
        usable = V.templates()
        first = usable[0::2] if self.number == 1 else usable[1::2]
        second = usable[1::2] if self.number == 1 else usable[0::2]
        return first if split == "eval" else second

    def proxy_templates(self) -> tuple[int, ...]:
        """The reading proxy's templates: every fourth training template of the fold."""
        return self.split_templates("train")[::4]

    def unused_templates(self) -> tuple[int, ...]:
        return V.unused_templates()

    def language_templates(self) -> tuple[int, ...]:
        """Templates whose questions the fold's language expert may read: its training
        templates and the unused ones (never its evaluated ones)."""
        return tuple(sorted(self.split_templates("train") + V.unused_templates()))

    # ---------------------------------------------------------------- the fold's variants
    def _rows(self, lang: str, template: int, split: str) -> tuple[tuple[str, str, str], ...]:
        if self.number == 2:
            found = _fold2_file().get(V.row_key(lang, template, split))
            if found is not None:
                return found
        return V.drawn_rows(lang, template, split)

    def training_numbers(self) -> frozenset[tuple[str, ...]]:
        return _training_numbers(self)

    def paired(self, template: int, split: str) -> tuple[int, ...]:
        return _paired(self, template, split)

    def variant_items(self, lang: str, split: str = "eval",
                      templates_: tuple[int, ...] | None = None) -> list[Item]:
        """``demos.variants.variant_items`` for this fold: the same ids, text and order
        rules (an item's id names its split and template, so the folds' ids never meet: a
        template is evaluated in one fold and trained on in the other)."""
        language = V.variant_language(lang)
        code, short = symbolic_lang(lang), mgsm_lang(lang)
        if split not in V.SPLITS:
            raise DataError(f"split must be one of {', '.join(V.SPLITS)}, not {split!r}")
        own = self.split_templates(split)
        out = []
        for t in own if templates_ is None else [t for t in templates_ if t in own]:
            if not language.has(t):
                continue
            rows = self._rows(code, t, split)
            for k in self.paired(t, split):
                question, solution, gold = rows[k]
                out.append(Item(f"variant-{split}-{t:04d}-{k}", "gsm-symbolic-variants",
                                short, question, gold, solution, None))
        return out


@functools.cache
def _training_numbers(fold: Fold) -> frozenset[tuple[str, ...]]:
    """``demos.variants.training_numbers`` for the fold: the numbers of its ``train`` and
    ``validation`` variants and of the original statements of its language-data templates."""
    out = set()
    for split in ("train", "validation"):
        for t in fold.split_templates(split):
            rows = fold._rows("eng", t, split)
            out |= {V.number_key(rows[i][0]) for i in fold.paired(t, split)}
    out |= {V.number_key(V.original_question("eng", t)) for t in fold.language_templates()}
    return frozenset(out)


@functools.cache
def _paired(fold: Fold, template: int, split: str) -> tuple[int, ...]:
    """``demos.variants._paired`` for the fold: indices surviving disjointness by English
    text (the fold's earlier splits of the template, and within the split) and, for ``eval``,
    by numbers against the fold's training items."""
    seen = set()
    for s in V.SPLITS[:V.SPLITS.index(split)]:
        if template in fold.split_templates(s):
            earlier = fold._rows("eng", template, s)
            seen |= {earlier[i][0] for i in fold.paired(template, s)}
    banned = fold.training_numbers() if split == "eval" else frozenset()
    keep = []
    for i, (q, _, _) in enumerate(fold._rows("eng", template, split)):
        if q not in seen and V.number_key(q) not in banned:
            seen.add(q)
            keep.append(i)
    return tuple(keep)


FOLDS = {1: Fold(1), 2: Fold(2)}


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
    _paired.cache_clear()
    _training_numbers.cache_clear()
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
