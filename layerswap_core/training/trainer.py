"""Supervised fine-tuning of a causal LM on chat data: the experts that layer swapping composes.

Input: JSONL, one example a line, either ``{"messages": [{"role", "content"}, ...]}`` (loss on
every assistant turn) or ``{"prompt": ..., "response": ...}``. The model's chat template is
applied; the loss is on response tokens only (plus the end-of-turn token).

Modes (``TrainConfig.mode``):

* ``full``          every parameter trains;
* ``lora``          PEFT LoRA on the attention and MLP projections (rsLoRA unless ``rslora``
                    is off);
* ``partial``       full SFT of one side of a partition (``train_part``: "lang" or "task");
* ``partial_lora``  LoRA only on the projections of that side;
* ``simultaneous``  one optimizer, two datasets, two sides of a partition: each step trains one
                    side on a batch of its dataset (``lang_data`` -> lang side, ``data`` -> task
                    side) with the other side frozen (no gradient, so AdamW leaves its state
                    alone), switching every ``switch_every`` steps (language side first). One
                    epoch is one pass over *each* dataset: both sides get the optimizer steps of
                    one pass over the dataset that needs more, rounded up to whole
                    ``switch_every`` blocks, and the other dataset cycles (reshuffled each pass);
                    total steps = twice that. With ``lora``: partial LoRA, adapters on the
                    projections of both sides, each side's adapters trained only on its steps;
* any mode + ``revert``: after training, reset one side of the partition to the base values
  ("train-then-revert").

Partitions are the merge engine's (``plan.Partition``: presets "A", "B", "C" or rules).

Defaults: learning rate per mode (``DEFAULT_LR``: 1e-5 for full-parameter SFT, 2e-4 for LoRA),
rank-stabilised LoRA (scale alpha / sqrt(r)), a linear schedule; schedules are transformers'
(constant, linear, cosine, warmup-stable-decay). ``save_every`` N writes ``checkpoint-<step>``
folders (each a loadable model or adapter) every N steps so an expert can be picked later.
"""
from __future__ import annotations

import json
import math
import random
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

Progress = Callable[[float, str], None]

MODES = ("full", "lora", "partial", "partial_lora", "simultaneous")
SCHEDULES = ("constant", "linear", "cosine", "wsd")
# Peak learning rate when none is given: full-parameter SFT (full, partial, simultaneous) in the
# 1e-5 range of full SFT of LLMs; LoRA at the usual 2e-4 (adapters start from zero and move a
# low-rank update, so they take a rate an order of magnitude higher).
DEFAULT_LR = {"full": 1e-5, "lora": 2e-4}
PARTS = ("lang", "task")
TRAIN_DTYPES = ("float32", "bfloat16")             # dtype of the weights while training
SAVE_DTYPES = ("float32", "bfloat16", "float16")   # dtype of the saved weights
# Module kinds (architectures.py) LoRA targets by default: attention and MLP projections.
LORA_KINDS = ("attn_q", "attn_k", "attn_v", "attn_o", "attn_qkv",
              "mlp_gate", "mlp_up", "mlp_down", "mlp_gate_up")
IGNORE = -100


class TrainError(ValueError):
    """Bad training input or configuration; the message names the file, line or option."""


class DataError(TrainError):
    """A malformed or empty training data file; the message gives the file and line."""


def _say(progress: Progress | None, fraction: float, msg: str):
    if progress is not None:
        progress(min(max(fraction, 0.0), 1.0), msg)


