"""The demo result from scratch (``demos.reproduce``): per held-out eval variant, the NLL of the
English worked solution after the item's own Swahili question and after another item's (the
mismatched-question control), the same after the English questions, first tokens apart; the
swap chosen on the validation variants (no swap among the choices) with each seed's language
expert, the app's default swap, and the same swap with an English-trained control expert's
outer layers; the primary statistic and the Holm-corrected secondary ones, templates as the
unit.

    python bench/demo_result.py [--n 66] [--n-validation 33] [--threads 2] [--json OUT.json]
                                [--docs docs/demo.md] [--resume WORK.json]
                                [--base REF --task REF --lang REF] [--seed-expert LABEL=REF ...]
                                [--control REF | --no-control] [--no-seeds]
    python bench/demo_result.py --from-json assets/experts/demo_result.json --docs docs/demo.md
    python bench/demo_result.py --language bn --n 150 [...]   # the Bengali trio (Gemma-3-270M)
    python bench/demo_result.py --fold 2 --rounds 2 --task DIR --lang DIR --control DIR \
        --no-seeds --json fold2.json      # a fold of the cross-fitting (bench/demo_crossfit.py)

Defaults: the embedded demo trio and its two more seeds (``embedded:smollm2-swahili-seed1``,
``-seed2``); a control expert only with ``--control REF`` (none ships: ``bench/demo_control.py``
names the controls measured and how they are trained again). ``--language bn``:
the Bengali questions and the Bengali demo trio (``embedded:gemma3-270m``, ``gemma3-math-en``,
``gemma3-bengali``; one seed, no control expert is trained for it), written by default to
``assets/experts/demo_result_bn.json``. Prints the headline
and the tables, then writes the JSON (every per-item value and every statistic;
``assets/experts/demo_result.json`` is this file for the shipped experts) and, with
``--docs``, rewrites the block between ``<!-- demo-result -->`` and ``<!-- /demo-result -->``.
``--resume FILE`` keeps every finished measurement there (keyed by the weights' digest, the
split, the question and the items) so a stopped run goes on where it was.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    import torch

    from layerswap_core.demos.reproduce import measured_demo_result, reproduce_demo_result
    from layerswap_core.demos.trios import demo

    p = build_parser()
    a = p.parse_args(argv)
    trio = demo(a.language)
    a.base, a.task, a.lang = a.base or trio.base, a.task or trio.task, a.lang or trio.lang
    a.control = a.control or trio.control
    # a trio without more seeds or a control expert runs without them
    a.no_seeds = a.no_seeds or not (a.seed_expert or trio.seeds)
    a.no_control = a.no_control or not a.control
    if a.threads:
        torch.set_num_threads(a.threads)
    t0 = time.time()

    def progress(f, m):
        print(f"[{f:4.0%} {time.time() - t0:5.0f} s] {m}", file=sys.stderr, flush=True)

    if a.from_json:
        res = measured_demo_result(a.from_json, trio=a.language)
        if res is None:
            print(f"{a.from_json}: not a demo result (version 3)", file=sys.stderr)
            return 1
    else:
        seeds = {} if a.no_seeds else dict(s.split("=", 1) for s in a.seed_expert) \
            if a.seed_expert else dict(trio.seeds)
        work = Path(a.resume) if a.resume else None
        measured = json.loads(work.read_text()) if work and work.is_file() else {}

        def keep(key, values):
            if work:
                measured[key] = values
                tmp = work.with_name(work.name + ".tmp")
                tmp.write_text(json.dumps(measured))
                tmp.replace(work)

        res = reproduce_demo_result({"base": a.base, "task": a.task, "lang": a.lang}, n=a.n,
                                    n_validation=a.n_validation, seeds=seeds,
                                    control=None if a.no_control else a.control,
                                    measured=measured, on_measured=keep,
                                    resamples=a.resamples, progress=progress,
                                    lang=trio.language, fold=a.fold, rounds=a.rounds)
    print(docs_block(res))
    if a.json:
        write_json(Path(a.json), res)
    if a.docs:
        write_docs(Path(a.docs), docs_block(res), a.docs_block)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The bench's options; ``--language`` offers every registered demo trio
    (``demos.trios``)."""
    from layerswap_core.demos.trios import DEMOS, first

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=66, help="eval variants, spread over the templates "
                   "(257: all of them)")
    p.add_argument("--n-validation", type=int, default=33)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--language", choices=list(DEMOS), default=first().key,
                   help=f"the demo trio (its question language; default: {first().key})")
    p.add_argument("--base", help="default: the language's demo trio")
    p.add_argument("--task")
    p.add_argument("--lang")
    p.add_argument("--seed-expert", action="append", metavar="LABEL=REF",
                   help="another seed's language expert (default: the trio's more seeds)")
    p.add_argument("--no-seeds", action="store_true", help="the first seed only")
    p.add_argument("--control", help="default: the trio's control expert, if it has one")
    p.add_argument("--no-control", action="store_true")
    p.add_argument("--fold", type=int, default=1, choices=(1, 2),
                   help="whose halves of the templates (demos.folds; fold 2: pass its experts "
                   "with --task/--lang/--seed-expert/--control)")
    p.add_argument("--rounds", type=int, help="measure the cross-fitted rule's eval items "
                   "(measure.rule_items: N rounds, the r-th item of every template) instead of "
                   "--n spread ones")
    p.add_argument("--resamples", type=int, default=10_000)
    p.add_argument("--json", help="write the result here")
    p.add_argument("--docs", help="rewrite the result block of this markdown file")
    p.add_argument("--docs-block", default="demo-result", help="the block's name: the text "
                   "between <!-- NAME --> and <!-- /NAME --> (fold 2's: demo-result-fold2)")
    p.add_argument("--resume", help="a file of finished measurements, read and extended")
    p.add_argument("--from-json", help="a stored result to print (and --docs), nothing rerun")
    return p


def write_json(out: Path, res: dict) -> None:
    """The result without its rendered markdown, written whole (a temporary file renamed)."""
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({k: v for k, v in res.items() if k != "markdown"}, indent=1,
                              ensure_ascii=False) + "\n")
    tmp.replace(out)


START, END = "<!-- demo-result -->", "<!-- /demo-result -->"


def docs_block(res: dict) -> str:
    from layerswap_core.demos.reproduce import headline, sweep_markdown

    return headline(res) + "\n\n" + res["markdown"] + "\n\n" + sweep_markdown(res)


def write_docs(path: Path, block: str, name: str = "demo-result") -> None:
    """Replace the text between the ``<!-- name -->`` and ``<!-- /name -->`` markers of
    ``path`` with ``block``."""
    START, END = f"<!-- {name} -->", f"<!-- /{name} -->"
    text = path.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{path}: no {START} ... {END} block to rewrite")
    head, rest = text.split(START, 1)
    path.write_text(head + START + "\n" + block + "\n" + END + rest.split(END, 1)[1])


def publish(text: str, out: dict, json_path: Path | None, docs: Path | None, block: str) -> int:
    """Print ``text``, write ``out`` to ``json_path`` and ``text`` into ``docs``' ``block``
    (the cross-fitted result's and the controls' scripts end this way)."""
    print(text)
    if json_path:
        write_json(json_path, out)
    if docs:
        write_docs(docs, text, block)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
