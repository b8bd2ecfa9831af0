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
folders (each a loadable model or adapter) every N steps so an expert can be picked later; the
last one also holds ``trainer_state.pt`` (the trainable weights in the training dtype, the optimizer, the
schedule, the random states, the data order, the losses), from which ``resume`` continues the
run as if it had not stopped (``find_resume_state``: the last complete one).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import shlex
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from collections.abc import Callable

import torch

from ..progress import Progress
from ..progress import say as _say
from .config import LORA_KINDS, PARTS, TrainConfig, TrainError
from .sft_data import IGNORE, Batches, batch_nll, encode_file, mean_nll
from ..checkpoints.architectures import get_architecture
from ..checkpoints.loading import load_model, pick_device
from ..checkpoints.references import resolve
from ..merge.partition import Partition


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


# --------------------------------------------------------------------------- what trains
def partition_sides(model, partition, arch, scale: bool = False) -> dict[str, set[str]]:
    """{"lang": names, "task": names} of the model's (base) parameters under ``partition``
    (a preset in the published absolute layers, or scaled to the depth with ``scale``)."""
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


STATE_FILE = "trainer_state.pt"
# fields a resumed run may change: where and how fast it runs, not what it computes
RESUME_MAY_DIFFER = ("threads", "device")


def find_resume_state(output: str | Path) -> Path | None:
    """The state file of the last checkpoint under ``output`` that has one (written last, by a
    rename, so a run killed while saving leaves the previous checkpoint the last complete one);
    None when there is none."""
    found = []
    for d in Path(output).glob("checkpoint-*"):
        step = d.name.removeprefix("checkpoint-")
        if step.isdigit() and (d / STATE_FILE).is_file():
            found.append((int(step), d / STATE_FILE))
    return max(found)[1] if found else None


class Trainer:
    """One training run. ``train()`` trains, ``save()`` writes; the pieces are exposed for tests.

    A small loop of its own rather than transformers' ``Trainer`` (or TRL's SFT trainer): the
    simultaneous mode switches the trainable side of one optimizer every ``switch_every`` steps
    over two datasets, and train-then-revert resets a side before every checkpoint and at the
    end: neither fits their loops without callbacks that reach into the optimizer and the
    checkpoint writer. It uses what those trainers are built on: accelerate for the device,
    transformers' LR schedules, PEFT for LoRA.
    """

    def __init__(self, cfg: TrainConfig, progress: Progress | None = None, resume: bool = False):
        from accelerate import Accelerator

        self.cfg = cfg.validate()
        self.progress = progress
        seed_everything(cfg.seed)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        device = pick_device(cfg.device)
        self.accelerator = Accelerator(cpu=device == "cpu")
        self.device = self.accelerator.device
        dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
        _say(progress, 0.0, f"loading {cfg.model}")
        model, self.tok = load_model(cfg.model, device="cpu", dtype=dtype)
        self.arch = get_architecture(model.config.to_dict())
        self.base_path = resolve(cfg.model)
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
        # what the optimizer holds (simultaneous mode switches requires_grad step by step)
        self.trained_names = [n for n, p in model.named_parameters() if p.requires_grad]
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
        self.start_step = 0          # > 0 when resumed from a checkpoint's state
        self.resumed_from: Path | None = None
        # called as hook(step, dataset, indices) for every batch drawn; dataset is "data" or
        # "lang_data", indices the examples' positions in that file (tests count coverage)
        self.batch_hooks: list[Callable[[int, str, list[int]], None]] = []
        if resume:
            state = find_resume_state(cfg.output)
            if state is not None:
                self.load_state(state)

    # ------------------------------------------------------------------ resumable state
    def _trainable(self) -> dict[str, torch.Tensor]:
        named = dict(self.model.named_parameters())
        return {n: named[n] for n in self.trained_names}

    def state_dict(self, step: int) -> dict:
        """Everything ``train`` needs to go on from ``step`` as if it had not stopped."""
        def batches(b):
            return None if b is None else {"rng": b.rng.getstate(), "order": list(b.order),
                                           "passes": b.passes, "served": b.served}
        return {"step": step, "config": asdict(self.cfg), "data_digest": self._data_digest(),
                "params": {n: p.detach().clone() for n, p in self._trainable().items()},
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "python_rng": random.getstate(), "torch_rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "data": batches(self.data), "lang_data": batches(self.lang_data),
                "history": self.history[:step], "evals": list(self.evals),
                "seconds": time.time() - self.t0}

    def _data_digest(self) -> str:
        """A digest of the data files' bytes: a resumed run must read the same examples."""
        h = hashlib.sha256()
        for f in ("data", "lang_data", "eval_data"):
            path = getattr(self.cfg, f)
            h.update(f.encode() + (Path(path).read_bytes() if path else b""))
        return h.hexdigest()

    def save_state(self, folder: Path, step: int) -> Path:
        path = folder / STATE_FILE
        tmp = folder / (STATE_FILE + ".tmp")
        torch.save(self.state_dict(step), tmp)
        tmp.replace(path)
        # only the last state is needed to resume (a LoRA run's is about 3x its adapter in
        # float32: weights and AdamW's two moments); the earlier checkpoints keep their models
        for old in Path(self.cfg.output).glob(f"checkpoint-*/{STATE_FILE}"):
            if old != path:
                old.unlink(missing_ok=True)
        return path

    def load_state(self, path: Path) -> None:
        """Continue from a checkpoint's state; a state of another configuration is refused in
        one line (a resumed run must compute what the first one would have)."""
        state = torch.load(path, map_location="cpu", weights_only=False)
        now = asdict(self.cfg)
        differ = [k for k, v in state["config"].items()
                  if k not in RESUME_MAY_DIFFER and now.get(k) != v]
        if differ:
            raise TrainError(f"{path}: saved by a run with other options ({', '.join(differ)}); "
                             "resume with the same options or write to another --out")
        if state.get("data_digest") != self._data_digest():
            raise TrainError(f"{path}: saved by a run on other data (the files' bytes differ); "
                             "resume on the same files or write to another --out")
        params = self._trainable()
        if set(params) != set(state["params"]):
            raise TrainError(f"{path}: its trainable parameters are not this run's")
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(state["params"][n])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        for name in ("data", "lang_data"):
            b, saved = getattr(self, name), state[name]
            if b is not None and saved is not None:
                b.rng.setstate(saved["rng"])
                b.order, b.passes, b.served = list(saved["order"]), saved["passes"], saved["served"]
        random.setstate(state["python_rng"])
        torch.set_rng_state(state["torch_rng"])
        if state.get("cuda_rng") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda_rng"])
        self.history, self.evals = list(state["history"]), list(state["evals"])
        self.start_step, self.resumed_from = int(state["step"]), path
        self.seconds = float(state["seconds"])

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
        # a resumed run's clock goes on from the time it had spent
        self.t0 = time.time() - self.seconds
        if self.start_step == 0:
            self.evaluate(0)
        else:
            _say(self.progress, 0.05 + 0.9 * self.start_step / self.total_steps,
                 f"resumed at step {self.start_step} from {self.resumed_from}")
        for s in range(self.start_step, self.total_steps):
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
        self.save_state(folder, step)   # last: a checkpoint with a state is complete
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
        # PEFT writes a boilerplate card ("More Information Needed"); say what was done instead
        (out / "README.md").write_text(training_card(self.cfg, log, len(self.data.encoded),
                                                     out.name), encoding="utf-8")
        return out


