"""Run lm-eval's own mgsm tasks on an in-memory model, offline, on the local MGSM TSV files.

The task configuration is lm-eval's installed YAML (``mgsm_task.installed_task_yaml``: prompt
template, ``until`` strings, filters, metric) with one change: the documents come from
our loaders instead of the Hub. Test documents are the MGSM rows; few-shot documents are by
default MGSM's own exemplars (``mgsm_exemplars.json``, the Hub's train split), the first k in
order, passed as they are: lm-eval's own prompt template turns them into the prompt, and ours
(``runner.build_prompt``) gives the same text. Other exemplars (given explicitly) are written
in the shape of the train split ("Swali: ..." question, "Jibu la Hatua kwa Hatua: ... Jibu ni
N." answer).
"""
from __future__ import annotations

from collections.abc import Sequence

from .data import Item, load_mgsm, mgsm_lang
from .runner import answer_phrase, default_exemplars
from .mgsm_task import installed_task_yaml, prompt_words


def _test_doc(item: Item) -> dict:
    return {"question": item.question, "answer": None, "answer_number": int(float(item.answer))
            if float(item.answer).is_integer() else float(item.answer), "equation_solution": None}


def _fewshot_doc(item: Item, lang: str, cot: bool) -> dict:
    if item.prompt_question:   # a standard exemplar: the train split's own document
        return {"question": item.prompt_question, "answer": item.prompt_answer,
                "answer_number": _test_doc(item)["answer_number"], "equation_solution": None}
    w = prompt_words(lang)
    answer = f"{w.cot_answer} {item.solution} {answer_phrase(lang, item.answer)}" if cot else None
    if cot and not item.solution:
        raise ValueError(f"{item.id} has no worked solution for a chain-of-thought exemplar")
    return {"question": f"{w.question} {item.question}", "answer": answer or f"{w.cot_answer} {item.answer}",
            "answer_number": _test_doc(item)["answer_number"], "equation_solution": None}


def mgsm_task_config(lang: str, items: Sequence[Item], exemplars: Sequence[Item], *,
                     cot: bool = False, max_gen_toks: int | None = None) -> dict:
    """lm-eval task config dict: installed mgsm YAML + in-memory documents (no Hub access)."""
    import datasets

    lang = mgsm_lang(lang)
    cfg = installed_task_yaml(lang, cot)
    test = [_test_doc(it) for it in items]
    train = [_fewshot_doc(ex, lang, cot) for ex in exemplars]

    def documents(**_metadata):
        return datasets.DatasetDict({"test": datasets.Dataset.from_list(test),
                                     "train": datasets.Dataset.from_list(train or [_test_doc(items[0])])})

    cfg.update(task=f"{cfg['task']}_local", dataset_path=None, dataset_name=None,
               custom_dataset=documents, num_fewshot=len(exemplars),
               # keep the chosen exemplars in order, as our prompts do
               fewshot_config={"sampler": "first_n"})
    cfg.pop("tag", None)
    if max_gen_toks:
        cfg["generation_kwargs"] = {**cfg.get("generation_kwargs", {}), "max_gen_toks": max_gen_toks}
    return cfg


def run_lm_eval(model, tokenizer, lang: str, *, n: int | None = None, shots: int = 2,
                cot: bool = False, data_dir=None, items: Sequence[Item] | None = None,
                exemplars: Sequence[Item] | None = None, batch_size: int = 8,
                max_gen_toks: int | None = None, apply_chat_template: bool = False) -> dict:
    """lm-eval's mgsm (direct or native CoT) on an in-memory HF model, offline.

    Exemplars default to ``runner.default_exemplars`` (MGSM's standard exemplars, first
    ``shots`` in order). Returns {"task", "metrics" (lm-eval's result dict for the task),
    "samples" (log_samples: per doc the prompt, raw response and filtered responses),
    "exemplars"}.
    """
    import lm_eval
    from lm_eval.api.task import ConfigurableTask
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    lang = mgsm_lang(lang)
    if items is None:
        items = load_mgsm(lang, data_dir)[: n or None]
    if exemplars is None:
        exemplars = default_exemplars(items, shots, cot=cot, data_dir=data_dir)
    max_gen_toks = max_gen_toks or (256 if cot else 32)
    cfg = mgsm_task_config(lang, items, exemplars, cot=cot, max_gen_toks=max_gen_toks)
    task = ConfigurableTask(config=cfg)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=batch_size,
              max_gen_toks=max_gen_toks)
    out = lm_eval.simple_evaluate(
        model=lm, tasks=[task], num_fewshot=len(exemplars) if exemplars else None, log_samples=True,
        task_manager=TaskManager(include_defaults=False), apply_chat_template=apply_chat_template,
        fewshot_as_multiturn=apply_chat_template, bootstrap_iters=0, random_seed=0,
        numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)
    name = cfg["task"]
    return {"task": name, "metrics": out["results"][name], "samples": out["samples"][name],
            "exemplars": [e.id for e in exemplars]}
