"""`layerswap demo-data`: write a demo expert's training data (chat JSONL) from its recipe."""
from __future__ import annotations

from ..training import recipes


def _demo_data(args) -> int:
    rows = recipes.RECIPES[args.recipe](args.split, seed=args.seed)
    recipes.write_jsonl(rows, args.out)
    print(f"{len(rows)} examples -> {args.out}")
    return 0


def add_cli(sub):
    s = sub.add_parser("demo-data", help="write a demo expert's training data (chat JSONL)",
                       description=recipes.__doc__.split("\n\n")[0])
    s.add_argument("recipe", choices=sorted(recipes.RECIPES))
    s.add_argument("--split", choices=sorted(recipes.SPLITS), default="train")
    s.add_argument("--seed", type=int, default=recipes.SEED)
    s.add_argument("--out", required=True, help="the JSONL file to write")
    s.set_defaults(func=_demo_data)