def training_card(cfg: TrainConfig, log: dict, n_examples: int, name: str) -> str:
    """A model card for a trained expert: base, mode, data, schedule, time, held-out loss and the
    command that made it (the facts of ``training_log.json``, in words). Shipped experts start
    from it and add why and what was measured."""
    lora = cfg.uses_lora
    front = [f"base_model: {cfg.model}"] + (["library_name: peft"] if lora else []) + \
        ["tags:", "- layerswap", f"- {'lora' if lora else cfg.mode}"]
    what = (f"LoRA adapter (rank {cfg.lora_rank}, alpha {cfg.lora_alpha:g}"
            f"{', rsLoRA scaling' if cfg.rslora else ''}) over" if lora
            else f"{cfg.mode} fine-tune of")
    lines = ["---", *front, "---", "", f"# {name}", "",
             f"{what} `{cfg.model}`, trained with layerswap. Data: `{cfg.data}` "
             f"({n_examples} examples, loss on the response tokens only"
             + (f"; language data `{cfg.lang_data}`" if cfg.lang_data else "") + ").", "",
             f"{log['steps']} optimizer steps of {cfg.batch_size * cfg.grad_accum} examples "
             f"(max {cfg.max_length} tokens), AdamW lr {cfg.lr:g}, {cfg.schedule} schedule, "
             f"{cfg.warmup_steps} warmup steps, seed {cfg.seed}, {cfg.dtype}"
             + (" with bf16 autocast" if cfg.autocast else "")
             + f". Wall time {log['seconds']:g} s ({log['seconds_per_step']:g} s/step"
             + (f", {cfg.threads} threads" if cfg.threads else "") + ").", ""]
    evals = log.get("eval_losses") or []
    if evals:
        lines += [f"Held-out loss (`{cfg.eval_data}`, mean NLL per response token): "
                  + " -> ".join(f"{e['loss']:.3f} (step {e['step']})" for e in evals) + ".", ""]
    if log.get("command"):
        lines += ["Reproduce:", "```", shlex.join(log["command"]), "```", ""]
    lines += ["`training_log.json` has the configuration and the per-step losses.", ""]
    return "\n".join(lines)


def _save_model(model, out: Path, dtype=None):
    """save_pretrained with the weights in ``dtype`` (None: as they are), without casting the
    model itself; tensors sharing storage (tied embeddings) stay shared so one copy is written.
    (``save_pretrained`` has no dtype option, and casting the model would change it in place
    while training may go on after a checkpoint.)"""
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
    """Rewrite a saved adapter's tensors in ``dtype`` (PEFT's save_pretrained has no dtype
    option; adapters are small, so a load-cast-save round trip is cheap)."""
    from safetensors.torch import load_file, save_file
    sd = load_file(str(path))
    save_file({k: v.to(dtype).contiguous() for k, v in sd.items()}, str(path),
              metadata={"format": "pt"})


def train(cfg: TrainConfig, progress: Progress | None = None,
          argv: list[str] | None = None, resume: bool = False) -> TrainResult:
    """Train, save to ``cfg.output`` and return losses and timings; ``resume``: go on from the
    last checkpoint's state under ``cfg.output`` (none there: from the start)."""
    t = Trainer(cfg, progress, resume=resume)
    t.train()
    out = t.save(argv)
    _say(progress, 1.0, f"saved {out}")
    return TrainResult(out, t.total_steps, t.seconds, t.history, t.evals, t.trainable_params)
