"""Math evaluation: prompts, answer extraction, scoring with a 95% CI, gold-solution NLL and
side-by-side runs of several models (the ``layerswap eval`` command is ``cli/evaluate.py``).

Prompts and answer filters are lm-eval's ``mgsm_direct_*`` and ``mgsm_native_cot_*`` tasks,
read from its installed YAML (``mgsm_task``: prompt words per language, stop strings, lm-eval's
own filter objects), so our numbers compare with published ones. Two extraction filters, as in
lm-eval:

* ``strict``: CoT: the number after the language's "The answer is" phrase (first match);
  direct: the whole output (whitespace stripped) must be the number;
* ``flexible``: the last number-like span of the output.

Few-shot exemplars: on MGSM the benchmark's own 8 per language (``mgsm_exemplars.json``,
the split lm-eval's mgsm tasks draw from), the first k in order, written verbatim as lm-eval
writes them (``standard_exemplars``); on GSM-Symbolic, training templates (``exemplar_pool``).

On top of lm-eval we normalise native digits (Bengali, Telugu, Thai, ...), thousands commas,
"$" and trailing ".0" before comparing numbers; ``lm_eval_compatible=True`` turns that off
and compares strings exactly as lm-eval's ``exact_match`` does (ignore case and punctuation).
"""
from __future__ import annotations

import json
import math
import re
import string
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from collections.abc import Callable, Sequence

from . import mgsm_task
from .data import Item, normalize_number, to_ascii_digits
from .registry import (default_exemplars, exemplar_description, exemplar_pool,  # noqa: F401
                       select_exemplars, source_label, standard_exemplars, task_of)
from ..memory import release_freed_memory
from ..progress import Progress, Tally, pause_point, say
from ..checkpoints.tokenizers import encode_continuation, encode_prompt
from .mgsm_task import (FLEXIBLE_FILTER, STRICT_FILTER, apply_filter,
                        prompt_words, stop_strings, target_delimiter)
from ..inference.prompts import has_chat_template, render_chat
from .tasks import Extraction, Task, run_task, token_nll
from ..checkpoints.loading import load_model
from ..inference.attention import without_cudnn_attention
from ..inference.lean import load_lean_model
from ..inference.prefill import (batch_order, group_passes, kv_layers,
                                 plain_cache_ok, shared_prefix)



# --------------------------------------------------------------------------- prompt words
NUMBER_GROUP = r"(\-?[0-9\.\,]+)"   # the number's group in every strict-match pattern


def __getattr__(name: str):
    if name == "FLEXIBLE_REGEX":   # lm-eval's flexible-extract pattern, from its YAML
        return mgsm_task.flexible_regex()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def answer_phrase(lang: str, number: str) -> str:
    """The language's "The answer is N." sentence, as lm-eval's exemplars end."""
    pattern = prompt_words(lang).answer_regex
    head, tail = pattern.split(NUMBER_GROUP)
    unescape = lambda s: re.sub(r"\\(.)", r"\1", s)  # noqa: E731
    tail = unescape(tail)
    return f"{unescape(head)}{number}{tail if tail else '.'}"


# --------------------------------------------------------------------------- prompts
def question_text(item: Item, lang: str, cot: bool) -> str:
    """lm-eval's doc_to_text: the question after the language's word (a standard exemplar's
    own text as written, word included), then the answer word."""
    w = prompt_words(lang)
    question = item.prompt_question or f"{w.question} {item.question}"
    return f"{question}\n{w.cot_answer if cot else w.direct_answer}"


def target_text(item: Item, lang: str, cot: bool) -> str:
    """What follows the answer prefix in an exemplar (and what the gold NLL scores).

    A standard MGSM exemplar's CoT target is lm-eval's ``answer[len(ANSWER) + 1:]``: its
    worked answer minus as many characters as the language's answer word and a space (lm-eval's
    quirks kept: Japanese, whose exemplars use a full-width colon, loses one character, and
    Russian, whose exemplars spell the word with a space, keeps a leading space)."""
    if not cot:
        return item.answer
    if item.prompt_answer:
        return item.prompt_answer[len(prompt_words(lang).cot_answer) + 1:]
    if not item.solution:
        raise ValueError(f"{item.id} has no worked solution; chain-of-thought exemplars need one")
    return f"{item.solution} {answer_phrase(lang, item.answer)}"


