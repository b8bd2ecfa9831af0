"""The demo trios: one record each (``DemoTrio``), registered once (``register_demo``).

A record holds everything that is particular to one demo trio: its models (the base and the
two experts as embedded references, more seeds of the language expert and a control expert
where it has them) and the recipes they were trained on, the variant set and splits it is
measured on, the shipped result file, the label of its button on the Models tab, the question
language (its name, chat examples and words come from the one table of languages,
``evaluation.languages``), the words the page shows while it is in use (Chat's and Evaluate's
notes, the Reproduce story) and the defaults the page sets when it is picked (the Evaluate and
Sweep languages).

The Models tab's buttons (``choices``), the page's notes and defaults (``for_refs``), Reproduce
and ``bench/demo_result.py --language`` read this registry; nothing below this room names a
demo model, a result file or a trio's words. A new trio is one ``register_demo`` row plus its
adapters under ``assets/experts/`` (rows of ``checkpoints.embedded`` without a line of code).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..checkpoints.embedded import ASSETS, EMBEDDED_PREFIX
from ..evaluation.languages import LANGUAGES, language_of


@dataclass(frozen=True)
class DemoTrio:
    """One demo trio (module docstring). ``key``: its id (the button's, ``--language``'s);
    ``language``: the code of its questions in ``evaluation.languages``; ``seeds``: more
    language experts, label -> reference; ``recipes``: role -> the ``demos.recipes`` recipe
    it was trained on; ``variants``/``split``/``validation``: the item source and the splits
    of the measure; ``result_file``: the shipped result under ``assets/experts/``; the prose
    is Markdown, ``reproduce_story``'s ``{result}`` the shipped result's headline. ``folds``:
    the cross-fitting's other trios (``demos.folds``), fold -> its ``task``, ``lang`` and
    ``result_file`` (fold 1 is the record's own models and result); ``crossfit_file``: the
    folds pooled by the declared rule (``demos.crossfit``)."""
    key: str
    label: str
    language: str
    base: str
    task: str
    lang: str
    seeds: dict[str, str] = field(default_factory=dict)
    control: str | None = None
    recipes: dict[str, str] = field(default_factory=dict)
    variants: str = "gsm-symbolic-variants"
    split: str = "eval"
    validation: str = "validation"
    result_file: str = ""
    chat_expectations: str = ""
    eval_note: str = ""
    reproduce_story: str = "{result}"
    folds: dict[int, dict[str, str]] = field(default_factory=dict)
    crossfit_file: str = ""
    eval_language: str | None = None     # the Evaluate tab's Language when picked (its language)
    sweep_language: str | None = None    # the Sweep tab's

    @property
    def refs(self) -> dict[str, str]:
        """base, task, lang: what the Models tab's dropdowns are set to."""
        return {"base": self.base, "task": self.task, "lang": self.lang}

    @property
    def language_name(self) -> str:
        return LANGUAGES[self.language].name

    @property
    def chat_language(self) -> str:
        """The language row the Chat tab's examples come from."""
        return self.language

    @property
    def result_path(self) -> Path:
        return ASSETS / self.result_file

    @property
    def defaults(self) -> dict[str, str]:
        """The page's controls set when the trio is picked: Evaluate's and Sweep's Language."""
        return {"eval_lang": self.eval_language or self.language,
                "sweep_lang": self.sweep_language or self.language}

    def experts(self) -> tuple[str, ...]:
        """Every expert reference of the trio (task, language, seeds, control)."""
        folds = [ref for f in self.folds.values() for ref in (f["task"], f["lang"])]
        return (self.task, self.lang, *self.seeds.values(), *((self.control,) if self.control
                                                               else ()), *folds)

    def fold_result_path(self, fold: int) -> Path:
        """The shipped result of fold ``fold`` (1: ``result_file``)."""
        return ASSETS / (self.result_file if fold == 1 else self.folds[fold]["result_file"])

    @property
    def crossfit_path(self) -> Path | None:
        return ASSETS / self.crossfit_file if self.crossfit_file else None


DEMOS: dict[str, DemoTrio] = {}   # every demo trio by key, in the page's order


def register_demo(trio: DemoTrio) -> DemoTrio:
    """Add (or replace) one demo trio; the Models tab's buttons list them in this order."""
    if trio.language not in LANGUAGES:
        raise ValueError(f"demo trio {trio.key!r}: no language {trio.language!r} in the table")
    DEMOS[trio.key] = trio
    return trio


def unregister_demo(key: str) -> None:
    DEMOS.pop(key, None)


def choices() -> dict[str, str]:
    """key -> button label, in the page's order: the Models tab's demo trio buttons."""
    return {key: trio.label for key, trio in DEMOS.items()}


def demo(key: str) -> DemoTrio:
    if key not in DEMOS:
        raise KeyError(f"no demo trio {key!r}; registered: {', '.join(DEMOS)}")
    return DEMOS[key]


def first() -> DemoTrio:
    """The page's first trio (preselected, and the words shown for models of no trio)."""
    return next(iter(DEMOS.values()))


def for_refs(refs: dict | None) -> DemoTrio:
    """The trio whose words and defaults the page shows for these models: the trio they are
    (its task and language experts), else the first trio in the language expert's language,
    else the first trio."""
    refs = refs or {}
    exact = next((t for t in DEMOS.values()
                  if (refs.get("task"), refs.get("lang")) == (t.task, t.lang)), None)
    if exact is not None:
        return exact
    code = language_of(refs.get("lang"), with_examples=False)
    return next((t for t in DEMOS.values() if t.language == code), first())


# --------------------------------------------------------------------------- the shipped trios
_E = EMBEDDED_PREFIX

register_demo(DemoTrio(
    key="sw", label="Swahili demo (SmolLM2-135M)", language="sw",
    base=_E + "smollm2-135m-instruct", task=_E + "smollm2-math-en", lang=_E + "smollm2-swahili",
    seeds={"seed 1": _E + "smollm2-swahili-seed1", "seed 2": _E + "smollm2-swahili-seed2"},
    recipes={"task": "math-variants", "lang": "swahili-reading"},
    result_file="demo_result.json",
    folds={2: {"task": _E + "smollm2-math-en-fold2", "lang": _E + "smollm2-swahili-fold2",
               "result_file": "demo_result_fold2.json"}},
    crossfit_file="demo_crossfit.json",
    chat_expectations=(
        "**What to expect.** The demo's math expert learned English worked solutions of a family "
        "of word problems (GSM-Symbolic templates), in its middle layers only; its language "
        "expert learned Swahili<->English question translations, Swahili words and numerals, in "
        "its outer layers only, no solutions. At 135M neither solves new problems reliably: "
        "expect the worked-solution format with `<<expr=result>>` notes the calculator fills "
        "in, and wrong answers more often than right ones. **Asked in Swahili, the demo models "
        "mostly repeat or translate the question.** Try a Swahili example, then the same "
        "problem in English (the second row of examples), and compare the merged model with an "
        "expert (Compare with)."),
    eval_note=(
        "**What to expect.** The embedded demo models have 135M parameters. MGSM, the standard "
        "benchmark, is beyond a model this size in any language: the demo's math expert solves "
        "0 of 33 English held-out variants, the base 2 of 33 (its card). The demo's measure is "
        "graded instead (*The demo result* below): how likely each model finds the English "
        "worked solution of a held-out problem after the Swahili question, against the same "
        "after another problem's question. The demo's math expert was trained on "
        "English variants of GSM-Symbolic templates (its card lists them); the GSM-Symbolic "
        "data here scores the original problems of templates 0050-0099, some of them among "
        "those (the note under the results names them after each run: not a clean test), while "
        "the demo result uses only templates it never saw. All demo models decode with the GSM8K calculator (the "
        "result of each `<<expr=` note is filled in). With your own 1B-8B experts, MGSM "
        "accuracy with its 95% interval is the number to watch."),
    reproduce_story=(
        "**What the demo shows at 135M.** {result} The chart: each statistic with its 95% "
        "interval, templates as the unit; the primary one first. Accuracy is not the measure at "
        "this scale (a 3-point gain needs about 1,000 paired items and a base that already "
        "reads the language): the paper's gain (+2.9 points in Swahili over the math expert) "
        "is a 7-8B result; run it on your own experts on a GPU (`docs/demo.md`, *Your own "
        "experts on a GPU*)."),
))

register_demo(DemoTrio(
    key="bn", label="Bengali demo (Gemma-3-270M)", language="bn",
    base=_E + "gemma3-270m", task=_E + "gemma3-math-en", lang=_E + "gemma3-bengali",
    recipes={"task": "math-variants", "lang": "bengali-reading"},
    result_file="demo_result_bn.json",
    chat_expectations=(
        "**What to expect.** The Bengali demo's math expert learned English worked solutions of "
        "a family of word problems (GSM-Symbolic templates), in the middle layers 3-16 of "
        "Gemma-3-270M only; its language expert learned Bengali<->English question "
        "translations, Bengali words (the `shobdo` dictionary) and numerals, in the outer "
        "layers 0-2 and 17 only, no solutions. Gemma-3-270M is a base model, not "
        "instruction-tuned, and at 270M neither expert solves new problems reliably: expect the "
        "worked-solution format with `<<expr=result>>` notes the calculator fills in, and wrong "
        "answers more often than right ones. Try a Bengali example, then the same problem in "
        "English (the second row of examples), and compare the merged model with an expert "
        "(Compare with). The Bengali question text is the package's machine translation "
        "(`docs/bengali.md`)."),
    eval_note=(
        "**What to expect.** The Bengali demo's models have 270M parameters (Gemma-3-270M, a "
        "base model). On MGSM, the standard benchmark, its problems are beyond a model this "
        "size in any language. The demo's measure is graded instead (*The demo result* below): "
        "how likely each model finds the English worked solution of a held-out problem after "
        "the Bengali question, with the mismatched-question control. The demo's math expert "
        "was trained on English variants of GSM-Symbolic templates (its card lists them); the "
        "GSM-Symbolic data here scores the original problems of templates 0050-0099, some of "
        "them among those (the note under the results names them after each run: not a clean "
        "test), while the demo result uses only templates it never saw. All demo models decode "
        "with the GSM8K calculator (the result of each `<<expr=` note is filled in). With your "
        "own 1B-8B experts, MGSM accuracy with its 95% interval is the number to watch."),
    reproduce_story=(
        "**What the Bengali demo shows at 270M.** {result} The chart: each statistic with its "
        "95% interval, templates as the unit; the primary one first. One language-expert seed "
        "and no control expert were trained for this trio (`docs/bengali.md`). Accuracy is not "
        "the measure at this scale: the paper's gains are 7-8B results; run it on your own "
        "experts on a GPU (`docs/demo.md`, *Your own experts on a GPU*)."),
))
del _E
# the page's first trio's models (the package's lazy API names DEMO_TASK and DEMO_LANG)
DEMO_BASE, DEMO_TASK, DEMO_LANG = first().base, first().task, first().lang