# --------------------------------------------------------------------------- configuration
@dataclass
class TrainConfig:
    data: str                                  # JSONL (task data in simultaneous mode)
    output: str                                # folder written at the end
    model: str = "embedded:smollm2-135m-instruct"
    mode: str = "lora"
    eval_data: str | None = None               # JSONL for periodic validation loss
    lang_data: str | None = None               # simultaneous: data of the language side
    partition: Any = None                      # "A" | "B" | "C" | list of rule mappings
    scale_partition: bool = False              # scale a preset to the depth (the tool's own rule)
    train_part: str = "lang"                   # partial modes: the side that trains
    switch_every: int = 1                      # simultaneous: steps per side before switching
    revert: str | None = None                  # "lang" | "task": reset that side after training
    lora: bool = False                         # simultaneous: partial LoRA instead of full SFT
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    rslora: bool = True                        # rank-stabilised scaling alpha / sqrt(r)
    target_modules: list[str] | None = None    # None: attention + MLP projections
    steps: int | None = None                   # optimizer steps; None: ``epochs`` passes
    epochs: float = 1.0
    batch_size: int = 4
    grad_accum: int = 1
    lr: float | None = None                    # None: DEFAULT_LR of the mode (set by validate)
    weight_decay: float = 0.0
    warmup_steps: int = 0
    schedule: str = "linear"                   # constant | linear | cosine | wsd (transformers')
    decay_fraction: float = 0.1                # wsd: share of the steps in the final decay
    max_grad_norm: float = 1.0
    max_length: int = 256
    seed: int = 0
    dtype: str = "float32"                     # weights' dtype: float32 | bfloat16
    autocast: bool = False                     # bf16 autocast over fp32 weights (faster on CPUs
                                               # with avx512_bf16/AMX and on GPUs)
    threads: int | None = None                 # torch CPU threads (1 is fastest on a busy CPU)
    save_dtype: str | None = "bfloat16"        # dtype of the saved weights (None: training dtype)
    device: str = "auto"
    eval_every: int = 0                        # 0: validate only before and after training
    eval_batches: int | None = None            # cap on validation batches (None: whole file)
    save_every: int = 0                        # >0: <output>/checkpoint-<step> every N steps

    def validate(self) -> "TrainConfig":
        if self.mode not in MODES:
            raise TrainError(f"mode: unknown {self.mode!r}; choose one of {', '.join(MODES)}")
        if self.schedule not in SCHEDULES:
            raise TrainError(f"schedule: unknown {self.schedule!r}; choose one of "
                             f"{', '.join(SCHEDULES)}")
        if self.dtype not in TRAIN_DTYPES:
            raise TrainError(f"dtype: {self.dtype!r}; use float32 or bfloat16")
        if self.save_dtype not in (None, *SAVE_DTYPES):
            raise TrainError(f"save_dtype: {self.save_dtype!r}; use float32, bfloat16 or float16")
        for f in ("batch_size", "grad_accum", "switch_every", "lora_rank", "max_length"):
            if int(getattr(self, f)) < 1:
                raise TrainError(f"{f}: must be at least 1, got {getattr(self, f)!r}")
        if self.steps is not None and self.steps < 1:
            raise TrainError(f"steps: must be at least 1, got {self.steps}")
        for f in ("warmup_steps", "save_every", "eval_every"):
            if int(getattr(self, f)) < 0:
                raise TrainError(f"{f}: must be 0 or more, got {getattr(self, f)!r}")
        if not 0 < self.decay_fraction <= 1:
            raise TrainError(f"decay_fraction: must be in (0, 1], got {self.decay_fraction!r}")
        if self.lora and self.mode in ("full", "partial"):
            raise TrainError(f"lora with mode {self.mode}: use mode "
                             f"{'lora' if self.mode == 'full' else 'partial_lora'} (--lora is for "
                             "simultaneous mode)")
        if self.lr is None:
            self.lr = DEFAULT_LR["lora" if self.uses_lora else "full"]
        if not self.lr > 0:
            raise TrainError(f"lr: must be positive, got {self.lr!r}")
        needs_partition = self.mode in ("partial", "partial_lora", "simultaneous") or self.revert
        if needs_partition and self.partition is None:
            raise TrainError(f"mode {self.mode}{' with revert' if self.revert else ''} needs a "
                             "partition (--partition A|B|C or a rules file)")
        if self.train_part not in PARTS:
            raise TrainError(f"train_part: {self.train_part!r}; use lang or task")
        if self.revert not in (None, *PARTS):
            raise TrainError(f"revert: {self.revert!r}; use lang or task")
        if self.mode == "simultaneous" and not self.lang_data:
            raise TrainError("simultaneous mode needs lang_data (--lang-data): the dataset of the "
                             "language side; --data trains the task side")
        return self

    @property
    def uses_lora(self) -> bool:
        return self.mode in ("lora", "partial_lora") or (self.mode == "simultaneous" and self.lora)


@dataclass
class TrainResult:
    output: Path
    steps: int
    seconds: float
    train_losses: list[dict] = field(default_factory=list)   # {step, loss, lr, part}
    eval_losses: list[dict] = field(default_factory=list)    # {step, loss}
    trainable_params: int = 0

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / max(self.steps, 1)

    @property
    def eval_before(self) -> float | None:
        return self.eval_losses[0]["loss"] if self.eval_losses else None

    @property
    def eval_after(self) -> float | None:
        return self.eval_losses[-1]["loss"] if self.eval_losses else None


