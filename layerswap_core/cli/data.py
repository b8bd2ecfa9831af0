"""`layerswap demo-data`: write a demo expert's training data (chat JSONL) from its recipe;
`layerswap demo-variants`: regenerate the demo's held-out variants file that ships in the package."""
from __future__ import annotations

from ..demos import recipes as demo_recipes   # registers the demo's recipes (and its variants)
from ..demos import variants
from ..training import recipes
from .progress import progress_bar
from . import HELP


def _demo_data(args) -> int:
    rows = recipes.recipe(args.recipe)(args.split, seed=args.seed)
    recipes.write_jsonl(rows, args.out)
    print(f"{len(rows)} examples -> {args.out}")
    return 0


def add_cli(sub):
    s = sub.add_parser("demo-data", help=HELP["demo-data"],
                       description=demo_recipes.__doc__.split("\n\n")[0])
    s.add_argument("recipe", choices=sorted(recipes.RECIPES))
    s.add_argument("--split", choices=sorted(recipes.SPLITS), default="train")
    s.add_argument("--seed", type=int, default=recipes.SEED)
    s.add_argument("--out", required=True, help="the JSONL file to write")
    s.set_defaults(func=_demo_data)
    v = sub.add_parser("demo-variants", help=HELP["demo-variants"],
                       description=variants.write_variants_file.__doc__)
    v.add_argument("--out", default=str(variants.VARIANTS_FILE),
                   help="the file to write (default: the package's own, %(default)s)")
    v.set_defaults(func=_demo_variants)


def _demo_variants(args) -> int:
    with progress_bar("variants") as bar:
        path = variants.write_variants_file(args.out, progress=bar)
    print(f"{len(variants.SPLITS)} splits x {len(variants.LANGS)} languages -> {path}")
    return 0
