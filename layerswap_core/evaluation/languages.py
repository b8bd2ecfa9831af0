"""The one table of languages: code -> ``Language`` (name, script, the GSM-Symbolic package's
code, whether MGSM has it, the words of a model reference that name it, the Chat tab's
examples, and how the demo's held-out variants are drawn in it: ``Variants``). The data
loaders, the evaluation's language choices, the app's dropdowns (``choices``), the Chat tab
and the demo's variant sets read it; a new language is one ``register_language`` row.

Codes are MGSM's two-letter ones (``sw``); the package's ISO 639-3 codes (``swh``) are accepted
too (``mgsm_lang`` / ``symbolic_lang``).
"""
from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Variants:
    """How the demo's held-out variants (``demos.variants``) are drawn in a language:
    ``templates``: the demo templates it has (None: all); ``template(t)``: the package's
    ``AnnotatedQuestion`` to run (None: the package's TOML as it is), with ``replacements()``
    as its named lists (None: the package's); ``fingerprint()``: what its shipped rows depend
    on besides the package (None: nothing)."""
    templates: frozenset[int] | None = None
    template: Callable[[int], object] | None = None
    replacements: Callable[[], dict] | None = None
    fingerprint: Callable[[], str] | None = None

    def has(self, template: int) -> bool:
        return self.templates is None or template in self.templates


@dataclass(frozen=True)
class Language:
    """``words``: lower-case words of a model reference that name the language
    (``my-swahili-lora``, ``bn-lora``; the Chat tab's ``language_of``);
    ``chat_examples``: short problems the Chat tab offers with a language expert in this
    language; ``english_twins``: the same problems in English, item by item (may be empty)."""
    code: str
    name: str
    script: str
    symbolic: str = ""            # the GSM-Symbolic package's code ("swh"); "" if it has none
    mgsm: bool = False            # one of MGSM's languages
    words: frozenset[str] = frozenset()
    chat_examples: tuple[str, ...] = ()
    english_twins: tuple[str, ...] = ()
    variants: Variants | None = None


LANGUAGES: dict[str, Language] = {}


def register_language(language: Language) -> Language:
    """Add (or replace) one row of the table; the app's choices list it in this order."""
    LANGUAGES[language.code] = language
    return language


def choices() -> list[str]:
    """The language codes the app's Evaluate and Sweep dropdowns offer, in the table's order."""
    return list(LANGUAGES)


def mgsm_lang(lang: str) -> str:
    """Two-letter MGSM code for ``lang`` (either form); unknown codes are returned as given."""
    lang = lang.strip().lower()
    return next((code for code, row in LANGUAGES.items() if row.symbolic == lang), lang)


def symbolic_lang(lang: str) -> str:
    """The GSM-Symbolic package's code for ``lang`` (either form); unknown codes as given."""
    lang = lang.strip().lower()
    row = LANGUAGES.get(lang)
    return row.symbolic if row is not None and row.symbolic else lang


def did_you_mean(lang: str, codes) -> str | None:
    """The code among ``codes`` that ``lang`` most likely meant: a language named in English
    ("swahili" -> "sw"), a code in the other form, or a near spelling; None when none is close."""
    q = str(lang).strip().lower()
    codes = list(codes)
    names = {row.name.lower(): code for code, row in LANGUAGES.items()}
    named = next((code for code, row in LANGUAGES.items()
                  if q in (row.name.lower(), row.symbolic) or q in row.words), None)
    near_name = difflib.get_close_matches(q, names, n=1, cutoff=0.75) if len(q) > 3 else []
    for guess in (named, names[near_name[0]] if near_name else None):
        if guess is not None and guess in codes:
            return guess
    close = difflib.get_close_matches(q, codes, n=1, cutoff=0.6)
    return close[0] if close else None


def language_of(ref: str | None, *, with_examples: bool = True) -> str | None:
    """The language a model reference names by one of its words (``words``), or None; with
    ``with_examples`` only languages that have chat examples."""
    words = set(re.split(r"[^a-z0-9]+", str(ref or "").lower()))
    return next((code for code, row in LANGUAGES.items()
                 if words & row.words and (row.chat_examples or not with_examples)), None)


