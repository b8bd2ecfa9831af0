"""Batched evaluation generation vs one prompt at a time, on the embedded default model.

The same 32 MGSM prompts (direct format, 2-shot, 16 Swahili then 16 English) go through
``generation.generate`` with batch 16 (length-sorted; the few-shot prefix each language's
prompts share is computed once) and through a plain ``model.generate`` per prompt; both
greedy with the same token limit. Prints generated tokens/s
of each and the ratio (target >= 4x on CPU), and how many outputs are identical.

    python bench/eval_bench.py [--model REF] [--batch-size 16] [--max-new-tokens 32] [--threads N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def bench_prompts(n: int = 32, shots: int = 2, cot: bool = False) -> list[str]:
    from layerswap_core import evaluate as ev
    from layerswap_core.data import load_items

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
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--device", default="auto")
    args = p.parse_args()

    import torch

    from layerswap_core import evaluate as ev
    from layerswap_core.generation import generate
    from layerswap_core.models import DEFAULT_BASE, load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(args.model or DEFAULT_BASE, device=args.device)
    device = next(model.parameters()).device
    args.max_new_tokens = args.max_new_tokens or (128 if args.cot else 32)
    prompts = bench_prompts(32, args.shots, args.cot)
    stop = ev.stop_strings("sw")
    print(f"model {args.model or DEFAULT_BASE} on {device} ({model.dtype}), torch threads "
          f"{torch.get_num_threads()}, {len(prompts)} prompts ({args.shots}-shot {'CoT' if args.cot else 'direct'} MGSM sw+en), "
          f"max_new_tokens {args.max_new_tokens}",
          flush=True)
    generate(model, tok, prompts[:2], max_new_tokens=4, batch_size=2)   # warm-up

    t0 = time.perf_counter()
    batched = generate(model, tok, prompts, max_new_tokens=args.max_new_tokens, stop=stop,
                       batch_size=args.batch_size)
    t_batched = time.perf_counter() - t0
    n_batched = sum(g.num_tokens for g in batched)
    print(f"batched ({args.batch_size:>3d}) : {n_batched:5d} tokens in {t_batched:7.1f} s = "
          f"{n_batched / t_batched:7.1f} tokens/s", flush=True)

    # Baseline: what a straightforward loop does, one model.generate call per prompt, with the
    # same greedy settings and stop strings (checked by the same cheap criterion: transformers'
    # own stop_strings costs ~1 s per call to set up, which would flatter the batched run).
    from transformers import StoppingCriteriaList

    from layerswap_core.generation import _StopOnStrings, cut_at_stop
    eos = tok.eos_token_id
    t0 = time.perf_counter()
    single, n_single = [], 0
    with torch.inference_mode():
        for prompt in prompts:
            ids = tok(prompt, return_tensors="pt", add_special_tokens=False).to(device)
            width = ids["input_ids"].shape[1]
            out = model.generate(**ids, max_new_tokens=args.max_new_tokens, do_sample=False,
                                 temperature=None, top_p=None, top_k=None, pad_token_id=eos,
                                 stopping_criteria=StoppingCriteriaList(
                                     [_StopOnStrings(tok, stop, width)]))
            new = out[0, width:].tolist()
            n_single += len(new)
            single.append(cut_at_stop(tok.decode(new, skip_special_tokens=True), stop)[0])
    t_single = time.perf_counter() - t0

    same = sum(a.text == b for a, b in zip(batched, single))
    rate_b, rate_s = n_batched / t_batched, n_single / t_single
    print(f"one at a time : {n_single:5d} tokens in {t_single:7.1f} s = {rate_s:7.1f} tokens/s")
    print(f"ratio (tokens/s batched / one at a time): {rate_b / rate_s:.2f}x  "
          f"[target >= 4x on CPU]; wall-clock ratio for the same prompts: "
          f"{t_single / t_batched:.2f}x; identical outputs: {same}/{len(prompts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
