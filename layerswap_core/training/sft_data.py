"""Supervised fine-tuning data: chat JSONL in, token ids with an assistant-only loss mask out.

Input: JSONL, one example a line, either ``{"messages": [{"role", "content"}, ...]}`` (loss on
every assistant turn) or ``{"prompt": ..., "response": ...}`` (``read_jsonl``). The model's chat
template is applied and the labels cover the assistant turns only, end-of-turn token included
(``encode_example``); ``Batches`` serves endless shuffled batches of one dataset; ``batch_nll``
and ``mean_nll`` give the response-token loss the trainer minimises and reports.
"""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import torch

from ..checkpoints.tokenizers import encode_continuation, encode_prompt
from ..inference.prompts import has_chat_template, render_chat
from ..evaluation.tasks import IGNORE, token_nll
from .config import TrainDataError, TrainError
from ..checkpoints.loading import load_model



def read_jsonl(path: str | Path) -> list[dict]:
    """Examples as {"messages": [...]}; raises TrainDataError with file:line on the first bad line."""
    path = Path(path)
    if not path.exists():
        raise TrainDataError(f"{path}: no such data file")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise TrainDataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            rows.append(_normalise(obj, f"{path}:{lineno}"))
    if not rows:
        raise TrainDataError(f"{path}: no examples (the file is empty)")
    return rows


def _normalise(obj, where: str) -> dict:
    if not isinstance(obj, dict):
        raise TrainDataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise TrainDataError(f"{where}: 'messages' must be a non-empty list")
        for i, m in enumerate(msgs):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)):
                raise TrainDataError(f"{where}: message {i + 1} needs string 'role' and 'content'")
        if not any(m["role"] == "assistant" for m in msgs):
            raise TrainDataError(f"{where}: no assistant message (nothing to learn from)")
        return {"messages": [{"role": m["role"], "content": m["content"]} for m in msgs]}
    if "prompt" in obj and "response" in obj:
        if not (isinstance(obj["prompt"], str) and isinstance(obj["response"], str)):
            raise TrainDataError(f"{where}: 'prompt' and 'response' must be strings")
        return {"messages": [{"role": "user", "content": obj["prompt"]},
                             {"role": "assistant", "content": obj["response"]}]}
    raise TrainDataError(f"{where}: expected 'messages' or 'prompt' and 'response' keys, got "
                         f"{sorted(obj)}")


def encode_example(tok, example: dict, max_length: int) -> tuple[list[int], list[int]]:
    """(input_ids, labels): labels are IGNORE except on assistant turns.

    Each assistant turn is the text between the rendered conversation up to it (with the
    generation prompt) and the rendered conversation including it, so the labels cover exactly
    what the model must produce, end-of-turn marker included.

    Custom because transformers' own mask (``apply_chat_template(...,
    return_assistant_tokens_mask=True)``) needs templates that mark assistant text with
    ``{% generation %}``, which most shipped templates (SmolLM2's included) lack; rendering
    prefix by prefix works with any template that renders conversations incrementally.
    """
    msgs = example["messages"]
    ids: list[int] = []
    labels: list[int] = []
    done = ""
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prefix = render_chat(tok, msgs[:i], generation_prompt=True)
        upto = render_chat(tok, msgs[:i + 1], generation_prompt=False)
        if not has_chat_template(tok):
            upto += tok.eos_token or ""
        if not prefix.startswith(done) or not upto.startswith(prefix):
            raise TrainError("the chat template does not render conversations incrementally; "
                             "give prompt/response examples instead")
        # the conversation's first piece is what the model starts reading: BOS rule as prompts
        ctx = (encode_prompt(tok, prefix) if not done
               else encode_continuation(tok, prefix[len(done):]))
        resp = encode_continuation(tok, upto[len(prefix):])
        ids += ctx + resp
        labels += [IGNORE] * len(ctx) + resp
        done = upto
    return ids[:max_length], labels[:max_length]