# --------------------------------------------------------------------------- data
def read_jsonl(path: str | Path) -> list[dict]:
    """Examples as {"messages": [...]}; raises DataError with file:line on the first bad line."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such data file")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            rows.append(_normalise(obj, f"{path}:{lineno}"))
    if not rows:
        raise DataError(f"{path}: no examples (the file is empty)")
    return rows


def _normalise(obj, where: str) -> dict:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise DataError(f"{where}: 'messages' must be a non-empty list")
        for i, m in enumerate(msgs):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)):
                raise DataError(f"{where}: message {i + 1} needs string 'role' and 'content'")
        if not any(m["role"] == "assistant" for m in msgs):
            raise DataError(f"{where}: no assistant message (nothing to learn from)")
        return {"messages": [{"role": m["role"], "content": m["content"]} for m in msgs]}
    if "prompt" in obj and "response" in obj:
        if not (isinstance(obj["prompt"], str) and isinstance(obj["response"], str)):
            raise DataError(f"{where}: 'prompt' and 'response' must be strings")
        return {"messages": [{"role": "user", "content": obj["prompt"]},
                             {"role": "assistant", "content": obj["response"]}]}
    raise DataError(f"{where}: expected 'messages' or 'prompt' and 'response' keys, got "
                    f"{sorted(obj)}")


def _render(tok, messages: list[dict], generation_prompt: bool) -> str:
    if getattr(tok, "chat_template", None):
        return tok.apply_chat_template(messages, tokenize=False,
                                       add_generation_prompt=generation_prompt)
    # no chat template: plain "role: content" lines
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return text + ("assistant: " if generation_prompt else "")


def encode(tok, example: dict, max_length: int) -> tuple[list[int], list[int]]:
    """(input_ids, labels): labels are IGNORE except on assistant turns.

    Each assistant turn is the text between the rendered conversation up to it (with the
    generation prompt) and the rendered conversation including it, so the labels cover exactly
    what the model must produce, end-of-turn marker included.
    """
    msgs = example["messages"]
    ids: list[int] = []
    labels: list[int] = []
    done = ""
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        prefix = _render(tok, msgs[:i], True)
        upto = _render(tok, msgs[:i + 1], False)
        if not getattr(tok, "chat_template", None):
            upto += tok.eos_token or ""
        if not prefix.startswith(done) or not upto.startswith(prefix):
            raise TrainError("the chat template does not render conversations incrementally; "
                             "give prompt/response examples instead")
        ctx = tok(prefix[len(done):], add_special_tokens=False)["input_ids"]
        resp = tok(upto[len(prefix):], add_special_tokens=False)["input_ids"]
        ids += ctx + resp
        labels += [IGNORE] * len(ctx) + resp
        done = upto
    return ids[:max_length], labels[:max_length]


def collate(batch: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
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
    """Endless shuffled batches of one dataset (reshuffled each pass, seeded)."""

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
        ids, labels = encode(tok, ex, max_length)
        if all(x == IGNORE for x in labels):
            raise DataError(f"{path}: example {lineno}: no response tokens left within "
                            f"max_length={max_length} (prompt too long)")
        out.append((ids, labels))
    return out


# --------------------------------------------------------------------------- loss
def batch_nll(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """(sum of response-token NLL, number of response tokens) for one batch."""
    # logits only where some row has a response token next: the vocabulary projection is a
    # large share of the cost and prompt positions need none
    target = batch["labels"][:, 1:]
    keep = (target != IGNORE).any(dim=0).nonzero().squeeze(1)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   logits_to_keep=keep).logits.float()
    target = target[:, keep]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             target.reshape(-1), ignore_index=IGNORE,
                                             reduction="sum")
    return loss, int((target != IGNORE).sum())


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
    from ..checkpoints import models
    if isinstance(model_or_ref, (str, Path)):
        model, tokenizer = models.load_model(model_or_ref, device=device)
    else:
        model = model_or_ref
    rows = read_jsonl(data) if isinstance(data, (str, Path)) else [_normalise(r, "row") for r in data]
    encoded = [encode(tokenizer, r, max_length) for r in rows]
    return mean_nll(model, encoded, batch_size, tokenizer.pad_token_id or 0, device)


# --------------------------------------------------------------------------- what trains
def partition_sides(model, partition, arch, scale: bool = False) -> dict[str, set[str]]:
    """{"lang": names, "task": names} of the model's (base) parameters under ``partition``
    (a preset in the published absolute layers, or scaled to the depth with ``scale``)."""
    from ..merge.plan import Partition
    part = Partition.from_spec(partition, arch.num_layers, scale=scale)
    sides = {"lang": set(), "task": set()}
    for name, _ in _base_parameters(model):
        sides["lang" if part.goes_to_lang(name, arch) else "task"].add(name)
    return sides


def _base_name(name: str) -> str:
    """Parameter name of the underlying HF model (strip PEFT wrappers)."""
    for prefix in ("base_model.model.",):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.replace(".base_layer.", ".")


def _base_parameters(model):
    for name, p in model.named_parameters():
        if "lora_" not in name:
            yield _base_name(name), p


def linear_modules(model, arch, kinds=LORA_KINDS) -> list[str]:
    """Full names of the model's linear projections of the given kinds."""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and (kinds is None
                                                 or arch.classify(name + ".weight").kind in kinds):
            out.append(name)
    return out


