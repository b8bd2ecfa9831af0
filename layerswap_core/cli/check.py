"""`layerswap check`: whether a trio can be merged, from metadata alone (no weights downloaded)."""
from __future__ import annotations

from ..checkpoints.preflight import check
from . import HELP


def _check(args) -> int:
    pf = check(args.base, args.task, args.lang)
    for line in pf.lines():
        print(line)
    return 0 if pf.ok else 1


def add_cli(sub):
    s = sub.add_parser("check", help=HELP["check"], description=(
        "Read what the Hub lists of each model (sizes, licence, gated), its config.json, its "
        "weight files' headers and, when nothing else differs, its tokenizer files, and say "
        "whether the models fit together (architecture, depth, shapes, vocabulary, tokenizer), "
        "what a download would fetch and the memory a live merge needs. Exit status 1 when "
        "they do not fit. Local folders and embedded: models are read as they are."))
    s.add_argument("--task", required=True, help="the task expert (the reference the others "
                   "are checked against)")
    s.add_argument("--lang", required=True, help="the language expert")
    s.add_argument("--base", default="", help="the base model (optional)")
    s.set_defaults(func=_check)
