"""`layerswap merge` and `layerswap plan`, and the merge-config flags they share with merge-lora."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..checkpoints.references import DEFAULT_BASE
from ..merge.config import FIELDS, MergeConfig
from ..merge.executor import merge_to_folder, plan_for
from ..merge.errors import ConfigError
from ..merge.mergekit_yaml import read_mergekit, to_mergekit
from .partition import partition_arg
from .progress import progress_bar
from . import HELP

MODEL_FIELDS = ("task", "lang", "base")


def flag_fields() -> tuple[str, ...]:
    """MergeConfig fields set by the flag of the same name (--partition is parsed on its own);
    read when used, so a method registered later brings its knobs' flags."""
    return tuple(name for name in FIELDS if name != "partition")


def add_config_flags(s):
    """--config, the models, and one flag per MergeConfig field (``FIELDS``: the method, the
    registered methods' knobs, dtype, tokenizer source), typed and helped from its ``Knob``."""
    g = s.add_argument_group("models")
    g.add_argument("--config", help="YAML merge config (flags given here override it)")
    g.add_argument("--from-mergekit", metavar="FILE", help="read the merge from a mergekit YAML "
                   "(models: the task expert first, the language expert second; slices: "
                   "base_model is the task expert); flags given here override it")
    for name in MODEL_FIELDS:
        g.add_argument(f"--{name}", help=FIELDS[name].help)
    g = s.add_argument_group("method")
    for knob in FIELDS.values():
        if knob.name not in MODEL_FIELDS:
            _add_flag(g, knob)


def _add_flag(group, knob):
    flag = "--" + knob.name.replace("_", "-")
    if knob.kind == "bool":
        group.add_argument(flag, action="store_true", default=None, help=knob.help)
    elif knob.kind == "choice":
        group.add_argument(flag, choices=list(knob.options()), help=knob.help or None)
    else:
        kind = {"count": int, "number": float}.get(knob.kind)
        group.add_argument(flag, **({"type": kind} if kind else {}), help=knob.help)


def config_from_args(args) -> MergeConfig:
    """The MergeConfig of the merge/plan flags (over --config), every field checked."""
    if getattr(args, "magnitude_weights", None) and (args.w_task is not None or args.w_lang is not None):
        raise ConfigError("give either --w-task/--w-lang or --magnitude-weights, not both")
    if getattr(args, "config", None) and getattr(args, "from_mergekit", None):
        raise ConfigError("give --config or --from-mergekit, not both")
    if getattr(args, "from_mergekit", None):
        cfg = read_mergekit(args.from_mergekit, task=getattr(args, "task", None))
    else:
        cfg = MergeConfig.load(args.config) if getattr(args, "config", None) else MergeConfig()
    updates = {f: getattr(args, f) for f in flag_fields() if getattr(args, f, None) is not None}
    if getattr(args, "partition", None):
        updates["partition"] = partition_arg(args.partition)
    return replace(cfg, **updates).check_fields()


def _merge(args) -> int:
    cfg = config_from_args(args)
    if args.emit_mergekit:
        _emit_mergekit(cfg, args)
        if args.out is None:
            return 0
    elif args.out is None:
        raise ConfigError("give --out DIR (or --emit-mergekit FILE to write only the mergekit YAML)")
    with progress_bar() as progress:
        out = merge_to_folder(cfg, out=args.out, device=args.device, shard_size=args.shard_size,
                              overwrite=args.overwrite, force=args.force, progress=progress)
    print(f"merged model written to {out}")
    return 0


def _emit_mergekit(cfg: MergeConfig, args):
    """Write the merge as a mergekit YAML (refused, one line, where mergekit cannot express it)."""
    text, notes = to_mergekit(cfg)
    Path(args.emit_mergekit).write_text(text)
    for note in notes:
        print(f"note: {note}")
    print(f"mergekit YAML written to {args.emit_mergekit} (run: mergekit-yaml "
          f"{args.emit_mergekit} OUTPUT_FOLDER)")


def _plan(args) -> int:
    cfg = config_from_args(args)
    if cfg.task is None:
        cfg = replace(cfg, task=DEFAULT_BASE)
        print(f"(no --task: showing the plan for the layers of {DEFAULT_BASE})")
    print(plan_for(cfg).summary_text())
    if args.show_config:
        print("\n" + cfg.to_yaml())
    return 0


def add_cli(subparsers):
    s = subparsers.add_parser("merge", help=HELP["merge"],
                              description="Layer swapping (and soup / task arithmetic / TIES "
                              "baselines), streamed tensor by tensor into HF sharded safetensors.")
    add_config_flags(s)
    g = s.add_argument_group("output")
    g.add_argument("--out", help="output folder (must not exist unless --overwrite)")
    g.add_argument("--emit-mergekit", metavar="FILE", help="also write the merge as a mergekit "
                   "YAML (without --out: only write it, merge nothing); refused with the reason "
                   "where mergekit cannot express the merge")
    g.add_argument("--overwrite", action="store_true",
                   help="replace an existing output folder (only a layerswap output, see --force)")
    g.add_argument("--force", action="store_true", help="with --overwrite: also replace a folder "
                   "that is not a layerswap output (never an input or the model cache)")
    g.add_argument("--device", default="cpu", help="cpu or cuda (blends on the GPU)")
    g.add_argument("--shard-size", default="2GB", help="maximum shard size, e.g. 2GB, 500MB")
    s.set_defaults(func=_merge)
    s = subparsers.add_parser("plan", help=HELP["plan"])
    add_config_flags(s)
    s.add_argument("--show-config", action="store_true", help="also print the config as YAML")
    s.set_defaults(func=_plan)