def build_prompt(item: Item, exemplars: Sequence[Item] = (), *, cot: bool = False,
                 tokenizer=None, chat_template: bool = False, lang: str | None = None) -> str:
    """The n-shot prompt for ``item``, as lm-eval builds it.

    Plain: exemplars "Q\\nA<delim>target" joined by blank lines, then "Q\\nA".
    Chat template: exemplars as alternating user/assistant turns (lm-eval's
    ``fewshot_as_multiturn``), the question as the last user turn, generation prompt added.
    """
    lang = lang or item.lang
    delim = target_delimiter(lang, cot)
    if chat_template:
        if tokenizer is None or not has_chat_template(tokenizer):
            raise ValueError("chat_template=True needs a tokenizer that has a chat template")
        messages = []
        for ex in exemplars:
            messages += [{"role": "user", "content": question_text(ex, lang, cot)},
                         {"role": "assistant", "content": target_text(ex, lang, cot)}]
        messages.append({"role": "user", "content": question_text(item, lang, cot)})
        return render_chat(tokenizer, messages)
    shots = [question_text(ex, lang, cot) + delim + target_text(ex, lang, cot) for ex in exemplars]
    return "\n\n".join([*shots, question_text(item, lang, cot)])


# --------------------------------------------------------------------------- extraction
_PUNCT = str.maketrans("", "", string.punctuation)


def extract_strict(output: str, lang: str, cot: bool, *, lm_eval_compatible: bool = False) -> str | None:
    """lm-eval's strict filter of the task (CoT: strict-match, the number after the answer
    phrase; direct: remove_whitespace, the whole output); by default on ASCII digits and
    normalised (``normalize_number``)."""
    text = output if lm_eval_compatible else to_ascii_digits(output)
    raw = apply_filter(text, lang, cot, STRICT_FILTER[cot])
    if raw is None or lm_eval_compatible:
        return raw
    return normalize_number(raw)


def extract_flexible(output: str, *, lm_eval_compatible: bool = False) -> str | None:
    """lm-eval's flexible-extract (the last number-like span). By default on ASCII digits,
    skipping spans without a digit ("...", ",,", so a final ellipsis does not hide the number
    before it), and normalised."""
    if lm_eval_compatible:
        return apply_filter(output, "en", True, FLEXIBLE_FILTER)
    spans = [next((g for g in m if g), "") if isinstance(m, tuple) else m
             for m in re.findall(mgsm_task.flexible_regex(), to_ascii_digits(output))]
    spans = [s for s in spans if any(c.isdigit() for c in s)]
    return normalize_number(spans[-1].strip()) if spans else None


def extract_answer(output: str, lang: str, cot: bool, *, lm_eval_compatible: bool = False) -> Extraction:
    return Extraction(extract_strict(output, lang, cot, lm_eval_compatible=lm_eval_compatible),
                      extract_flexible(output, lm_eval_compatible=lm_eval_compatible))


def is_correct(extracted: str | None, gold: str, *, lm_eval_compatible: bool = False) -> bool:
    """Exact match of an extracted answer with the gold number.

    lm-eval compatible: lower-case, drop all punctuation, compare strings (so "1,000" matches
    "1000" but "18.0" does not match "18"); default: compare normalised numbers.
    """
    if extracted is None:
        return False
    if lm_eval_compatible:
        return extracted.lower().translate(_PUNCT) == str(gold).lower().translate(_PUNCT)
    gold_n = normalize_number(str(gold))
    return gold_n is not None and normalize_number(extracted) == gold_n


# --------------------------------------------------------------------------- statistics
def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a proportion (well-behaved at 0 and at small n)."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


