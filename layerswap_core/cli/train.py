"""`layerswap train`: fine-tune an expert (full, LoRA, partial, simultaneous)."""
from __future__ import annotations

import argparse
import ast
import importlib.util
import shlex
from dataclasses import fields

from ..checkpoints.loading import cpu_has_bf16, pick_device
from ..training.config import (DEFAULT_LR, MODES, PARTS, SAVE_DTYPES, SCHEDULES, TRAIN_DTYPES,
                               TrainConfig)
from .partition import partition_arg
from .progress import progress_bar
from . import HELP


def _trainer_doc() -> str:
    """``training.trainer``'s docstring (the command's description), read from its source
    without importing it: the module imports torch (1.9-2.1 s), which --help does not need."""
    spec = importlib.util.find_spec("..training.trainer", __package__)
    return ast.get_docstring(ast.parse(spec.loader.get_source(spec.name)), clean=False)


def add_cli(subparsers):
    s = subparsers.add_parser("train", help=HELP["train"],
                              description=_trainer_doc(),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    d = TrainConfig(data="", output="")
    s.add_argument("--model", default=d.model, help="base model reference (default: %(default)s)")
    s.add_argument("--data", required=True, help="training JSONL (task side in simultaneous mode)")
    s.add_argument("--out", required=True, help="output folder (adapter or full model)")
    s.add_argument("--mode", choices=MODES, default=d.mode)
    s.add_argument("--eval-data", help="validation JSONL (loss before, every --eval-every, after)")
    s.add_argument("--lang-data", help="simultaneous mode: JSONL of the language side")
    s.add_argument("--partition", help="A, B, C (the published absolute layers) or a YAML file of "
                                       "partition rules")
    s.add_argument("--scale-partition", action="store_true",
                   help="scale a preset's layer counts to this model's depth (the tool's own "
                        "rule, not the paper's)")
    s.add_argument("--train-part", choices=PARTS, default=d.train_part)
    s.add_argument("--switch-every", type=int, default=d.switch_every,
                   help="simultaneous mode: steps on one side before switching (default: 1)")
    s.add_argument("--revert", choices=PARTS, help="after training, reset this side to the base")
    s.add_argument("--lora", action="store_true",
                   help="simultaneous mode: partial LoRA (adapters on both sides' projections, "
                        "each side's adapters trained only on its own steps) instead of full SFT")
    s.add_argument("--lora-rank", type=int, default=d.lora_rank)
    s.add_argument("--lora-alpha", type=float, default=d.lora_alpha)
    s.add_argument("--lora-dropout", type=float, default=d.lora_dropout)
    s.add_argument("--rslora", action=argparse.BooleanOptionalAction, default=d.rslora,
                   help="rank-stabilised LoRA scaling alpha/sqrt(r) (default: on; --no-rslora: "
                        "alpha/r)")
    s.add_argument("--target-modules", help="comma-separated (default: attention + MLP projections)")
    s.add_argument("--steps", type=int, help="optimizer steps (default: --epochs passes; "
                                              "simultaneous mode: both sides' steps together)")
    s.add_argument("--epochs", type=float, default=d.epochs,
                   help="passes over the data (default: 1). Simultaneous mode: one epoch is one "
                        "pass over each dataset: each side gets the steps of one pass over the "
                        "dataset that needs more, rounded up to whole --switch-every blocks, the "
                        "other dataset cycles (reshuffled), and the run has twice that many steps")
    s.add_argument("--batch-size", type=int, default=d.batch_size)
    s.add_argument("--grad-accum", type=int, default=d.grad_accum)
    s.add_argument("--lr", type=float, default=None,
                   help=f"peak learning rate (default: {DEFAULT_LR['full']:g} for full, partial "
                        f"and simultaneous full-parameter SFT; {DEFAULT_LR['lora']:g} for LoRA "
                        "modes)")
    s.add_argument("--weight-decay", type=float, default=d.weight_decay)
    s.add_argument("--warmup-steps", type=int, default=d.warmup_steps,
                   help="linear warmup from 0 (default: %(default)s)")
    s.add_argument("--schedule", choices=SCHEDULES, default=d.schedule,
                   help="transformers' learning-rate schedule after warmup: constant, linear decay "
                        "to 0, cosine decay to 0, or wsd (warmup-stable-decay: constant, then "
                        "cosine decay to 0 over the last --decay-fraction of the steps) "
                        "(default: %(default)s)")
    s.add_argument("--decay-fraction", type=float, default=d.decay_fraction,
                   help="wsd: share of the steps in the final decay (default: %(default)s)")
    s.add_argument("--max-grad-norm", type=float, default=d.max_grad_norm)
    s.add_argument("--max-length", type=int, default=d.max_length)
    s.add_argument("--seed", type=int, default=d.seed)
    s.add_argument("--dtype", choices=TRAIN_DTYPES, default=d.dtype)
    s.add_argument("--autocast", action="store_true", help="bf16 autocast (fp32 weights)")
    s.add_argument("--threads", type=int, help="torch CPU threads")
    s.add_argument("--save-dtype", choices=SAVE_DTYPES, default=d.save_dtype)
    s.add_argument("--device", default=d.device, help="auto, cpu or cuda")
    s.add_argument("--eval-every", type=int, default=d.eval_every)
    s.add_argument("--eval-batches", type=int)
    s.add_argument("--save-every", type=int, default=d.save_every,
                   help="write OUT/checkpoint-<step> (a loadable model or adapter) every N steps, "
                        "to pick an expert among checkpoints; the last step is OUT itself "
                        "(default: 0, none)")
    s.add_argument("--resume", action="store_true",
                   help="go on from the last OUT/checkpoint-<step> that --save-every wrote (its "
                        "weights, optimizer, schedule, random states, data order and losses), "
                        "as if the run had not stopped; the other options must be the first "
                        "run's (--threads and --device may change); no checkpoint: start")
    s.set_defaults(func=_train)


def config_from_args(args) -> TrainConfig:
    kw = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    kw["output"] = args.out
    kw["partition"] = partition_arg(args.partition) if args.partition is not None else None
    kw["target_modules"] = [t.strip() for t in args.target_modules.split(",") if t.strip()] \
        if args.target_modules else None
    return TrainConfig(**kw)


def _mode_label(cfg: TrainConfig) -> str:
    return f"{cfg.mode} LoRA" if cfg.mode == "simultaneous" and cfg.lora else cfg.mode


def _train(args) -> int:
    cfg = config_from_args(args).validate().check_data_files()
    # lazy: training.trainer imports torch (1.9-2.1 s), not needed for --help
    from ..training.trainer import train

    print(f"learning rate {cfg.lr:g} ("
          f"{'given' if args.lr is not None else 'default for ' + _mode_label(cfg)}), "
          f"{cfg.schedule} schedule")
    if (cfg.autocast or cfg.dtype == "bfloat16") and pick_device(cfg.device) == "cpu" \
            and cpu_has_bf16() is False:
        print("note: this CPU has no bfloat16 instructions, so bf16 training runs several times "
              "slower here than float32 (leave out --autocast / --dtype bfloat16)")
    # the command that makes the expert: a resumed run's is the first run's
    argv = ["layerswap", *(a for a in args.argv if a != "--resume")]
    with progress_bar() as progress:
        res = train(cfg, progress, argv, resume=args.resume)
    print(f"{res.steps} steps in {res.seconds:.0f} s ({res.seconds_per_step:.2f} s/step), "
          f"{res.trainable_params:,} trainable parameters -> {res.output}")
    if res.eval_losses:
        print(f"validation loss {res.eval_before:.4f} -> {res.eval_after:.4f}")
    if argv:
        print("command:", shlex.join(argv))
    return 0
