"""lm-eval's mgsm tasks as installed (lm-eval 0.4.13, ``tasks/mgsm/direct`` and ``native_cot``):
the one source of the prompt words, stop strings, target delimiter and answer filters that our
evaluation (``runner``) and the lm-eval bridge (``lmeval``) use.

Nothing here is re-typed from lm-eval: the words come from rendering each task's own
``doc_to_text`` template, the filters are lm-eval's own filter classes built from each task's
``filter_list``. Languages the tasks lack use the English task. lm-eval's own quirks are kept
on purpose: several languages use the English "Answer:" for direct prompts, Bengali's strict
pattern is English, and Japanese/Chinese keep the " " target delimiter of CoT prompts (the
generator meant "" but never writes a falsy value).
"""
from __future__ import annotations

import copy
import functools
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from .data import mgsm_lang

FALLBACK_LANG = "en"
STRICT_FILTER = {False: "remove_whitespace", True: "strict-match"}   # by cot
FLEXIBLE_FILTER = "flexible-extract"
_MARK = "\x00QUESTION\x00"   # stands for the question when a doc_to_text template is rendered


@dataclass(frozen=True)
class PromptWords:
    question: str        # prefix of every question ("Swali:")
    cot_answer: str      # chain-of-thought answer prefix ("Jibu la Hatua kwa Hatua:")
    direct_answer: str   # direct answer prefix ("Answer:", "Antwort:")
    answer_regex: str    # lm-eval's strict-match pattern, one capture group for the number


def mgsm_task_dir() -> Path:
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("lm-eval is not installed (pip install lm-eval==0.4.13)")
    return Path(list(spec.submodule_search_locations)[0]) / "tasks" / "mgsm"


@functools.cache
def languages() -> tuple[str, ...]:
    """The languages lm-eval has mgsm tasks for (both direct and native CoT)."""
    def langs(folder, prefix):
        return {p.stem[len(prefix):] for p in (mgsm_task_dir() / folder).glob(f"{prefix}*.yaml")}
    return tuple(sorted(langs("direct", "mgsm_direct_") & langs("native_cot", "mgsm_native_cot_")))


@functools.cache
def _task_yaml(lang: str, cot: bool) -> dict:
    folder, name = ("native_cot", f"mgsm_native_cot_{lang}") if cot else ("direct", f"mgsm_direct_{lang}")
    path = mgsm_task_dir() / folder / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"lm-eval has no task {name} ({path} missing)")
    cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    base = yaml.safe_load((path.parent / cfg.pop("include")).read_text(encoding="utf-8"))
    return {**base, **cfg}   # the language file overrides whole keys, as lm-eval's loader does


def installed_task_yaml(lang: str, cot: bool) -> dict:
    """lm-eval's mgsm task config for ``lang`` with its ``include`` merged in (a fresh copy)."""
    return copy.deepcopy(_task_yaml(mgsm_lang(lang), cot))


def task_lang(lang: str) -> str:
    """The task language for ``lang`` (MGSM or ISO 639-3 code): itself, else English."""
    lang = mgsm_lang(lang)
    return lang if lang in languages() else FALLBACK_LANG


def _words(template: str) -> tuple[str, str]:
    """(question word, answer word) of a ``doc_to_text`` template, rendered as lm-eval renders
    it for a test document: "<question word> <question>\\n<answer word>"."""
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    head, tail = env.from_string(template).render(question=_MARK, answer=None).split(_MARK)
    if not head.endswith(" ") or not tail.startswith("\n"):
        raise ValueError(f"unexpected lm-eval mgsm doc_to_text: {template!r}")
    return head[:-1], tail[1:]


def _filter_steps(cfg: dict, name: str) -> list[dict]:
    return next(f["filter"] for f in cfg["filter_list"] if f["name"] == name)


@functools.cache
def prompt_words(lang: str) -> PromptWords:
    """The words of ``lang``'s tasks (English for languages the tasks lack)."""
    lang = task_lang(lang)
    direct, cot = _task_yaml(lang, False), _task_yaml(lang, True)
    question, direct_answer = _words(direct["doc_to_text"])
    _, cot_answer = _words(cot["doc_to_text"])
    (regex,) = [s for s in _filter_steps(cot, STRICT_FILTER[True]) if s["function"] == "regex"]
    return PromptWords(question, cot_answer, direct_answer, regex["regex_pattern"])


class _PromptWordsTable(Mapping):
    """{task language: PromptWords}, read on first use."""

    def __getitem__(self, lang: str) -> PromptWords:
        if lang not in languages():
            raise KeyError(lang)
        return prompt_words(lang)

    def __iter__(self):
        return iter(languages())

    def __len__(self) -> int:
        return len(languages())


PROMPT_WORDS: Mapping[str, PromptWords] = _PromptWordsTable()


def stop_strings(lang: str) -> list[str]:
    """lm-eval's `until` for mgsm: the next question's prefix and chat end markers."""
    return list(_task_yaml(task_lang(lang), True)["generation_kwargs"]["until"])


def target_delimiter(lang: str, cot: bool) -> str:
    """Between an exemplar's answer word and its target: lm-eval's ``target_delimiter``."""
    return _task_yaml(task_lang(lang), cot).get("target_delimiter", " ")


def flexible_regex() -> str:
    """The flexible-extract pattern (the same for every task; the last match wins)."""
    (regex,) = [s for s in _filter_steps(_task_yaml(FALLBACK_LANG, True), FLEXIBLE_FILTER)
                if s["function"] == "regex"]
    return regex["regex_pattern"]


@functools.cache
def _filters(lang: str, cot: bool, name: str) -> tuple:
    import lm_eval.filters  # noqa: F401  (registers lm-eval's filters)
    from lm_eval.api.registry import get_filter

    return tuple(get_filter(step["function"])(**{k: v for k, v in step.items() if k != "function"})
                 for step in _filter_steps(_task_yaml(task_lang(lang), cot), name))


def apply_filter(text: str, lang: str, cot: bool, name: str) -> str | None:
    """``text`` through the task's filter chain ``name`` (lm-eval's filter objects, in order);
    None where a regex step found nothing (lm-eval's "[invalid]")."""
    steps = _filters(lang, cot, name)
    resps = [[text]]
    for f in steps:
        resps = list(f.apply(resps, [None]))
    (out,) = resps
    from lm_eval.filters.extraction import RegexFilter

    if any(isinstance(f, RegexFilter) and out == f.fallback for f in steps):
        return None
    return out