# Chat examples: short problems like the evaluated ones; a language's show only when the language
# expert is in that language. Swahili: held-out *validation* variants of the demo's templates
# (demos.variants; never the eval set), the kind of problem the demo is measured on, and
# their English versions (the math expert's language; the numbers are paired item by item, the
# names are the English template's): the control a visitor can compare with. Bengali: the same
# validation variants in Bengali (``demos.bengali``) and their English twins. English and
# Swahili have every demo template's variants; Bengali's ``Variants`` are ``demos.bengali``'s
# (its fill-ins and fixes), set there.
for _row in (
    Language("sw", "Swahili", "Latin", "swh", True,
             frozenset({"sw", "swa", "swh", "swahili", "kiswahili"}),
             ("Chupa cha limoni ni 7 oz za limoni. Baraka ananywa 4 michupa za limoni. Ikiwa "
              "limoni ina 5 kalori kwa kila oz, alikula kalori ngapi?",
              "Faraji ana miaka 22. Baada ya saba miaka, dada yake Sarah atakuwa na umri mara "
              "tano kama Faraji sasa. Sarah ana umri gani sasa?",
              "Keki ina 72 huduma. Ikiwa Asha anaweza kula 3 huduma kwa siku huku Nyota anaweza "
              "kula mara tatu kama hiyo, siku ngapi keki itadumu?"),
             ("A bottle of lemonade is 7 ozs of lemonade. Chris drinks 4 bottles of lemonade. If "
              "lemonade has 5 calories per oz how many calories did he consume?",
              "Bob is 22 years old. In seven years his sister Sarah will be five times as old as "
              "Bob is now. How old is Sarah right now?",
              "A cake has 72 servings. If Ashley can eat 3 servings a day while Lily can eat "
              "thrice as much, how many days will the cake last?"), Variants()),
    Language("bn", "Bengali", "Bengali", "ben", True,
             frozenset({"bn", "ben", "bengali", "bangla"}),
             ("হাসান প্রতিদিন 64 ইমেইল পান। সেই ইমেইলগুলোর 25% এর কোনো উত্তর দেওয়ার প্রয়োজন "
              "নেই। তিনি বাকিগুলোর উত্তর দেন। 4 দিনের কাজের সপ্তাহে হাসান কতগুলি ইমেইলের উত্তর "
              "দেন?",
              "তমাল 22 বছর বয়সী। সাত বছর পর তার বোন দিলরুবা তমাল এর বর্তমান বয়সের পাঁচবার গুণ "
              "হবে। দিলরুবা এর বর্তমানে বয়স কত?",
              "একটি কেক আছে 72 সার্ভিং। যদি শারমিন প্রতিদিন 3 সার্ভিং খেতে পারে এবং মৌমিতা তিনবার "
              "বেশি খেতে পারে, তবে কেক কতদিন চলবে?"),
             ("Matt receives 64 emails a day. 25% of those emails don't require any response. He "
              "responds to the rest of them. How many emails does Matt respond to in a 4 day "
              "work week?",
              "Bob is 22 years old. In seven years his sister Sarah will be five times as old as "
              "Bob is now. How old is Sarah right now?",
              "A cake has 72 servings. If Ashley can eat 3 servings a day while Lily can eat "
              "thrice as much, how many days will the cake last?")),
    Language("te", "Telugu", "Telugu", "tel", True),
    Language("th", "Thai", "Thai", "tha", True),
    Language("ja", "Japanese", "Japanese", "jpn", True),
    Language("zh", "Chinese", "Han", "zho", True),
    Language("ru", "Russian", "Cyrillic", "rus", True),
    Language("fr", "French", "Latin", "fra", True),
    Language("de", "German", "Latin", "deu", True),
    Language("es", "Spanish", "Latin", "spa", True),
    Language("en", "English", "Latin", "eng", True, variants=Variants()),
):
    register_language(_row)
del _row
