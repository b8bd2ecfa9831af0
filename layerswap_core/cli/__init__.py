"""The `layerswap` command: one module of this package per command group, each with
``add_cli(subparsers)``; the library modules hold no command-line code.

A command imports only its own group's module (``COMMANDS``): `layerswap merge` on the CPU then
never imports torch (2.3 s of start-up; see ``merge/apply.py``), nor evaluation or training.
`layerswap`, `layerswap --help` and an unknown command import none (``summary_parser``)."""
from __future__ import annotations

import argparse
import gc
import importlib
import sys

from ..checkpoints.references import ModelLoadError, bin_weights_allowed

# command group module -> its commands and their one-line help, groups in --help order
# (tests/test_cli.py checks these against the commands each module's add_cli adds)
COMMANDS = {
    "models": {"info": "describe models (architecture, layers, dtype, size)",
               "prepare": "build the embedded models into the cache (offline)"},
    "check": {"check": "whether a base and two experts fit together, from their metadata "
                       "(nothing downloaded)"},
    "merge": {"merge": "merge a task expert and a language expert into a folder",
              "plan": "show which model every layer comes from (reads no tensors)"},
    "analysis": {"analyze": "where experts changed: per-tensor row-MAV delta statistics",
                 "suggest": "suggest bottom/top/transition layers from the deltas"},
    "evaluate": {"eval": "evaluate models on MGSM or GSM-Symbolic, side by side"},
    "sweep": {"sweep": "score a grid of merge configurations (locally or on Ray), resumable"},
    "train": {"train": "fine-tune an expert (full, LoRA, partial, simultaneous)"},
    "lora": {"merge-lora": "layer-swap two LoRA adapters over their base (adapter or dense "
                           "output)",
             "extract-lora": "a fully fine-tuned expert as a low-rank LoRA adapter over its base"},
    "data": {"demo-data": "write a demo expert's training data (chat JSONL)",
             "demo-variants": "regenerate the demo's GSM-Symbolic variants file (minutes; it "
                              "ships with layerswap)"}}
HELP = {name: text for names in COMMANDS.values() for name, text in names.items()}
CLI_MODULES = tuple(COMMANDS)
# Commands that read no model reference (every other one gets --allow-bin).
NO_MODEL_COMMANDS = ("prepare", "demo-data")


def _allowing_bin(func):
    """``func`` run with models' allow_bin default set from --allow-bin (restored afterwards)."""
    def run(args):
        with bin_weights_allowed(args.allow_bin):
            return func(args)
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


def _top_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    p = argparse.ArgumentParser(prog="layerswap", description=(
        "Compose LLM capabilities across languages by layer swapping. Model references: a local "
        "folder, a Hub id (owner/name, needs the network), or embedded:NAME."))
    return p, p.add_subparsers(dest="command", metavar="COMMAND")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or only of ``command``'s group when it is a known command
    (``COMMANDS``: only that group's module is imported)."""
    p, sub = _top_parser()
    groups = [g for g, names in COMMANDS.items() if command in names] or list(COMMANDS)
    for group in groups:
        importlib.import_module(f"{__name__}.{group}").add_cli(sub)
    for name, command in sub.choices.items():
        if name not in NO_MODEL_COMMANDS:
            add_allow_bin(command)
    return p


def summary_parser() -> argparse.ArgumentParser:
    """The commands and their one-line help (``HELP``) without any group's options: what
    `layerswap`, `layerswap --help` and an unknown command need, without importing the groups
    (all of them: 0.2-0.3 s)."""
    p, sub = _top_parser()
    for name, text in HELP.items():
        sub.add_parser(name, help=text, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(given[0]) if given and given[0] in HELP else summary_parser()
    args = parser.parse_args(argv)
    args.argv = given   # the command, as given
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


def run() -> None:
    """The `layerswap` command (console script, ``python -m layerswap_core``): ``main`` on the
    command line, then exit with its status. Every object is frozen first (``gc.freeze``), so the
    interpreter's last collections at shutdown skip them: that took 0.05-0.09 s of a 1.2 s
    `layerswap merge` (every file is closed by then; ``main`` called in a process that goes on
    freezes nothing)."""
    status = main()
    gc.freeze()
    sys.exit(status)
