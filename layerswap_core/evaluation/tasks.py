"""One task = one record (lm-eval's idea): the items, how an item becomes a prompt for a given
tokenizer, how an output becomes an answer, the metric, and the decoding settings; and the one
scorer that runs a task on a model (``run_task``).

The side-by-side evaluation (``runner.side_by_side_task``: lm-eval's MGSM prompts and filters)
and the demo's held-out variants (``demo_result.demo_task``: the trainer's chat prompt, the GSM8K
calculator, the number after ``####``) are two such records over the same scorer.

``token_nll`` is the one negative log-likelihood of given tokens under given logits: the gold
NLL of the runner (``runner.gold_nll``), the trainer's loss and its held-out loss
(``training.sft_data.batch_nll`` / ``mean_nll``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple
from collections.abc import Callable, Sequence

import torch

from ..progress import Progress
from .data import Item
from ..inference.generation import generate


IGNORE = -100   # a target position the NLL skips (PyTorch's ignore_index)


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Sum over positions of -log p(target) (float32 log-softmax over the vocabulary, the last
    dimension of ``logits``; positions whose target is ``IGNORE`` are skipped), differentiable."""
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                             targets.reshape(-1), ignore_index=IGNORE,
                                             reduction="sum")


class Extraction(NamedTuple):
    strict: str | None     # lm-eval strict-match (CoT) / whole output (direct), normalised
    flexible: str | None   # lm-eval flexible-extract (last number), normalised: THE answer


@dataclass(frozen=True)
class Task:
    """``prompt(item, tokenizer)``: the text the model reads; ``extract(output)``: the answers
    (``Extraction``: the flexible one is scored, the strict one reported beside it);
    ``correct(answer, gold)``: the metric of one item; ``target(item)``: the gold continuation
    whose NLL is reported (None: no NLL); decoding: greedy, ``max_new_tokens``, cut at ``stop``,
    with the GSM8K ``calculator`` on request."""
    name: str
    items: Sequence[Item]
    prompt: Callable[[Item, object], str]
    extract: Callable[[str], Extraction]
    correct: Callable[[str | None, str], bool]
    max_new_tokens: int = 32
    stop: tuple[str, ...] = ()
    calculator: bool = False
    target: Callable[[Item], str] | None = None

    def prompts(self, tokenizer) -> list[str]:
        """Every item's prompt for ``tokenizer``, built once per model run."""
        return [self.prompt(it, tokenizer) for it in self.items]


@dataclass
class TaskRun:
    """One model on one task: the prompts it read and, per item, its output, answers and
    correctness."""
    prompts: list[str]
    outputs: list[str]
    answers: list[Extraction]
    correct: list[bool]
    strict_correct: list[bool]


def run_task(task: Task, model, tokenizer, *, batch_size: int = 16,
             prompts: Sequence[str] | None = None,
             progress: Progress | None = None) -> TaskRun:
    """Greedy answers of one model to the task's items, scored with the task's metric."""
    prompts = list(prompts) if prompts is not None else task.prompts(tokenizer)
    gens = generate(model, tokenizer, prompts, max_new_tokens=task.max_new_tokens,
                    stop=task.stop, batch_size=batch_size, calculator=task.calculator,
                    progress=progress)
    outputs = [g.text for g in gens]
    answers = [task.extract(o) for o in outputs]
    golds = [it.answer for it in task.items]
    return TaskRun(prompts, outputs, answers,
                   [task.correct(a.flexible, g) for a, g in zip(answers, golds)],
                   [task.correct(a.strict, g) for a, g in zip(answers, golds)])
