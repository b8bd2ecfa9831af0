"""Every evaluation task registered once: ``TASKS = {id: TaskSpec}``, read by the runner, the
engines' jobs, the sweeps, the CLI (``--data`` choices) and the app (``source_choices``).

A ``TaskSpec`` says where a task's items come from (``load``: a language's items; ``langs``:
the languages it has), how few-shot exemplars are chosen (``exemplars``), how an item becomes a
prompt and an output an answer, and the metric (``task``: a builder of the ``tasks.Task``
record; None: lm-eval's MGSM prompts, filters and exact match, ``runner.side_by_side_task``),
and what the pages say about it. Nothing else branches on a task's name: a new task is one
``register_task`` row (the CLI's ``layerswap eval`` and ``layerswap sweep``, the Evaluate tab's
job and the sweeps pick it up).

The exemplar rules live here as data-level functions (no torch): MGSM's own exemplars in order
(``standard_exemplars``), or candidates chosen apart from the scored items (``exemplar_pool``,
``select_exemplars``); ``runner`` imports them under the same names.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .data import (DataError, Item, card_templates, find_mgsm_dir, gsm_symbolic_items, load_mgsm,
                   load_mgsm_exemplars, load_mgsm_exemplars_hub, load_mgsm_hub, mgsm_lang,
                   mgsm_overlap, symbolic_language_names)
from .languages import LANGUAGES
from .mgsm_hub import LICENCE

PLACES = ("eval", "sweep")   # the CLI's `eval` and the Evaluate tab; the sweeps


@dataclass(frozen=True)
class TaskSpec:
    """One evaluation task (module docstring).

    ``load(lang, *, data_dir, hub)``: every evaluation item of ``lang``, in order;
    ``langs()``: the language codes it has; ``exemplars(items, shots, *, cot, data_dir, hub)``:
    the default few-shot exemplars (``shots`` >= 1); ``task(items, exemplars, *, cot,
    chat_template, max_new_tokens, with_nll)``: its ``tasks.Task`` record (prompt, answer
    extraction, metric, decoding); None: lm-eval's MGSM record (``runner.side_by_side_task``).
    ``item_source``: the ``Item.source`` of its items (default: ``id``); ``offered``: where it
    is a choice (``PLACES``); ``direct_pool(lang, data_dir)``: more exemplar candidates for
    direct prompts; ``pool_words``: exemplars drawn from its items, in words;
    ``templates(item)``: the GSM-Symbolic templates an item scores ({number: label}) and
    ``template_items``: its items are those templates' own problems; ``lm_eval``: lm-eval has
    the task (``layerswap eval --lm-eval``); ``prepare(say)``: before its first use on a page
    (e.g. a download, reported through ``say(message)``); ``note``: what the page adds under its
    results."""
    id: str
    label: str
    load: Callable[..., list[Item]]
    langs: Callable[[], Sequence[str]]
    exemplars: Callable[..., list[Item]]
    task: Callable | None = None
    item_source: str = ""
    aliases: tuple[str, ...] = ()
    offered: tuple[str, ...] = PLACES
    direct_pool: Callable[..., list[Item]] | None = None
    pool_words: str = ""
    templates: Callable[[Item], dict[int, str]] | None = None
    template_items: bool = False
    lm_eval: bool = False
    prepare: Callable[[Callable[[str], None]], object] | None = None
    note: str = ""

    @property
    def source(self) -> str:
        return self.item_source or self.id


TASKS: dict[str, TaskSpec] = {}


def register_task(spec: TaskSpec) -> TaskSpec:
    """Add (or replace) a task; choices list tasks in registration order."""
    TASKS[spec.id] = spec
    return spec


def task_spec(source: str) -> TaskSpec:
    """The task of an id (or alias, any case); an unknown one is a one-line ``ValueError``."""
    key = source.lower()
    spec = TASKS.get(key) or next((s for s in TASKS.values() if key in s.aliases), None)
    if spec is None:
        raise ValueError(f"unknown data source {source!r}; use one of {', '.join(TASKS)}")
    return spec


def task_of(items: Sequence[Item]) -> TaskSpec | None:
    """The task whose items these are (by the first item's ``source``), or None."""
    source = items[0].source if items else None
    return next((s for s in TASKS.values() if s.source == source), None)


def choices(where: str = "eval") -> list[str]:
    """The task ids offered in ``where`` (``PLACES``), in registration order."""
    return [i for i, s in TASKS.items() if where in s.offered]


def source_choices(where: str = "eval", first: str | None = None) -> list[tuple[str, str]]:
    """(label, id) of the tasks offered in ``where``: the app's Data radios; ``first``: the id
    to list first (the Sweep tab's default)."""
    ids = choices(where)
    if first in ids:
        ids = [first] + [i for i in ids if i != first]
    return [(TASKS[i].label, i) for i in ids]


def source_label(source: str) -> str:
    """A task id's display label ("mgsm" -> "MGSM"); anything else as given."""
    spec = TASKS.get(source.lower().replace("_", "-"))
    return spec.label if spec else source


def by_label(label: str) -> TaskSpec | None:
    return next((s for s in TASKS.values() if s.label == label), None)


def load_items(source: str, lang: str, n: int | None = None, *,
               data_dir: str | os.PathLike | None = None, hub: bool = False) -> list[Item]:
    """The first ``n`` evaluation items of the task ``source`` (``TASKS``) in ``lang``."""
    items = task_spec(source).load(lang, data_dir=data_dir, hub=hub)
    return items[:n] if n else items


# --------------------------------------------------------------------------- exemplars
def _check_shots(k) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, float)) or k != int(k) or not 0 <= k <= 8:
        raise ValueError(f"shots must be between 0 and 8, not {k}")
    return int(k)