# --------------------------------------------------------------------------- gold NLL
def gold_nll(model, tokenizer, prompts: Sequence[str], targets: Sequence[str], *,
             batch_size: int = 8, share_prefix: bool = True,
             scored: Callable[[int], None] | None = None) -> list[float]:
    """Teacher-forced mean negative log-likelihood (nats/token) of each target after its prompt.

    A graded signal where exact-match accuracy is near zero: a merge that makes the gold
    solution more likely helps even before the model gets answers right.

    Like ``generate``: prompts that start alike are batched together, the few-shot prefix a
    batch shares is run once, and the rest in groups of similar length (``share_prefix``;
    models without a plain KV cache use one left-padded batch). Only the target positions
    get logits. ``scored(n)``, when given, hears how many items are scored so far after each
    pass (a progress bar that moves per item, not per job).
    """
    import torch

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    pairs = [(encode_prompt(tokenizer, p), encode_continuation(tokenizer, t))
             for p, t in zip(prompts, targets)]
    out = [math.nan] * len(pairs)
    share_prefix = share_prefix and plain_cache_ok(model)
    order = batch_order([p + t for p, t in pairs])
    done = [0]

    def score(idx, logits, keep):
        """Mean NLL of each row's target, the last tokens of its right-aligned logits rows."""
        for row, i in enumerate(idx):  # one row at a time: float32 log-probs of one target
            t = pairs[i][1]
            if t:
                pred = logits[row, keep - 1 - len(t):keep - 1]
                out[i] = float(token_nll(pred, torch.tensor(t, device=pred.device)) / len(t))
            done[0] += 1
        if scored is not None:
            scored(done[0])

    with torch.inference_mode(), without_cudnn_attention(device):
        for start in range(0, len(order), batch_size):
            pause_point()   # a waiting job may take the engine between two batches
            idx = order[start:start + batch_size]
            n_prefix, prefix_kv = 0, None
            if share_prefix:
                # the prefix stays inside the prompts, so every target is scored in a group pass
                n_prefix, cache = shared_prefix(model, [pairs[i][0] for i in idx], device)
                prefix_kv = kv_layers(cache) if cache is not None else []
                pause_point()   # and between the prefix and each group's pass
            if prefix_kv is not None:
                seqs = [(pairs[i][0] + pairs[i][1])[n_prefix:] for i in idx]

                def keep_of(members, idx=idx):   # the group's longest target, and the token before
                    return max(len(pairs[idx[b]][1]) for b in members) + 1

                for members, _, res in group_passes(model, seqs, n_prefix, prefix_kv, pad, device,
                                                    keep=keep_of):
                    score([idx[b] for b in members], res.logits, keep_of(members))
                    pause_point()
                continue
            # one left-padded batch: every target ends at the last column
            width = max(len(pairs[i][0]) + len(pairs[i][1]) for i in idx)
            keep = max(len(pairs[i][1]) for i in idx) + 1
            ids = torch.full((len(idx), width), pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, i in enumerate(idx):
                seq = torch.tensor(pairs[i][0] + pairs[i][1])
                ids[row, width - len(seq):] = seq
                mask[row, width - len(seq):] = 1
            positions = (mask.cumsum(1) - 1).clamp_min(0)
            inputs = dict(input_ids=ids.to(device), attention_mask=mask.to(device),
                          position_ids=positions.to(device))
            try:
                logits = model(**inputs, logits_to_keep=keep).logits
            except TypeError:  # a model class without logits_to_keep
                logits = model(**inputs).logits
            score(idx, logits, keep)
    return out


def task_nll(task: Task, model, tokenizer, *, batch_size: int = 16,
             prompts: Sequence[str] | None = None,
             progress: Progress | None = None,
             scored: Callable[[int], None] | None = None) -> list[float]:
    """The gold NLL (nats/token, ``gold_nll``) of ``task.target(item)`` after each item's prompt,
    without generating: one forward pass per batch of ``batch_size // 2`` rows (the batches of
    ``run_side_by_side``'s NLL pass: the same floats it reports as "gold_nll"). ``prompts``:
    the task's prompts for this tokenizer when already built; ``scored``: ``gold_nll``'s."""
    if task.target is None:
        raise ValueError(f"{task.name}: gold NLL needs worked solutions (GSM-Symbolic)")
    prompts = list(prompts) if prompts is not None else task.prompts(tokenizer)
    say(progress, 0.0, f"gold-solution NLL of {len(prompts)} items")
    return gold_nll(model, tokenizer, prompts, [task.target(it) for it in task.items],
                    batch_size=max(1, batch_size // 2), scored=scored)


# --------------------------------------------------------------------------- running
@dataclass
class SideBySideResult:
    """Per-item rows and per-model summary of one evaluation of several models.

    rows[i] = {"id", "question", "gold", "models": {name: {"output", "answer", "strict_answer",
    "correct", "strict_correct", "gold_nll"}}}; summary = [{"model", "accuracy", "ci_low",
    "ci_high", "n", "strict_accuracy", "mean_gold_nll"}] (the format plots.accuracy_bars takes).
    """
    rows: list[dict]
    summary: list[dict]
    config: dict = field(default_factory=dict)

    @property
    def models(self) -> list[str]:
        return [s["model"] for s in self.summary]

    def flat_rows(self) -> list[dict]:
        """One flat dict per item (columns "<model> output", "<model> answer", ...) for tables."""
        flat = []
        for r in self.rows:
            d = {"id": r["id"], "question": r["question"], "gold": r["gold"]}
            for m, v in r["models"].items():
                d[f"{m} output"] = v["output"]
                d[f"{m} answer"] = v["answer"]
                d[f"{m} correct"] = v["correct"]
            flat.append(d)
        return flat

    def to_dict(self) -> dict:
        return {"config": self.config, "summary": self.summary, "rows": self.rows}

    def save(self, path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=1))
        return path

    def table(self) -> str:
        """The summary as a fixed-width text table (the cells the app's summary shows:
        ``summary_cells``)."""
        head = f"{'model':<40} {'accuracy':>8} {'95% CI':>15} {'strict':>7} {'gold NLL':>8} {'n':>4}"
        lines = [head, "-" * len(head)]
        for s in self.summary:
            acc, ci, strict, nll, n = summary_cells(s)
            lines.append(f"{s['model'][-40:]:<40} {acc:>8} {ci:>15} {strict:>7} "
                         f"{nll or '-':>8} {n:>4}")
        return "\n".join(lines)


def summary_cells(s: dict) -> list[str]:
    """One model's summary as the CLI's table and the app's show it: accuracy, its 95% interval,
    strict accuracy (percentages, one decimal), gold NLL ("" when not scored), n."""
    nll = s.get("mean_gold_nll")
    return [f"{s['accuracy']:.1%}", f"[{s['ci_low']:.1%}, {s['ci_high']:.1%}]",
            f"{s['strict_accuracy']:.1%}", "" if nll is None else f"{nll:.3f}", str(s["n"])]


def mean_nll(nlls: Sequence[float] | None) -> float | None:
    """The mean of the items' gold NLLs that were scored (None and NaN left out); None if none."""
    good = [x for x in (nlls or []) if x is not None and not math.isnan(x)]
    return sum(good) / len(good) if good else None


def summarize(name: str, correct: Sequence[bool], strict: Sequence[bool],
              nlls: Sequence[float] | None = None) -> dict:
    n, k = len(correct), sum(bool(c) for c in correct)
    lo, hi = wilson_interval(k, n)
    return {"model": name, "accuracy": k / n if n else 0.0, "ci_low": lo, "ci_high": hi, "n": n,
            "strict_accuracy": sum(bool(c) for c in strict) / n if n else 0.0,
            "mean_gold_nll": mean_nll(nlls)}


def _ensure_loaded(spec, device, lean: bool = False):
    if isinstance(spec, (str, Path)):
        loaded = load_lean_model(str(spec), device) if lean else None
        return loaded or load_model(str(spec), device=device), True
    if callable(spec):  # asked just before its run (e.g. one live model showing each role)
        spec = spec()
    model, tokenizer = spec
    return (model, tokenizer), False


def side_by_side_task(items: Sequence[Item], exemplars: Sequence[Item], *, cot: bool = False,
              chat_template: bool = False, max_new_tokens: int | None = None,
              with_nll: bool = True) -> Task:
    """The side-by-side evaluation as a task record: lm-eval's MGSM prompt (``build_prompt``,
    the items' language), its stop strings, its filters (``extract_answer``; the flexible answer
    is scored), ``is_correct``; the gold NLL of the worked solution where every item has one."""
    lang = items[0].lang
    delim = target_delimiter(lang, True)
    has_solutions = with_nll and all(it.solution for it in items)
    return Task(
        f"{source_label(items[0].source)} {lang} {'cot' if cot else 'direct'}", list(items),
        lambda it, tokenizer: build_prompt(it, exemplars, cot=cot, tokenizer=tokenizer,
                                           chat_template=chat_template, lang=lang),
        partial(extract_answer, lang=lang, cot=cot), is_correct,
        max_new_tokens=max_new_tokens or (256 if cot else 32), stop=tuple(stop_strings(lang)),
        target=(lambda it: ("" if chat_template else delim) + target_text(it, lang, True))
        if has_solutions else None)


def task_record(items: Sequence[Item], exemplars: Sequence[Item], *, cot: bool = False,
                chat_template: bool = False, max_new_tokens: int | None = None,
                with_nll: bool = True) -> Task:
    """The task record of ``items``: their registered task's builder (``registry.TaskSpec.task``),
    else lm-eval's MGSM record (``side_by_side_task``). What every evaluation runs."""
    spec = task_of(items)
    build = spec.task if spec is not None and spec.task is not None else side_by_side_task
    return build(items, exemplars, cot=cot, chat_template=chat_template,
                 max_new_tokens=max_new_tokens, with_nll=with_nll)


def run_side_by_side(models: dict, items: Sequence[Item], *, shots: int = 2, cot: bool = False,
                     chat_template: bool = False, max_new_tokens: int | None = None,
                     batch_size: int = 16, exemplars: Sequence[Item] | None = None,
                     data_dir=None, with_nll: bool = True, device: str | None = "cpu",
                     lean: bool = True, progress: Progress | None = None,
                     tally: Tally | None = None) -> SideBySideResult:
    """Evaluate the same items with the same prompts on each model (up to four, e.g. base,
    task expert, language expert, merged).

    ``models``: name -> (model, tokenizer), a function returning one (called just before that
    model's run), or a model reference (loaded one at a time and freed after its run: with
    ``lean``, a plain Llama on the CPU as ``lean.LeanLlama``, the same logits without importing
    transformers; anything else with ``checkpoints.loading.load_model``). Exemplars default to
    ``default_exemplars(items, shots, ...)``:
    MGSM's standard exemplars on MGSM, GSM-Symbolic training templates otherwise. The task
    record is ``task_record`` (the items' registered task; lm-eval's MGSM by default), scored by ``tasks.run_task``; each model's prompts are built
    once and also feed the gold NLL. Accuracy uses the flexible filter; strict accuracy is
    reported beside it. Mean gold NLL is computed where items have worked solutions
    (GSM-Symbolic). ``progress`` counts models and items (``progress.Tally``: ``tally`` places
    this run in a larger job, e.g. one chunk of the dispatcher's).
    """
    if not items:
        raise ValueError("no items to evaluate")
    lang = items[0].lang
    source = items[0].source
    if exemplars is None:
        exemplars = default_exemplars(items, shots, cot=cot, data_dir=data_dir)
    task = task_record(items, exemplars, cot=cot, chat_template=chat_template,
                       max_new_tokens=max_new_tokens, with_nll=with_nll)
    has_solutions = task.target is not None
    rows = [{"id": it.id, "question": it.question, "gold": it.answer, "models": {}} for it in items]
    summary = []
    n_items = len(items)
    count = tally or Tally(len(models), n_items)
    gen_share = 0.9 if has_solutions else 1.0   # of a model's part of the bar: answering
    for mi, (name, spec) in enumerate(models.items()):
        count.say(progress, mi, name, 0, "loading the model" if isinstance(spec, (str, Path))
                  else "setting up the model")
        (model, tokenizer), loaded_here = _ensure_loaded(spec, device, lean and not chat_template)
        # the set-up is over: the bar says so before the first answer (a batch takes seconds)
        count.say(progress, mi, name, 0, "answering")
        try:
            run = run_task(task, model, tokenizer, batch_size=batch_size,
                           progress=lambda f, m, mi=mi, name=name: count.say(
                               progress, mi, name, f * n_items, at=gen_share * f * n_items))
            nlls = None
            release_freed_memory()  # generation's temporaries, before the NLL pass needs its own
            if has_solutions:
                nlls = task_nll(task, model, tokenizer, batch_size=batch_size,
                                prompts=run.prompts,   # the prompts, built once
                                progress=lambda f, m, mi=mi, name=name: count.say(
                                    progress, mi, name, n_items, "scoring the worked solutions",
                                    at=(gen_share + (1 - gen_share) * f) * n_items))
        finally:
            if loaded_here:
                del model
        for i, (out, ex) in enumerate(zip(run.outputs, run.answers)):
            rows[i]["models"][name] = {"output": out, "answer": ex.flexible,
                                       "strict_answer": ex.strict, "correct": run.correct[i],
                                       "strict_correct": run.strict_correct[i],
                                       "gold_nll": None if nlls is None else nlls[i]}
        summary.append(summarize(name, run.correct, run.strict_correct, nlls))
        count.say(progress, mi, name, n_items)
    config = {"data": source_label(source), "lang": lang, "n": len(items), "shots": len(exemplars),
              "format": "cot" if cot else "direct", "chat_template": chat_template,
              "max_new_tokens": task.max_new_tokens, "exemplars": [e.id for e in exemplars],
              "exemplar_source": exemplar_description(exemplars),
              "models": {n: (str(s) if isinstance(s, (str, Path)) else "in-memory")
                         for n, s in models.items()}}
    return SideBySideResult(rows, summary, config)
