"""Batched evaluation generation vs one prompt at a time, on the embedded default model.

The same 32 MGSM prompts (direct format, 2-shot, 16 Swahili then 16 English) go through
``generation.generate`` with batch 16 (the few-shot prefix each language's prompts share is
computed once, the rows' own tokens in groups of similar length, then decoded together) and
through a plain ``model.generate`` per prompt; both greedy with the same token limit and stop
strings. Prints generated tokens/s of each and the ratio (target >= 4x on CPU), and how many
outputs are identical. With ``--repeat N`` the two runs alternate N times and the best time of
each counts (a shared machine only ever adds time).

By default all prompts stop at the Swahili question word, so the English ones run to the token
limit; ``--lang-stops`` gives each language its own stop strings, as ``evaluate`` does: the
outputs then end right after the answer (about 8 tokens), reading the prompts dominates and the
ratio is lower.

    python bench/eval_bench.py [--model REF] [--batch-size 16] [--max-new-tokens 32]
                               [--cot] [--lang-stops] [--repeat N] [--threads N]
    python bench/eval_bench.py --nll [--repeat N]   # gold-solution NLL: shared prefix vs padded
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def bench_prompts(n: int = 32, shots: int = 2, cot: bool = False) -> list[str]:
    from layerswap_core.evaluation import runner as ev
    from layerswap_core.evaluation.registry import load_items
    from layerswap_core.demos import variants as _demo_task  # noqa: F401  (registers demo-variants)

    prompts = []
    for lang in ("sw", "en"):
        items = load_items("mgsm", lang, n // 2)
        ex = ev.select_exemplars(ev.exemplar_pool(lang, cot=cot), items, shots)
        prompts += [ev.build_prompt(it, ex, cot=cot) for it in items]
    return prompts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model reference (default: models.DEFAULT_BASE)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=None, help="default: 32 direct, 128 CoT")
    p.add_argument("--cot", action="store_true", help="chain-of-thought prompts (longer outputs)")
    p.add_argument("--shots", type=int, default=2, help="exemplars per prompt (as evaluated: 2)")
    p.add_argument("--lang-stops", action="store_true",
                   help="each language's own stop strings (default: Swahili's for all prompts)")
    p.add_argument("--repeat", type=int, default=1, help="alternate both runs N times, keep the best")
    p.add_argument("--nll", action="store_true",
                   help="instead: gold-solution NLL of 32 GSM-Symbolic Swahili items, shared "
                        "prefix + grouped vs one left-padded batch (batch 8)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--device", default="auto")
    args = p.parse_args()

    import torch

    from layerswap_core.evaluation import runner as ev
    from layerswap_core.inference.generation import generate
    from layerswap_core.checkpoints.references import DEFAULT_BASE
    from layerswap_core.checkpoints.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.model or DEFAULT_BASE, device=args.device)
    device = next(model.parameters()).device
    args.max_new_tokens = args.max_new_tokens or (128 if args.cot else 32)
    if args.nll:
        return nll_bench(model, tok, args)
    prompts = bench_prompts(32, args.shots, args.cot)
    half = len(prompts) // 2
    stops = ([ev.stop_strings("sw")] * half + [ev.stop_strings("en" if args.lang_stops else "sw")]
             * (len(prompts) - half))
    print(f"model {args.model or DEFAULT_BASE} on {device} ({model.dtype}), torch threads "
          f"{torch.get_num_threads()}, {len(prompts)} prompts ({args.shots}-shot "
          f"{'CoT' if args.cot else 'direct'} MGSM sw+en), max_new_tokens {args.max_new_tokens}, "
          f"stop strings: {'each language its own' if args.lang_stops else 'Swahili for all'}",
          flush=True)
    generate(model, tok, prompts[:2], max_new_tokens=4, batch_size=2)   # warm-up

    def run_batched():
        out = []
        for lo, hi in ((0, half), (half, len(prompts))):   # one call per stop list, as evaluate
            out += generate(model, tok, prompts[lo:hi], max_new_tokens=args.max_new_tokens,
                            stop=stops[lo], batch_size=args.batch_size)
        return [g.text for g in out], sum(g.num_tokens for g in out)

    # Baseline: what a straightforward loop does, one model.generate call per prompt, with the
    # same greedy settings and stop strings (checked by the same cheap criterion: transformers'
    # own stop_strings costs ~1 s per call to set up, which would flatter the batched run).
    from transformers import StoppingCriteriaList

    from layerswap_core.inference.stops import StopOnStrings, cut_at_stop
    eos = tok.eos_token_id

    def run_single():
        texts, n = [], 0
        with torch.inference_mode():
            for prompt, stop in zip(prompts, stops):
                ids = tok(prompt, return_tensors="pt", add_special_tokens=False).to(device)
                width = ids["input_ids"].shape[1]
                out = model.generate(**ids, max_new_tokens=args.max_new_tokens, do_sample=False,
                                     temperature=None, top_p=None, top_k=None, pad_token_id=eos,
                                     stopping_criteria=StoppingCriteriaList(
                                         [StopOnStrings(tok, stop, width)]))
                new = out[0, width:].tolist()
                n += len(new)
                texts.append(cut_at_stop(tok.decode(new, skip_special_tokens=True), stop)[0])
        return texts, n

    best = {}
    for rep in range(max(1, args.repeat)):
        for name, fn in (("batched", run_batched), ("single", run_single)):
            t0 = time.perf_counter()
            texts, n = fn()
            dt = time.perf_counter() - t0
            label = f"batched ({args.batch_size:>3d})" if name == "batched" else "one at a time"
            print(f"[{rep + 1}] {label} : {n:5d} tokens in {dt:7.1f} s = {n / dt:7.1f} tokens/s",
                  flush=True)
            if name not in best or dt < best[name][0]:
                best[name] = (dt, n, texts)
    (t_b, n_b, batched), (t_s, n_s, single) = best["batched"], best["single"]
    same = sum(a == b for a, b in zip(batched, single))
    rate_b, rate_s = n_b / t_b, n_s / t_s
    print(f"ratio (tokens/s batched / one at a time{', best of ' + str(args.repeat) if args.repeat > 1 else ''}): "
          f"{rate_b / rate_s:.2f}x  [target >= 4x on CPU]; wall-clock ratio for the same prompts: "
          f"{t_s / t_b:.2f}x; identical outputs: {same}/{len(prompts)}")
    return 0


def nll_bench(model, tok, args) -> int:
    """Gold NLL as the sweep computes it: shared few-shot prefix vs the plain padded batch."""
    from layerswap_core.evaluation import runner as ev
    from layerswap_core.evaluation.registry import load_items
    from layerswap_core.demos import variants as _demo_task  # noqa: F401  (registers demo-variants)

    items = load_items("gsm-symbolic", "sw", 32)
    ex = ev.select_exemplars(ev.exemplar_pool("sw", cot=args.cot, source="gsm-symbolic"), items,
                             args.shots)
    prompts = [ev.build_prompt(it, ex, cot=args.cot, lang="sw") for it in items]
    targets = [ev.target_delimiter("sw", True) + ev.target_text(it, "sw", True) for it in items]
    n_tok = sum(len(tok(p + t, add_special_tokens=False)["input_ids"])
                for p, t in zip(prompts, targets))
    print(f"gold NLL of {len(items)} GSM-Symbolic sw items ({args.shots}-shot), {n_tok} tokens, "
          f"batch 8, torch threads {__import__('torch').get_num_threads()}", flush=True)
    best: dict[str, tuple[float, list[float]]] = {}
    for rep in range(max(1, args.repeat)):
        for name, share in (("shared prefix", True), ("padded batch", False)):
            t0 = time.perf_counter()
            vals = ev.gold_nll(model, tok, prompts, targets, batch_size=8, share_prefix=share)
            dt = time.perf_counter() - t0
            print(f"[{rep + 1}] {name:13s}: {dt:6.1f} s = {n_tok / dt:6.0f} tokens/s", flush=True)
            if name not in best or dt < best[name][0]:
                best[name] = (dt, vals)
    (t_s, a), (t_p, b) = best["shared prefix"], best["padded batch"]
    print(f"ratio padded / shared: {t_p / t_s:.2f}x; largest NLL difference "
          f"{max(abs(x - y) for x, y in zip(a, b)):.1e} nats/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