def resolve_target_modules(model, arch, targets: list[str] | None) -> list[str]:
    """Short module names (q_proj, ...) to give LoRA; unknown names raise TrainError."""
    if not targets:
        return sorted({n.rsplit(".", 1)[-1] for n in linear_modules(model, arch)})
    all_linear = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    short = sorted({n.rsplit(".", 1)[-1] for n in all_linear})
    unknown = [t for t in targets if not any(n == t or n.endswith("." + t) for n in all_linear)]
    if unknown:
        raise TrainError(f"unknown LoRA target module(s) {', '.join(unknown)}; this model's linear "
                         f"modules are: {', '.join(short)}")
    return list(targets)


def _lora_config(cfg: TrainConfig, target_modules):
    from peft import LoraConfig
    return LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      use_rslora=cfg.rslora, target_modules=target_modules, bias="none",
                      task_type="CAUSAL_LM")


def prepare_model(model, cfg: TrainConfig, arch, model_ref: str):
    """(model, sides) with requires_grad set for the mode; LoRA modes wrap the model with PEFT.

    ``sides``: {"lang", "task"} -> names of trainable parameters of each side (partition modes),
    or {} without a partition.
    """
    sides = partition_sides(model, cfg.partition, arch, cfg.scale_partition) if cfg.partition is not None else {}
    if cfg.uses_lora:
        targets = resolve_target_modules(model, arch, cfg.target_modules)
        if cfg.mode == "partial_lora":
            # LoRA only on the projections whose weight is on the training side
            on_side = [n for n in linear_modules(model, arch) if n + ".weight" in sides[cfg.train_part]
                       and n.rsplit(".", 1)[-1] in targets]
            if not on_side:
                raise TrainError(f"partition {_partition_label(cfg.partition)} leaves no projection "
                                 f"on the {cfg.train_part} side for LoRA: nothing would train")
            targets = on_side
        from peft import get_peft_model
        model = get_peft_model(model, _lora_config(cfg, targets))
        model.peft_config["default"].base_model_name_or_path = model_ref
        lora_sides = {}
        if sides:
            for side, names in sides.items():
                lora_sides[side] = {n for n, p in model.named_parameters() if "lora_" in n
                                    and _lora_weight_name(n) in names}
        if cfg.mode == "simultaneous":
            _need_both_sides(lora_sides, cfg, "projection")
        return model, lora_sides
    for p in model.parameters():
        p.requires_grad_(cfg.mode == "full")
    if cfg.mode == "partial":
        if not sides[cfg.train_part]:
            raise TrainError(f"partition {_partition_label(cfg.partition)} puts no parameter on the "
                             f"{cfg.train_part} side: nothing would train")
        for name, p in _base_parameters(model):
            p.requires_grad_(name in sides[cfg.train_part])
    if cfg.mode == "simultaneous":
        _need_both_sides(sides, cfg, "parameter")
    return model, sides


def _need_both_sides(sides: dict[str, set[str]], cfg: TrainConfig, what: str):
    for side in PARTS:
        if not sides[side]:
            raise TrainError(f"partition {_partition_label(cfg.partition)} puts no {what} on the "
                             f"{side} side: simultaneous training needs both")


