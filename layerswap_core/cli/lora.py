"""`layerswap merge-lora`: layer swapping of two LoRA adapters over their base; `layerswap
extract-lora`: a fully fine-tuned expert as a low-rank LoRA adapter."""
from __future__ import annotations

from ..checkpoints.reading import CONFIG_DTYPES, TORCH_DTYPES
from ..checkpoints.adapters import AdapterError
from .merge import add_config_flags, config_from_args
from .progress import progress_bar
from . import HELP


def _merge_lora(args) -> int:
    cfg = config_from_args(args)
    if not (cfg.task and cfg.lang and args.base):
        raise AdapterError("merge-lora needs --task ADAPTER --lang ADAPTER --base MODEL")
    # lazy: merge.lora imports torch (1.9 s), not needed for --help
    from ..merge.lora import merge_adapters

    with progress_bar() as progress:
        out = merge_adapters(cfg, cfg.task, cfg.lang, args.base, args.out, dense=args.dense,
                             dtype=TORCH_DTYPES.get(cfg.dtype) if cfg.dtype else None,
                             overwrite=args.overwrite, force=args.force, progress=progress)
    print(f"{'dense model' if args.dense else 'PEFT adapter'} written to {out}")
    return 0


def _extract_lora(args) -> int:
    # lazy: merge.lora imports torch (1.9 s), not needed for --help
    from ..merge.lora import extract_adapter

    with progress_bar() as progress:
        res = extract_adapter(args.base, args.tuned, args.out, rank=args.rank,
                              dtype=TORCH_DTYPES[args.dtype], overwrite=args.overwrite,
                              force=args.force, progress=progress)
    print(f"PEFT adapter of {res['modules']} projections (rank {args.rank}) written to "
          f"{res['out']}; it keeps {res['kept']:.1%} of their squared change")
    return 0


def _output_flags(s):
    s.add_argument("--overwrite", action="store_true",
                   help="replace an existing layerswap output folder")
    s.add_argument("--force", action="store_true",
                   help="with --overwrite: also replace a folder that is not a layerswap output "
                        "(never an input or the model cache)")


def add_cli(subparsers):
    s = subparsers.add_parser(
        "merge-lora", help=HELP["merge-lora"],
        description="Experts given as PEFT LoRA adapters over one base: swapped layers take the "
        "language adapter, the middle the task adapter, transition layers both (ranks "
        "concatenated, exact). --task/--lang are adapter folders; --base is required.")
    add_config_flags(s)
    s.add_argument("--out", required=True, help="output folder")
    s.add_argument("--dense", action="store_true", help="write base + delta as a full model")
    _output_flags(s)
    s.set_defaults(func=_merge_lora)

    s = subparsers.add_parser(
        "extract-lora", help=HELP["extract-lora"],
        description="Each attention / MLP projection's change (tuned - base) is cut to its best "
        "rank-R approximation (truncated SVD) and saved as a PEFT LoRA adapter (scaling 1). "
        "Embeddings and norms are not carried.")
    s.add_argument("--base", required=True, help="the base model the expert was tuned from")
    s.add_argument("--tuned", required=True, help="the fully fine-tuned expert")
    s.add_argument("--rank", type=int, default=16, help="rank of every module (default 16)")
    # TORCH_DTYPES' names: CONFIG_DTYPES, read without building its torch table (importing torch)
    s.add_argument("--dtype", choices=tuple(CONFIG_DTYPES), default="bfloat16",
                   help="dtype of the saved A and B (default bfloat16)")
    s.add_argument("--out", required=True, help="output adapter folder")
    _output_flags(s)
    s.set_defaults(func=_extract_lora)
