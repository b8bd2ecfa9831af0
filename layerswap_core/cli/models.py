"""`layerswap info` and `layerswap prepare`: describe models, build the embedded ones."""
from __future__ import annotations

from ..checkpoints.embedded import EMBEDDED_PREFIX, embedded
from ..checkpoints.references import resolve
from ..checkpoints.loading import describe
from . import HELP


def _print(fraction: float, message: str) -> None:
    print(message)


def _info(args) -> int:
    for ref in args.model:
        print(f"{ref}: {describe(ref, progress=_print).summary()}")
    return 0


def _prepare(args) -> int:
    for name in args.name or list(embedded()):
        print(f"{EMBEDDED_PREFIX}{name}: {resolve(EMBEDDED_PREFIX + name, progress=_print)}")
    return 0


def add_cli(sub):
    s = sub.add_parser("info", help=HELP["info"])
    s.add_argument("model", nargs="+")
    s.set_defaults(func=_info)
    s = sub.add_parser("prepare", help=HELP["prepare"])
    s.add_argument("name", nargs="*", help="embedded model names (default: all)")
    s.set_defaults(func=_prepare)
