"""`layerswap merge` and `layerswap plan`, and the merge-config flags they share with merge-lora."""
from __future__ import annotations

from dataclasses import replace

from ..merge.executor import merge_to_folder, plan_for
from ..checkpoints.models import DEFAULT_BASE
from ..merge.plan import DTYPES, MERGE_METHODS, MODELS, NON_LAYER_SOURCES, ConfigError, MergeConfig
from .partition import partition_arg
from .progress import progress_bar

# MergeConfig fields set by the flag of the same name (--partition is parsed on its own)
FLAG_FIELDS = ("task", "lang", "base", "method", "bottom", "top", "transition_bottom",
               "transition_top", "w_task", "w_lang", "magnitude_weights", "non_layer",
               "scale_partition", "lambda_task", "lambda_lang", "ties_density", "ties_lambda",
               "dtype", "tokenizer_source")


def add_config_flags(s):
    g = s.add_argument_group("models")
    g.add_argument("--config", help="YAML merge config (flags given here override it)")
    g.add_argument("--task", help="task (e.g. math) expert: folder, owner/name or embedded:NAME")
    g.add_argument("--lang", help="language expert")
    g.add_argument("--base", help="common base model (magnitude weights, task arithmetic, TIES)")
    g = s.add_argument_group("method")
    g.add_argument("--method", choices=list(MERGE_METHODS))
    g.add_argument("--bottom", type=int, help="bottom layers from the language expert "
                   "(default: 5 of 32, scaled to the model)")
    g.add_argument("--top", type=int, help="top layers from the language expert (default: 2 of 32, scaled)")
    g.add_argument("--transition-bottom", type=int, help="blended layers above the bottom ones")
    g.add_argument("--transition-top", type=int, help="blended layers below the top ones")
    g.add_argument("--w-task", type=float, help="blend weight of the task expert (0..1e4)")
    g.add_argument("--w-lang", type=float, help="blend weight of the language expert (0..1e4)")
    g.add_argument("--magnitude-weights", action="store_true", default=None,
                   help="blend weights = inverse mean delta from the base (needs --base; "
                   "replaces --w-task/--w-lang)")
    g.add_argument("--non-layer", choices=list(NON_LAYER_SOURCES),
                   help="layer swap: where the non-layer parameters (embeddings, final norm, LM "
                   "head) come from: blend (default; Algorithm 1 averages them with the blend "
                   "weights), task or lang")
    g.add_argument("--partition", help="A, B, C (the published presets, in absolute layers), or a "
                   "YAML file with a list of rules ({layers: '0-5', kinds: attention}; "
                   "layers: non-layer addresses the embeddings, final norm and LM head)")
    g.add_argument("--scale-partition", action="store_true", default=None,
                   help="scale the presets' published layer counts (for 32/36-layer models) to "
                   "this model's depth: the tool's own rule, not the paper's")
    g.add_argument("--lambda-task", type=float,
                   help="task arithmetic scale of the task delta (-100..100)")
    g.add_argument("--lambda-lang", type=float,
                   help="task arithmetic scale of the language delta (-100..100)")
    g.add_argument("--ties-density", type=float,
                   help="TIES: fraction of each delta kept, per tensor (0 < d <= 1)")
    g.add_argument("--ties-lambda", type=float, help="TIES: scale of the merged delta (-100..100)")
    g.add_argument("--dtype", choices=list(DTYPES),
                   help="output dtype (default: the task expert's)")
    g.add_argument("--tokenizer-source", choices=list(MODELS),
                   help="take the tokenizer from this model (required if the vocabularies differ)")


def config_from_args(args) -> MergeConfig:
    """The MergeConfig of the merge/plan flags (over --config), every field checked."""
    if getattr(args, "magnitude_weights", None) and (args.w_task is not None or args.w_lang is not None):
        raise ConfigError("give either --w-task/--w-lang or --magnitude-weights, not both")
    cfg = MergeConfig.load(args.config) if getattr(args, "config", None) else MergeConfig()
    updates = {f: getattr(args, f) for f in FLAG_FIELDS if getattr(args, f, None) is not None}
    if getattr(args, "partition", None):
        updates["partition"] = partition_arg(args.partition)
    return replace(cfg, **updates).check_fields()


def _merge(args) -> int:
    cfg = config_from_args(args)
    with progress_bar() as progress:
        out = merge_to_folder(cfg, out=args.out, device=args.device, shard_size=args.shard_size,
                              overwrite=args.overwrite, force=args.force, progress=progress)
    print(f"merged model written to {out}")
    return 0


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
    s = subparsers.add_parser("merge", help="merge a task expert and a language expert into a folder",
                              description="Layer swapping (and soup / task arithmetic / TIES "
                              "baselines), streamed tensor by tensor into HF sharded safetensors.")
    add_config_flags(s)
    g = s.add_argument_group("output")
    g.add_argument("--out", required=True, help="output folder (must not exist unless --overwrite)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace an existing output folder (only a layerswap output, see --force)")
    g.add_argument("--force", action="store_true", help="with --overwrite: also replace a folder "
                   "that is not a layerswap output (never an input or the model cache)")
    g.add_argument("--device", default="cpu", help="cpu or cuda (blends on the GPU)")
    g.add_argument("--shard-size", default="2GB", help="maximum shard size, e.g. 2GB, 500MB")
    s.set_defaults(func=_merge)
    s = subparsers.add_parser("plan", help="show which model every layer comes from (reads no tensors)")
    add_config_flags(s)
    s.add_argument("--show-config", action="store_true", help="also print the config as YAML")
    s.set_defaults(func=_plan)
