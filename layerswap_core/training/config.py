"""What a training run is: ``TrainConfig`` (validated, with the per-mode defaults), the modes,
schedules and dtypes it accepts, and the errors the training room raises."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..checkpoints.architectures import PROJECTION_KINDS

MODES = ("full", "lora", "partial", "partial_lora", "simultaneous")
SCHEDULES = ("constant", "linear", "cosine", "wsd")
# Peak learning rate when none is given: full-parameter SFT (full, partial, simultaneous) in the
# 1e-5 range of full SFT of LLMs; LoRA at the usual 2e-4 (adapters start from zero and move a
# low-rank update, so they take a rate an order of magnitude higher).
DEFAULT_LR = {"full": 1e-5, "lora": 2e-4}
PARTS = ("lang", "task")
TRAIN_DTYPES = ("float32", "bfloat16")             # dtype of the weights while training
SAVE_DTYPES = ("float32", "bfloat16", "float16")   # dtype of the saved weights
# Module kinds LoRA targets by default: the attention and MLP projections.
LORA_KINDS = PROJECTION_KINDS


class TrainError(ValueError):
    """Bad training input or configuration; the message names the file, line or option."""


class TrainDataError(TrainError):
    """A malformed or empty training data file (JSONL); the message gives the file and line.
    (Not ``evaluation.data.DataError``, which is about the MGSM / GSM-Symbolic evaluation data.)"""


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

    def validate(self) -> TrainConfig:
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

    def check_data_files(self) -> TrainConfig:
        """TrainDataError naming the first data file that is not there: said before the model
        loads (seconds), not after."""
        for f in ("data", "eval_data", "lang_data"):
            path = getattr(self, f)
            if isinstance(path, (str, os.PathLike)) and not Path(path).exists():
                raise TrainDataError(f"{path}: no such data file")
        return self

    @property
    def uses_lora(self) -> bool:
        return self.mode in ("lora", "partial_lora") or (self.mode == "simultaneous" and self.lora)


# fields ``train_command`` writes as the paths it is given, not from the configuration
_PATH_FIELDS = ("data", "output", "eval_data", "lang_data")
_SWITCHES = ("scale_partition", "lora", "autocast")    # store_true flags of `layerswap train`


def train_command(config: dict, **paths: str | None) -> list[str]:
    """The `layerswap train` command line of a configuration (``asdict(TrainConfig)``, as a
    ``training_log.json`` stores it) with its paths replaced by ``paths`` (``data``,
    ``output``, ``eval_data``, ``lang_data``): every option that is not the default, so the
    same run on other files. A partition of rules (a YAML file on the command line) or an
    unsaved dtype cannot be written as flags: TrainError."""
    default = TrainConfig(data="", output="")
    cfg = {**config, **{k: v for k, v in paths.items()}}
    unknown = set(paths) - set(_PATH_FIELDS)
    if unknown:
        raise TrainError(f"train_command: unknown path field(s) {', '.join(sorted(unknown))}")
    argv = ["layerswap", "train", "--data", str(cfg["data"]), "--out", str(cfg["output"])]
    for name in ("eval_data", "lang_data"):
        if cfg.get(name):
            argv += [f"--{name.replace('_', '-')}", str(cfg[name])]
    for name, value in cfg.items():
        if name in _PATH_FIELDS or (name != "lr" and value == getattr(default, name)):
            continue
        flag = "--" + name.replace("_", "-")
        if name in _SWITCHES:
            argv += [flag] if value else []
        elif name == "rslora":
            argv.append("--rslora" if value else "--no-rslora")
        elif name == "partition" and not isinstance(value, str):
            raise TrainError("train_command: a partition of rules needs its YAML file")
        elif name == "target_modules":
            argv += [flag, ",".join(value)]
        elif name == "save_dtype" and value is None:
            raise TrainError("train_command: save_dtype None has no flag")
        elif value is not None:
            argv += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return argv
