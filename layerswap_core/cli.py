"""The `layerswap` command. Each library module that has commands adds them with ``add_cli``."""
from __future__ import annotations

import argparse
import importlib
import sys

# Modules that contribute subcommands, in --help order. Each defines add_cli(subparsers).
CLI_MODULES = ("merge", "analysis", "evaluate", "train")
# Commands that read no model reference (every other one gets --allow-bin).
NO_MODEL_COMMANDS = ("prepare",)


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


def _allowing_bin(func):
    """``func`` run with models' allow_bin default set from --allow-bin (restored afterwards)."""
    def run(args):
        from .models import set_allow_bin_default
        before = set_allow_bin_default(args.allow_bin)
        try:
            return func(args)
        finally:
            set_allow_bin_default(before)
    return run


def add_allow_bin(parser: argparse.ArgumentParser) -> None:
    """--allow-bin on a command that loads models: folders with only PyTorch .bin weights are
    converted once to safetensors (torch.load weights_only=True) instead of refused."""
    if "--allow-bin" in parser._option_string_actions:
        return
    parser.add_argument("--allow-bin", action="store_true",
                        help="accept model folders with only PyTorch .bin weights (converted once "
                        "to safetensors in the cache, with torch.load(weights_only=True))")
    func = parser.get_default("func")
    if func is not None:
        parser.set_defaults(func=_allowing_bin(func))


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
    for name, command in sub.choices.items():
        if name not in NO_MODEL_COMMANDS:
            add_allow_bin(command)
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
