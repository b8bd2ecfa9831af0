"""A small MGSM-format folder the suite writes itself, so every MGSM code path is tested on a
fresh machine (no ``../shared``, no cache, offline).

MGSM is not shipped (CC BY-SA 4.0; ``../shared/data/mgsm`` beside the repo in CI). The suite
points ``LAYERSWAP_MGSM_DIR`` at this folder (``conftest.py``); the few checks of MGSM's real
content take the real folder through the ``real_mgsm`` fixture and skip, with the reason, where
there is none (docs/development.md names them).

The folder has what the loaders read, in MGSM's formats: ``mgsm_<lang>.tsv`` for every MGSM
language (250 rows: question TAB answer, some answers with thousands commas, the same answers in
every language, as the benchmark has), and ``mgsm_exemplars.json`` (8 exemplars per language,
each question and worked answer starting with lm-eval's own prompt words for that language,
``number_answers`` and ``equation_solutions``). The texts are made up: nothing of MGSM is copied.
"""
from __future__ import annotations

import json
from pathlib import Path

ROWS = 250
SHOTS = 8
# Where MGSM's exemplar file writes the answer word otherwise than lm-eval's task does (a
# full-width colon; a space lm-eval drops): the fixture keeps these quirks, which lm-eval's
# ``answer[len(ANSWER) + 1:]`` slicing meets on the real file.
FILE_ANSWER_WORDS = {"ja": "ステップごとの答え：", "ru": "Пошаговое решение:"}


def _problem(i: int) -> tuple[str, str, int]:
    """(question, worked solution, answer) of row i: small arithmetic, a few large answers."""
    a, b, c = 3 + i % 7, 2 + (i * 5) % 9, 1 + (i * 3) % 4
    if i % 25 == 3:                        # a large answer, written "1,234" in the file
        a, b = 100 + i, 12 + i % 10
        return (f"problem {i}: a farm packs {a} crates of {b} eggs each. How many eggs are packed?",
                f"{a} * {b} = {a * b}.", a * b)
    total = a * b - c
    return (f"problem {i}: a shop has {a} boxes of {b} pencils and sells {c} pencils. "
            f"How many pencils are left?", f"{a} * {b} = {a * b}. {a * b} - {c} = {total}.", total)


def _number(n: int) -> str:
    return f"{n:,}" if n >= 1000 else str(n)


def write_mgsm_fixture(folder: str | Path) -> Path:
    """Write the fixture into ``folder`` (created) and return it."""
    from layerswap_core.evaluation.data import MGSM_EXEMPLARS_FILE, MGSM_LANGS
    from layerswap_core.evaluation.mgsm_task import prompt_words

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for lang in MGSM_LANGS:
        rows = []
        for i in range(ROWS):
            question, _, answer = _problem(i)
            rows.append(f"[{lang}] {question}\t{_number(answer)}\n")
        (folder / f"mgsm_{lang}.tsv").write_text("".join(rows), encoding="utf-8")
    shots = [(f"exemplar {k}: Juma has {4 + k} apples and buys {k + 2} bags of 3 apples. "
              f"How many apples does he have now?", f"{k + 2} * 3 = {3 * (k + 2)}. "
              f"{4 + k} + {3 * (k + 2)} = {4 + k + 3 * (k + 2)}.", 4 + k + 3 * (k + 2))
             for k in range(SHOTS)]
    exemplars = {}
    for lang in MGSM_LANGS:
        w = prompt_words(lang)
        exemplars[lang] = [{"q": f"{w.question} [{lang}] {q}",
                            "a": f"{FILE_ANSWER_WORDS.get(lang, w.cot_answer)} [{lang}] {steps} {n}."}
                           for q, steps, n in shots]
    (folder / MGSM_EXEMPLARS_FILE).write_text(json.dumps({
        "source": "layerswap's test fixture in MGSM's exemplar format (made-up problems)",
        "number_answers": [n for _, _, n in shots],
        "equation_solutions": [steps for _, steps, _ in shots],
        "exemplars": exemplars}, ensure_ascii=False, indent=1), encoding="utf-8")
    return folder