def _lora_weight_name(lora_param: str) -> str:
    """'base_model.model.x.q_proj.lora_A.default.weight' -> 'x.q_proj.weight'."""
    module = _base_name(lora_param).split(".lora_")[0]
    return module + ".weight"


def _partition_label(p) -> str:
    return p if isinstance(p, str) else "(custom rules)"


def _set_side_trainable(model, sides: dict[str, set[str]], active: str, lora: bool):
    names = sides[active]
    for n, p in model.named_parameters():
        if lora and "lora_" not in n:
            continue
        key = n if lora else _base_name(n)
        p.requires_grad_(key in names)


# --------------------------------------------------------------------------- training
def make_scheduler(optimizer, cfg: TrainConfig, total: int):
    """transformers' schedule ``cfg.schedule`` over ``total`` optimizer steps (linear warmup from 0
    over ``warmup_steps``; wsd: warmup, constant, then cosine decay to 0 over the last
    ``decay_fraction`` of the steps)."""
    from transformers import optimization as sched
    warmup = cfg.warmup_steps
    if cfg.schedule == "constant":
        return sched.get_constant_schedule_with_warmup(optimizer, warmup)
    if cfg.schedule == "linear":
        return sched.get_linear_schedule_with_warmup(optimizer, warmup, total)
    if cfg.schedule == "cosine":
        return sched.get_cosine_schedule_with_warmup(optimizer, warmup, total)
    decay = wsd_decay_steps(cfg, total)
    return sched.get_wsd_schedule(optimizer, warmup, decay,
                                  num_stable_steps=max(total - warmup - decay, 0))


def wsd_decay_steps(cfg: TrainConfig, total: int) -> int:
    return max(1, round(total * cfg.decay_fraction))


def steps_per_pass(n_examples: int, cfg: TrainConfig) -> int:
    """Optimizer steps that see every one of ``n_examples`` once (``grad_accum`` batches a step)."""
    return math.ceil(math.ceil(n_examples / cfg.batch_size) / cfg.grad_accum)


def total_steps(cfg: TrainConfig, n_data: int, n_lang: int | None = None) -> int:
    """Optimizer steps of the run: ``steps`` if given, else ``epochs`` passes. Simultaneous mode
    (``n_lang`` given): one epoch is a pass over each dataset; each side gets the steps of a pass
    over the dataset needing more, rounded up to whole ``switch_every`` blocks, so both sides get
    the same number of steps and the total is twice that."""
    if cfg.steps:
        return cfg.steps
    if n_lang is None:
        return max(1, math.ceil(steps_per_pass(n_data, cfg) * cfg.epochs))
    per_side = math.ceil(max(steps_per_pass(n_data, cfg), steps_per_pass(n_lang, cfg)) * cfg.epochs)
    return 2 * cfg.switch_every * max(1, math.ceil(per_side / cfg.switch_every))


def seed_everything(seed: int):
    random.seed(seed)
    torch.manual_seed(seed)


