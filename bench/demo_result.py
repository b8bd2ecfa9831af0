"""The demo result from scratch: per held-out eval variant, the NLL of the English worked
solution (and of its answer tokens) after the Swahili question, and after the English question
(control), for base / math expert / language expert / layer swap (the app's default, and the
best of a small sweep chosen on the validation variants) / uniform soup / each swap with the
base's outer layers (control); paired sign tests, paired t and bootstrap intervals; greedy
accuracy on ``--accuracy-n`` of the items (secondary).

    python bench/demo_result.py [--n 264] [--n-validation 33] [--accuracy-n 0] [--json OUT.json]
                                [--docs docs/demo.md] [--threads 1] [--dtype bfloat16]
                                [--base REF --task REF --lang REF]
    python bench/demo_result.py --from-json assets/experts/demo_result.json --docs docs/demo.md
                                [--add-accuracy N --json OUT.json]

Prints the headline sentence and the tables, then writes the JSON (every per-item value and
every statistic; ``assets/experts/demo_result.json`` is this file for the shipped experts) and,
with ``--docs``, rewrites the block between ``<!-- demo-result -->`` and ``<!-- /demo-result
-->`` of that file with them (``--from-json``: from a stored result, nothing rerun but, with
``--add-accuracy N``, the accuracy column on N of its items, same swaps). Cached
models are used where present (embedded experts are built once).
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

    from layerswap_core.checkpoints.loading import cpu_has_bf16
    from layerswap_core.training.demo_experts import DEMO_BASE, DEMO_LANG, DEMO_TASK
    from layerswap_core.workbench.demo import (add_accuracy, measured_demo_result,
                                               reproduce_demo_result)

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=264, help="eval variants (264: all of them)")
    p.add_argument("--n-validation", type=int, default=33)
    p.add_argument("--accuracy-n", type=int, default=0,
                   help="items (per question language) also scored by greedy accuracy")
    p.add_argument("--max-new-tokens", type=int, default=192)
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--base", default=DEMO_BASE)
    p.add_argument("--task", default=DEMO_TASK)
    p.add_argument("--lang", default=DEMO_LANG)
    p.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="the live model's dtype (default: float32 on a CPU; bfloat16 is about "
                        "2x faster on a CPU with bf16 instructions, several times slower on "
                        "one without)")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--docs", help="rewrite the result block of this markdown file")
    p.add_argument("--from-json", help="a stored result to print (and --docs), nothing rerun")
    p.add_argument("--add-accuracy", type=int, metavar="N",
                   help="with --from-json: measure the accuracy column on N of its items")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.dtype == "bfloat16" and cpu_has_bf16() is False:
        print("note: this CPU has no bfloat16 instructions: bf16 runs several times slower here "
              "than float32", file=sys.stderr)
    dtype = getattr(torch, a.dtype) if a.dtype else None
    refs = {"base": a.base, "task": a.task, "lang": a.lang}
    t0 = time.time()

    def progress(f, m):
        print(f"[{f:4.0%} {time.time() - t0:5.0f} s] {m}", file=sys.stderr, flush=True)

    if a.from_json:
        res = measured_demo_result(a.from_json)
        if res is None:
            print(f"{a.from_json}: not a demo result (version 2)", file=sys.stderr)
            return 1
        if a.add_accuracy:
            res = add_accuracy(res, refs, a.add_accuracy, a.max_new_tokens, dtype=dtype,
                               progress=progress)
    else:
        res = reproduce_demo_result(refs, n=a.n, n_validation=a.n_validation,
                                    accuracy_n=a.accuracy_n, max_new_tokens=a.max_new_tokens,
                                    dtype=dtype, progress=progress)
    print(docs_block(res))
    if a.json:
        write_json(Path(a.json), res)
    if a.docs:
        write_docs(Path(a.docs), docs_block(res))
    return 0


def write_json(out: Path, res: dict) -> None:
    """The result without its rendered markdown, written whole (a temporary file renamed)."""
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps({k: v for k, v in res.items() if k != "markdown"}, indent=1,
                              ensure_ascii=False) + "\n")
    tmp.replace(out)


START, END = "<!-- demo-result -->", "<!-- /demo-result -->"


def docs_block(res: dict) -> str:
    from layerswap_core.workbench.demo import headline, sweep_markdown

    return headline(res) + "\n\n" + res["markdown"] + "\n\n" + sweep_markdown(res)


def write_docs(path: Path, block: str) -> None:
    """Replace the text between the START and END markers of ``path`` with ``block``."""
    text = path.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"{path}: no {START} ... {END} block to rewrite")
    head, rest = text.split(START, 1)
    path.write_text(head + START + "\n" + block + "\n" + END + rest.split(END, 1)[1])


if __name__ == "__main__":
    raise SystemExit(main())
