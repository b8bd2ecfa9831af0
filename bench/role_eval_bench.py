"""Evaluation per role: the live model against loading each checkpoint (the app's old path).

For each role of the embedded demo trio (base ``embedded:smollm2-135m-instruct``, task expert
``embedded:smollm2-math-en``, language expert ``embedded:smollm2-swahili``) the same MGSM
questions (the first N Swahili and the first N English, 2-shot, direct answers, greedy) are
evaluated as the app's side-by-side evaluation does (``evaluation.runner.build_prompt`` with
the default exemplars and each language's stop strings, ``inference.generation.generate`` with
batch 16):

* live: one ``LiveModel`` (what the app holds per session) is made to show the role, then
  evaluated;
* direct: the role's checkpoint is loaded with transformers (``checkpoints.models.load_model``,
  float32 on the CPU: what the app did before the live model), then evaluated.

The two alternate, role by role, ``--repeat`` times (which of the two evaluates first alternates
too). Printed per role: seconds to show the role / to load the model, seconds of evaluation
(median, min-max), the ratio live / direct (median of the pairs: a drifting machine moves both),
and whether the outputs are identical (the text and the number of generated tokens of every
answer, every run).

    python bench/role_eval_bench.py [--n 4] [--repeat 3] [--max-new-tokens 32] [--threads 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TRIO = {"base": "embedded:smollm2-135m-instruct", "task": "embedded:smollm2-math-en",
        "lang": "embedded:smollm2-swahili"}


def question_sets(n: int, shots: int) -> list[tuple[str, list, list]]:
    """(lang, items, exemplars) for the first ``n`` MGSM questions in Swahili and in English."""
    from layerswap_core.evaluation import runner as ev
    from layerswap_core.evaluation.registry import load_items
    from layerswap_core.demos import variants as _demo_task  # noqa: F401  (registers demo-variants)

    out = []
    for lang in ("sw", "en"):
        items = load_items("mgsm", lang, n)
        out.append((lang, items, ev.default_exemplars(items, shots, cot=False)))
    return out


def evaluate_role(model, tok, sets, max_new_tokens: int) -> list[tuple[str, int]]:
    """(text, generated tokens) per question, as ``evaluate.run_side_by_side`` generates them."""
    from layerswap_core.evaluation import runner as ev
    from layerswap_core.inference.generation import generate

    out = []
    for lang, items, exemplars in sets:
        prompts = [ev.build_prompt(it, exemplars, cot=False, tokenizer=tok, lang=lang)
                   for it in items]
        gens = generate(model, tok, prompts, max_new_tokens=max_new_tokens,
                        stop=ev.stop_strings(lang), batch_size=16)
        out += [(g.text, g.num_tokens) for g in gens]
    return out


def timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4, help="questions per language (sw and en)")
    p.add_argument("--shots", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)

    import torch

    from layerswap_core.merge.live import LiveModel
    from layerswap_core.checkpoints.loading import load_model

    torch.set_num_threads(a.threads)
    sets = question_sets(a.n, a.shots)
    (live, t_open) = timed(lambda: LiveModel.from_refs(TRIO["task"], TRIO["lang"], TRIO["base"]))
    print(f"live model ({live.dtype}) opened in {t_open:.2f} s; {2 * a.n} MGSM questions "
          f"({a.n} sw + {a.n} en, {a.shots}-shot, max {a.max_new_tokens} new tokens), "
          f"{a.repeat} runs each, torch threads {torch.get_num_threads()}", flush=True)
    evaluate_role(live.model, live.tokenizer, [(s[0], s[1][:1], s[2]) for s in sets], 2)  # warm-up

    runs = {r: {"show": [], "live": [], "load": [], "direct": [], "ratio": [], "same": True,
                "tokens": 0} for r in TRIO}
    for rep in range(a.repeat):
        for role, ref in TRIO.items():
            row = runs[role]
            (model, tok), t_load = timed(lambda: load_model(ref))
            _, t_show = timed(lambda: live.show(role))
            order = ("live", "direct") if rep % 2 == 0 else ("direct", "live")  # no order bias
            for which in order:
                if which == "live":
                    got, t_live = timed(lambda: evaluate_role(live.model, live.tokenizer, sets,
                                                              a.max_new_tokens))
                else:
                    want, t_direct = timed(lambda: evaluate_role(model, tok, sets,  # noqa: F821
                                                                 a.max_new_tokens))
            del model, tok
            row["show"].append(t_show)
            row["live"].append(t_live)
            row["load"].append(t_load)
            row["direct"].append(t_direct)
            row["ratio"].append(t_live / t_direct)
            row["same"] = row["same"] and got == want
            row["tokens"] = sum(n for _, n in want)
            print(f"[{rep + 1}] {role:4s}: live show {t_show:5.2f} s + eval {t_live:6.2f} s | "
                  f"direct load {t_load:5.2f} s + eval {t_direct:6.2f} s | ratio "
                  f"{t_live / t_direct:.2f} | identical {got == want}", flush=True)

    print("\n| role | live: show | live: evaluate | direct: load | direct: evaluate | "
          "evaluate live / direct | identical outputs |")
    print("|---|---|---|---|---|---|---|")
    for role, row in runs.items():
        print(f"| {role} ({TRIO[role]}) | {spread(row['show'])} s | {spread(row['live'])} s | "
              f"{spread(row['load'])} s | {spread(row['direct'])} s | "
              f"{spread(row['ratio'])}x | {'yes' if row['same'] else 'NO'} "
              f"({2 * a.n} answers, {row['tokens']} tokens) |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"open_s": t_open, "dtype": str(live.dtype), "args": vars(a), "runs": runs},
                      f, indent=1)
    return 0 if all(row["same"] for row in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