class Trainer:
    """One training run. ``run()`` trains and saves; the pieces are exposed for tests."""

    def __init__(self, cfg: TrainConfig, progress: Progress | None = None):
        from accelerate import Accelerator

        from ..checkpoints import models
        from ..checkpoints.architectures import get_architecture

        self.cfg = cfg.validate()
        self.progress = progress
        seed_everything(cfg.seed)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        device = models.pick_device(cfg.device)
        self.accelerator = Accelerator(cpu=device == "cpu")
        self.device = self.accelerator.device
        dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
        _say(progress, 0.0, f"loading {cfg.model}")
        model, self.tok = models.load_model(cfg.model, device="cpu", dtype=dtype)
        self.arch = get_architecture(model.config.to_dict())
        self.base_path = models.resolve(cfg.model)
        self.lora = cfg.uses_lora
        # base values of the side to revert, kept before anything trains
        self.revert_values: dict[str, torch.Tensor] = {}
        model, self.sides = prepare_model(model, cfg, self.arch, str(cfg.model))
        if cfg.revert and not self.lora:
            self.revert_values = {n: p.detach().clone() for n, p in _base_parameters(model)
                                  if n in self.sides[cfg.revert]}
        model.train()
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        self.pad_id = pad
        _say(progress, 0.02, "tokenizing")
        self.data = Batches(encode_file(self.tok, cfg.data, cfg.max_length), cfg.batch_size,
                            cfg.seed, pad)
        self.lang_data = None
        if cfg.mode == "simultaneous":
            self.lang_data = Batches(encode_file(self.tok, cfg.lang_data, cfg.max_length),
                                     cfg.batch_size, cfg.seed + 1, pad)
        self.eval_encoded = encode_file(self.tok, cfg.eval_data, cfg.max_length) \
            if cfg.eval_data else None
        if cfg.mode == "simultaneous":
            # every parameter of either side is handed to the one optimizer
            both = self.sides["lang"] | self.sides["task"]
            for n, p in model.named_parameters():
                p.requires_grad_((n if self.lora else _base_name(n)) in both)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise TrainError("no trainable parameters")
        self.trainable_params = sum(p.numel() for p in params)
        self.optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.total_steps = total_steps(cfg, len(self.data.encoded),
                                       len(self.lang_data.encoded) if self.lang_data else None)
        self.scheduler = make_scheduler(self.optimizer, cfg, self.total_steps)
        self.model = self.accelerator.prepare_model(model)
        self.history: list[dict] = []
        self.evals: list[dict] = []
        self.checkpoints: list[Path] = []
        self.t0, self.seconds = time.time(), 0.0
        # called as hook(step, dataset, indices) for every batch drawn; dataset is "data" or
        # "lang_data", indices the examples' positions in that file (tests count coverage)
        self.batch_hooks: list[Callable[[int, str, list[int]], None]] = []

    # which side trains at optimizer step ``step`` (simultaneous mode)
    def side_at(self, step: int) -> str:
        return PARTS[(step // self.cfg.switch_every) % 2]

    def evaluate(self, step: int) -> float | None:
        if not self.eval_encoded:
            return None
        _say(self.progress, 0.05 + 0.9 * step / self.total_steps, f"validation loss at step {step}")
        loss = mean_nll(self.model, self.eval_encoded, self.cfg.batch_size * 2, self.pad_id,
                        self.device, self.cfg.eval_batches)
        self.evals.append({"step": step, "loss": loss})
        return loss

    def step(self, step: int) -> dict:
        """One optimizer step (``grad_accum`` micro-batches)."""
        cfg = self.cfg
        data, side = self.data, None
        if cfg.mode == "simultaneous":
            side = self.side_at(step)
            data = self.lang_data if side == "lang" else self.data
            _set_side_trainable(self.model, self.sides, side, self.lora)
        self.optimizer.zero_grad(set_to_none=True)
        batches = [self._draw(data, step) for _ in range(cfg.grad_accum)]
        tokens = sum(int((b["labels"][:, 1:] != IGNORE).sum()) for b in batches)
        total = 0.0
        for b in batches:
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=cfg.autocast):
                loss, _ = batch_nll(self.model, {k: v.to(self.device) for k, v in b.items()})
            self.accelerator.backward(loss / max(tokens, 1))
            total += float(loss.detach())
        trainable = [p for p in self.model.parameters() if p.grad is not None]
        if cfg.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(trainable, cfg.max_grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]   # the rate this step uses
        self.optimizer.step()
        self.scheduler.step()
        rec = {"step": step + 1, "loss": total / max(tokens, 1), "lr": lr}
        if side:
            rec["part"] = side
        self.history.append(rec)
        return rec

    def _draw(self, data: Batches, step: int) -> dict[str, torch.Tensor]:
        batch = data.next()
        for hook in self.batch_hooks:
            hook(step, "data" if data is self.data else "lang_data", list(data.last_indices))
        return batch

    def _revert_targets(self) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """(parameter, base value; None: zero) of the ``revert`` side (LoRA: its B matrices)."""
        if self.lora:
            names = partition_sides(self.model, self.cfg.partition, self.arch,
                                   self.cfg.scale_partition)[self.cfg.revert]
            return [(p, None) for n, p in self.model.named_parameters()
                    if "lora_B" in n and _lora_weight_name(n) in names]
        return [(p, self.revert_values[n]) for n, p in _base_parameters(self.model)
                if n in self.revert_values]

    def revert(self):
        """Reset the ``revert`` side to the base values (LoRA: zero its adapters' B matrices)."""
        with torch.no_grad():
            for p, base in self._revert_targets():
                if base is None:
                    p.zero_()
                else:
                    p.copy_(base)

    @contextmanager
    def _reverted(self):
        """The model with the ``revert`` side reset, restored exactly afterwards (checkpoints)."""
        if not self.cfg.revert:
            yield
            return
        kept = [(p, p.detach().clone()) for p, _ in self._revert_targets()]
        self.revert()
        try:
            yield
        finally:
            with torch.no_grad():
                for p, value in kept:
                    p.copy_(value)

    def train(self) -> None:
        cfg = self.cfg
        self.t0 = time.time()
        self.evaluate(0)
        for s in range(self.total_steps):
            rec = self.step(s)
            _say(self.progress, 0.05 + 0.9 * (s + 1) / self.total_steps,
                 f"step {s + 1}/{self.total_steps} loss {rec['loss']:.4f}")
            if cfg.eval_every and (s + 1) % cfg.eval_every == 0 and s + 1 < self.total_steps:
                self.evaluate(s + 1)
            if cfg.save_every and (s + 1) % cfg.save_every == 0 and s + 1 < self.total_steps:
                self.save_checkpoint(s + 1)
        if cfg.revert:
            self.revert()
        self.evaluate(self.total_steps)
        self.seconds = time.time() - self.t0

    def save_checkpoint(self, step: int) -> Path:
        """``<output>/checkpoint-<step>``: the model or adapter as it is now (with the ``revert``
        side reset, as the final model will be), loadable like the final output."""
        with self._reverted():
            folder = self._write(Path(self.cfg.output) / f"checkpoint-{step}", step,
                                 time.time() - self.t0)
        self.checkpoints.append(folder)
        _say(self.progress, 0.05 + 0.9 * step / self.total_steps, f"saved {folder}")
        return folder

    def save(self, argv: list[str] | None = None) -> Path:
        return self._write(Path(self.cfg.output), self.total_steps, self.seconds, argv)

    def _write(self, out: Path, steps: int, seconds: float, argv: list[str] | None = None) -> Path:
        """The model (LoRA: the adapter) and training_log.json into ``out``; the model in memory
        is left as it is (training may go on)."""
        out.mkdir(parents=True, exist_ok=True)
        model = self.accelerator.unwrap_model(self.model)
        save_dtype = getattr(torch, self.cfg.save_dtype) if self.cfg.save_dtype else None
        if self.lora:
            model.save_pretrained(out)
            if save_dtype is not None:
                _cast_safetensors(out / "adapter_model.safetensors", save_dtype)
        else:
            _save_model(model, out, save_dtype)
            self.tok.save_pretrained(out)
        log = {"config": asdict(self.cfg), "command": argv, "steps": steps,
               "seconds": round(seconds, 1),
               "seconds_per_step": round(seconds / max(steps, 1), 3),
               "trainable_params": self.trainable_params,
               "eval_losses": self.evals, "train_losses": self.history[:steps]}
        (out / "training_log.json").write_text(json.dumps(log, indent=1))
        return out


def _save_model(model, out: Path, dtype=None):
    """save_pretrained with the weights in ``dtype`` (None: as they are), without casting the
    model itself; tensors sharing storage (tied embeddings) stay shared so one copy is written."""
    state = model.state_dict()
    if dtype is not None:
        cast: dict = {}
        for k, v in state.items():
            key = (v.data_ptr(), v.shape)
            if key not in cast:
                cast[key] = v.detach().to(dtype)
            state[k] = cast[key]
    model.save_pretrained(out, state_dict=state, safe_serialization=True)
    if dtype is not None:  # transformers records the model's own dtype in config.json
        path = out / "config.json"
        config = json.loads(path.read_text())
        config["dtype"] = str(dtype).removeprefix("torch.")
        path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _cast_safetensors(path: Path, dtype):
    from safetensors.torch import load_file, save_file
    sd = load_file(str(path))
    save_file({k: v.to(dtype).contiguous() for k, v in sd.items()}, str(path),
              metadata={"format": "pt"})


def train(cfg: TrainConfig, progress: Progress | None = None,
          argv: list[str] | None = None) -> TrainResult:
    """Train, save to ``cfg.output`` and return losses and timings."""
    t = Trainer(cfg, progress)
    t.train()
    out = t.save(argv)
    _say(progress, 1.0, f"saved {out}")
    return TrainResult(out, t.total_steps, t.seconds, t.history, t.evals, t.trainable_params)