def standard_exemplars(lang: str, shots: int, *, data_dir=None, hub: bool = False) -> list[Item]:
    """The first ``shots`` of MGSM's own exemplars of ``lang``, in the benchmark's order (8: the
    layer-swapping paper's setting; 2: its follow-up's). A missing file is an error, never a
    silent fallback to other exemplars."""
    shots = _check_shots(shots)
    if not shots:
        return []
    pool = load_mgsm_exemplars_hub(lang) if hub else load_mgsm_exemplars(lang, data_dir)
    if len(pool) < shots:
        raise ValueError(f"MGSM has {len(pool)} standard exemplars for {mgsm_lang(lang)!r}, "
                         f"asked for {shots}")
    return pool[:shots]


def exemplar_pool(lang: str, *, cot: bool, source: str = "mgsm",
                  data_dir=None) -> list[Item]:
    """Candidate few-shot exemplars, best first, in the target language where possible
    (the GSM-Symbolic protocol; MGSM evaluations use ``standard_exemplars`` by default).

    1. GSM-Symbolic training templates (0000-0049) of the language: worked solutions, and
       never scored (evaluation uses 0050-0099);
    2. for direct prompts, the task's own extra candidates (``TaskSpec.direct_pool``: on
       MGSM, other MGSM rows of the language; ``select_exemplars`` drops the scored ones);
    3. English GSM-Symbolic training templates (e.g. Bengali, which has almost no validated
       templates).
    """
    pool: list[Item] = []
    try:
        pool += gsm_symbolic_items(lang, "train")
    except ValueError:
        pass
    spec = next((s for s in TASKS.values() if s.source == source), None)
    if not cot and spec is not None and spec.direct_pool is not None:
        try:
            pool += spec.direct_pool(lang, data_dir)
        except ValueError:
            pass
    if mgsm_lang(lang) != "en":
        pool += gsm_symbolic_items("en", "train")
    return pool


def select_exemplars(pool: Sequence[Item], scored: Sequence[Item], k: int) -> list[Item]:
    """The first ``k`` pool items that share nothing with a scored item.

    Excluded: same id, same question text, or same origin (the GSM8K problem both derive from,
    so a GSM-Symbolic variant of a scored MGSM problem is never shown as an exemplar).
    """
    k = _check_shots(k)
    ids = {it.id for it in scored}
    questions = {it.question.strip() for it in scored}
    origins = {it.origin for it in scored if it.origin is not None}
    chosen = []
    for ex in pool:
        if ex.id in ids or ex.question.strip() in questions or \
                (ex.origin is not None and ex.origin in origins):
            continue
        if any(ex.id == c.id for c in chosen):
            continue
        chosen.append(ex)
        if len(chosen) == k:
            return chosen
    raise ValueError(f"only {len(chosen)} exemplars available apart from the scored items "
                     f"(asked for {k})")


def pool_exemplars(items: Sequence[Item], shots: int, *, cot: bool, data_dir=None,
                   hub: bool = False) -> list[Item]:
    """The GSM-Symbolic protocol: ``shots`` candidates of ``exemplar_pool`` apart from the
    scored items."""
    return select_exemplars(exemplar_pool(items[0].lang, cot=cot, source=items[0].source,
                                          data_dir=data_dir), items, shots)


def default_exemplars(items: Sequence[Item], shots: int, *, cot: bool, data_dir=None,
                      hub: bool = False) -> list[Item]:
    """The exemplars an evaluation of ``items`` uses unless told otherwise: their task's rule
    (``TaskSpec.exemplars``: MGSM's standard exemplars for MGSM items, GSM-Symbolic training
    templates for GSM-Symbolic's); ``pool_exemplars`` for items of no registered task."""
    shots = _check_shots(shots)
    if not shots:
        return []
    spec = task_of(items)
    rule = spec.exemplars if spec is not None else pool_exemplars
    return rule(items, shots, cot=cot, data_dir=data_dir, hub=hub)