def collate(batch: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad (input_ids, labels) pairs on the right into one batch (labels padded with IGNORE).

    Not transformers' ``DataCollatorForSeq2Seq``: that pads through the tokenizer, on its
    ``padding_side`` (left for some chat models); here padding is always on the right, so
    positions start at 0 in every row without position ids, and no tokenizer is needed."""
    n = max(len(ids) for ids, _ in batch)
    input_ids = torch.full((len(batch), n), pad_id, dtype=torch.long)
    labels = torch.full((len(batch), n), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(batch), n), dtype=torch.long)
    for i, (ids, lab) in enumerate(batch):
        input_ids[i, :len(ids)] = torch.tensor(ids)
        labels[i, :len(lab)] = torch.tensor(lab)
        mask[i, :len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": mask}


class Batches:
    """Endless shuffled batches of one dataset (reshuffled each pass, seeded).

    Not a torch ``DataLoader``: simultaneous training draws from two datasets of different
    sizes at its own pace (the smaller one cycles, reshuffled), a pass's last batch is topped
    up from the next pass, and ``last_indices`` tells the tests which examples a batch held.
    """

    def __init__(self, encoded: list, batch_size: int, seed: int, pad_id: int):
        self.encoded, self.batch_size, self.pad_id = encoded, batch_size, pad_id
        self.rng = random.Random(seed)
        self.order: list[int] = []
        self.passes = 0
        self.served = 0           # batches handed out
        self.last_indices: list[int] = []   # examples (line order) of the last batch

    def __len__(self):
        """Batches of one pass; a pass's last batch is topped up from the next (reshuffled) pass,
        so the first ``len`` batches see every example."""
        return math.ceil(len(self.encoded) / self.batch_size)

    def next(self) -> dict[str, torch.Tensor]:
        if len(self.order) < self.batch_size:
            fresh = list(range(len(self.encoded)))
            self.rng.shuffle(fresh)
            self.order += fresh
            self.passes += 1
        take, self.order = self.order[:self.batch_size], self.order[self.batch_size:]
        self.served += 1
        self.last_indices = take
        return collate([self.encoded[i] for i in take], self.pad_id)


def encode_file(tok, path, max_length: int) -> list[tuple[list[int], list[int]]]:
    out = []
    for lineno, ex in enumerate(read_jsonl(path), 1):
        ids, labels = encode_example(tok, ex, max_length)
        if all(x == IGNORE for x in labels):
            raise TrainDataError(f"{path}: example {lineno}: no response tokens left within "
                                 f"max_length={max_length} (prompt too long)")
        out.append((ids, labels))
    return out


# --------------------------------------------------------------------------- loss
def batch_nll(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """(sum of response-token NLL, number of response tokens) for one batch.

    Not the model's own ``labels=`` loss, which projects every position onto the vocabulary:
    the logits here are computed only where some row has a response token next (the vocabulary
    projection is a large share of the cost and prompt positions need none), and the sum lets
    the trainer weight micro-batches by their response tokens under gradient accumulation."""
    target = batch["labels"][:, 1:]
    keep = (target != IGNORE).any(dim=0).nonzero().squeeze(1)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   logits_to_keep=keep).logits.float()
    target = target[:, keep]
    return token_nll(logits, target), int((target != IGNORE).sum())


@torch.no_grad()
def mean_nll(model, encoded: list, batch_size: int = 8, pad_id: int = 0, device="cpu",
             max_batches: int | None = None) -> float:
    """Mean per-token NLL of the response tokens (teacher forcing)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    # sort by length so batches pad little; the mean does not depend on the order
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
    for b, k in enumerate(range(0, len(order), batch_size)):
        if max_batches is not None and b >= max_batches:
            break
        batch = collate([encoded[i] for i in order[k:k + batch_size]], pad_id)
        loss, n = batch_nll(model, {key: v.to(device) for key, v in batch.items()})
        total, count = total + float(loss), count + n
    model.train(was_training)
    return total / max(count, 1)


def heldout_nll(model_or_ref, data, *, tokenizer=None, max_length: int = 512,
                batch_size: int = 8, device: str = "cpu") -> float:
    """Mean response-token NLL of a model (reference or loaded model) on a JSONL file or rows."""
    if isinstance(model_or_ref, (str, Path)):
        model, tokenizer = load_model(model_or_ref, device=device)
    else:
        model = model_or_ref
    rows = read_jsonl(data) if isinstance(data, (str, Path)) else [_normalise(r, "row") for r in data]
    encoded = [encode_example(tokenizer, r, max_length) for r in rows]
    return mean_nll(model, encoded, batch_size, tokenizer.pad_token_id or 0, device)
