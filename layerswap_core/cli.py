"""The `layerswap` command. Each library module that has commands adds them with ``add_cli``."""
from __future__ import annotations

import argparse
import importlib
import sys

# Modules that contribute subcommands, in --help order. Each defines add_cli(subparsers).
CLI_MODULES = ("merge", "analysis", "evaluate", "train")


def _info(args) -> int:
    from .models import describe
    for ref in args.model:
        print(f"{ref}: {describe(ref, progress=print).summary()}")
    return 0


def _prepare(args) -> int:
    from .models import EMBEDDED, EMBEDDED_PREFIX, resolve
    for name in args.name or list(EMBEDDED):
        print(f"{EMBEDDED_PREFIX}{name}: {resolve(EMBEDDED_PREFIX + name, progress=print)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="layerswap", description=(
        "Compose LLM capabilities across languages by layer swapping. Model references: a local "
        "folder, a Hub id (owner/name, needs the network), or embedded:NAME."))
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    s = sub.add_parser("info", help="describe models (architecture, layers, dtype, size)")
    s.add_argument("model", nargs="+")
    s.set_defaults(func=_info)
    s = sub.add_parser("prepare", help="build the embedded models into the cache (offline)")
    s.add_argument("name", nargs="*", help="embedded model names (default: all)")
    s.set_defaults(func=_prepare)
    for mod in CLI_MODULES:
        try:
            m = importlib.import_module(f"layerswap_core.{mod}")
        except ModuleNotFoundError as e:
            if e.name != f"layerswap_core.{mod}":
                raise
            continue
        if hasattr(m, "add_cli"):
            m.add_cli(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    from .models import ModelLoadError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (ModelLoadError, ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"layerswap {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # disk full, read-only or unreadable paths...: one line, no traceback
        where = f": {e.filename}" if e.filename else ""
        print(f"layerswap {args.command}: error: {e.strerror or e}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