def exemplar_description(exemplars: Sequence[Item]) -> str:
    """Where the exemplars come from, in words (for result headers and configs)."""
    if not exemplars:
        return "none"
    if all(e.prompt_question for e in exemplars):
        return f"MGSM standard exemplars 1-{len(exemplars)} of 8"
    spec = task_of(exemplars)
    same = spec is not None and all(e.source == spec.source for e in exemplars)
    return f"chosen from {spec.pool_words}" if same and spec.pool_words else "custom"


# --------------------------------------------------------------------------- training overlap
def evaluated_templates(items) -> dict[int, str]:
    """The GSM-Symbolic templates whose problems ``items`` score, each as the page and the CLI
    name it (``TaskSpec.templates``): "0050" for a GSM-Symbolic item, "0036 = MGSM row 11" for
    an MGSM item that is a template's own problem (``mgsm_overlap``)."""
    out: dict[int, str] = {}
    rules = {s.source: s.templates for s in TASKS.values() if s.templates is not None}
    for it in items:
        rule = rules.get(it.source)
        if rule is not None:
            out.update(rule(it))
    return dict(sorted(out.items()))


class Overlap(NamedTuple):
    clean: bool   # no evaluated template is one the model was trained on
    text: str     # one sentence, the model named first


def training_overlap(name: str, folder, items) -> Overlap | None:
    """The one statement (the app's evaluation note and ``layerswap eval`` print it as is) of
    which evaluated templates the model ``name`` was trained on, by its card
    (``card_templates``) against the templates ``items`` score (``evaluated_templates``). None
    when the card says nothing."""
    try:
        trained = card_templates(folder)
    except ValueError as e:
        return Overlap(False, f"{name}: cannot read which GSM-Symbolic templates it was "
                              f"trained on ({e}).")
    if not trained:
        return None
    evaluated = evaluated_templates(items)
    hit = [label for t, label in evaluated.items() if t in trained]
    if not hit:
        return Overlap(True, f"{name}: its card lists the {len(trained)} GSM-Symbolic "
                             "templates it was trained on; none of them is evaluated here.")
    spec = task_of(items)
    source = spec.label if spec is not None else items[0].source
    of = (f"{len(hit)} of the {len(evaluated)} GSM-Symbolic templates evaluated here"
          if spec is not None and spec.template_items else
          f"{len(hit)} GSM-Symbolic template(s) that are {source} items evaluated here")
    return Overlap(False, f"{name}: its card says it was trained on {of} ({', '.join(hit)}); "
                          "its score on them is not a clean test.")


# --------------------------------------------------------------------------- the tasks
def _mgsm(lang: str, *, data_dir=None, hub: bool = False) -> list[Item]:
    return load_mgsm_hub(lang) if hub else load_mgsm(lang, data_dir)


def _mgsm_exemplars(items, shots, *, cot, data_dir=None, hub=False) -> list[Item]:
    return standard_exemplars(items[0].lang, shots, data_dir=data_dir, hub=hub)


def _mgsm_templates(item: Item) -> dict[int, str]:
    return {t: f"{t:04d} = MGSM row {r}" for t, r in mgsm_overlap().items() if r == item.origin}


def _symbolic(lang: str, *, data_dir=None, hub: bool = False) -> list[Item]:
    items = gsm_symbolic_items(lang, "eval")
    if not items:
        raise DataError(f"GSM-Symbolic has no validated evaluation items for {lang!r} "
                        "(templates 0050-0099 all flagged 'ignore')")
    return items


def _symbolic_templates(item: Item) -> dict[int, str]:
    t = int(item.id.rsplit("-", 1)[1])
    return {t: f"{t:04d}"}


register_task(TaskSpec(
    "mgsm", "MGSM", _mgsm, lambda: tuple(c for c, row in LANGUAGES.items() if row.mgsm),
    _mgsm_exemplars, direct_pool=lambda lang, data_dir: load_mgsm(lang, data_dir),
    templates=_mgsm_templates, lm_eval=True,
    prepare=lambda say: find_mgsm_dir(progress=say),
    note=(f"MGSM is under {LICENCE}. Gold NLL is blank: MGSM's test questions come without "
          "worked solutions to score.")))
register_task(TaskSpec(
    "gsm-symbolic", "GSM-Symbolic", _symbolic, symbolic_language_names, pool_exemplars,
    aliases=("gsm_symbolic", "symbolic"), pool_words="GSM-Symbolic training templates",
    templates=_symbolic_templates, template_items=True))
