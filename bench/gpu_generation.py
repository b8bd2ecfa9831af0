"""Greedy generation on a GPU: our decoding paths against transformers' own ``generate``.

    python bench/gpu_generation.py [--device cuda] [--params 1.1e9] [--n 32] [--tokens 96]
                                   [--dtypes bfloat16 float32] [--repeat 2] [--no-cudnn-sdp]
                                   [--tokenizer DIR] [--mgsm DIR] [--json OUT.json]

A synthetic Llama of ``--params`` (bench/synthetic.py, the SmolLM2 vocabulary and tokenizer)
answers the first ``--n`` MGSM Swahili prompts (2 shots, direct), ``--tokens`` tokens each
(no stop strings), batch 16, in each dtype, ``--repeat`` rounds of:
  ours           ``generate`` as evaluation uses it (shared prefix, split prompt pass, refill,
                 drafted tokens);
  ours, no drafts  the same with ``lookahead=0``;
  transformers   ``model.generate`` on left-padded batches of 16 (what lm-eval's HF backend
                 runs), greedy, ``min_new_tokens`` = ``max_new_tokens``.
Each run reports its wall time (synchronised), its forward passes by width (count, mean ms),
and its texts compared with the others. Rounds repeat, in reversed order every other round, so
that work done once per shape in a process (kernel selection, attention plans) shows as the
difference between rounds; ``--contenders`` picks which run, so that each can also be timed
cold, alone in its own process. ``--no-cudnn-sdp`` turns off PyTorch's cuDNN attention backend
for the whole run.

Measured 2026-11-27 on an NVIDIA H200 (torch 2.11.0+cu130), 1.1B, in one process after a
warm-up, before this script existed (its one-off forerunners, same calls):
  48 prompts x 128 tokens, bfloat16: ours 27.6 s first, 9.6 s third; no drafts, no refill, no
  shared prefix 21.7 s; transformers 5.8 s. float32: ours 8.5 s first, 6.2 s third;
  transformers 8.4 s; texts identical 48/48 across all three in float32, 0/48 in bfloat16
  (random weights: near ties everywhere).
  32 x 96, bfloat16, after a warm-up: ours 12.2 s (forward passes of width 1: 60 ms each,
  attention 8.7 s of it); ours without drafts 3.7 s (18 ms a pass); transformers 4.2 s
  (20 ms a pass); the padded path 12.3 s (62 ms a pass).
In both, transformers ran last, after our runs had met most cache lengths. Separated on
2026-11-27 (H200, 32 x 96, bfloat16, each contender alone in a fresh process, rounds 1 and 2):
with PyTorch's default cuDNN attention ours took 17.1 and 4.2 s, transformers 13.9 and 3.3 s;
with ``--no-cudnn-sdp`` ours 3.5 and 2.8 s, transformers 3.2 and 3.0 s. cuDNN plans every new
shape, and decoding meets a new cache length at each step. Our generation now runs without
cuDNN's attention on CUDA (``inference.attention.without_cudnn_attention``): ours 3.0 and
2.4 s alone after that, transformers (default settings) 14.0 and 4.4 s. Without CUDA and
``--device cuda`` it prints "no GPU: not run".
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


CONTENDERS = ("ours", "ours, no drafts", "transformers")


def sync(device: str) -> None:
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Passes:
    """Forward passes of a model, by input width: count and seconds (forward hooks)."""

    def __init__(self, model):
        self.calls: list[tuple[int, float]] = []
        self._t = 0.0
        model.register_forward_pre_hook(self._pre, with_kwargs=True)
        model.register_forward_hook(self._post, with_kwargs=True)

    def _pre(self, module, args, kwargs):
        self._t = time.perf_counter()

    def _post(self, module, args, kwargs, out):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            self.calls.append((int(ids.shape[1]), time.perf_counter() - self._t))

    def summary(self) -> dict:
        by: dict[str, list[float]] = {}
        for width, seconds in self.calls:
            by.setdefault(str(width) if width <= 17 else "prompt", []).append(seconds)
        return {k: [len(v), round(1000 * sum(v) / len(v), 1)] for k, v in sorted(by.items())}


def transformers_generate(model, tok, prompts, tokens: int, device: str) -> list[str]:
    import torch
    side = tok.padding_side
    tok.padding_side = "left"
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    out = []
    try:
        for i in range(0, len(prompts), 16):
            enc = tok(prompts[i:i + 16], return_tensors="pt", padding=True,
                      add_special_tokens=False).to(device)
            with torch.inference_mode():
                ids = model.generate(**enc, max_new_tokens=tokens, min_new_tokens=tokens,
                                     do_sample=False, pad_token_id=pad)
            out += [tok.decode(r[enc["input_ids"].shape[1]:], skip_special_tokens=True)
                    for r in ids]
    finally:
        tok.padding_side = side
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--params", type=float, default=1.1e9)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"],
                    choices=["bfloat16", "float32"])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-cudnn-sdp", action="store_true")
    ap.add_argument("--contenders", nargs="+", default=list(CONTENDERS), choices=CONTENDERS)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/layerswap-gpu-generation"))
    ap.add_argument("--tokenizer", type=Path, help="tokenizer folder (default: embedded SmolLM2)")
    ap.add_argument("--mgsm", type=Path, help="MGSM folder (default: the usual lookup)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    import torch

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"verdict": "no GPU: not run"}))
        return 0
    if a.no_cudnn_sdp:
        torch.backends.cuda.enable_cudnn_sdp(False)
    from app_scale import write_model

    from layerswap_core.checkpoints.loading import load_model
    from layerswap_core.evaluation.data import load_mgsm
    from layerswap_core.inference.generation import generate
    from layerswap_core.evaluation.runner import default_exemplars, side_by_side_task

    write_model(a.dir, a.params, seed=1, tokenizer=a.tokenizer)
    items = load_mgsm("sw", a.mgsm)[:a.n]
    task = side_by_side_task(items, default_exemplars(items, 2, cot=False, data_dir=a.mgsm),
                             max_new_tokens=a.tokens, with_nll=False)
    result = {"device": torch.cuda.get_device_name(0) if a.device.startswith("cuda")
              else a.device, "torch": torch.__version__, "params": a.params, "n": a.n,
              "tokens": a.tokens, "cudnn_sdp": not a.no_cudnn_sdp, "runs": []}
    for dtype in a.dtypes:
        model, tok = load_model(str(a.dir), device=a.device, dtype=getattr(torch, dtype))
        passes = Passes(model)
        prompts = task.prompts(tok)
        runs = {
            "ours": lambda: [g.text for g in generate(model, tok, prompts, stop=(),  # noqa: F821
                                                      max_new_tokens=a.tokens, batch_size=16)],
            "ours, no drafts": lambda: [g.text for g in generate(
                model, tok, prompts, stop=(), max_new_tokens=a.tokens, batch_size=16,  # noqa: F821
                lookahead=0)],
            "transformers": lambda: transformers_generate(model, tok, prompts, a.tokens,  # noqa: F821
                                                          a.device),
        }
        chosen = [c for c in CONTENDERS if c in a.contenders]
        for rnd in range(1, a.repeat + 1):
            texts = {}
            for name in (chosen if rnd % 2 else chosen[::-1]):
                run = runs[name]
                passes.calls.clear()
                sync(a.device)
                t = time.perf_counter()
                texts[name] = run()
                sync(a.device)
                row = {"dtype": dtype, "round": rnd, "run": name,
                       "seconds": round(time.perf_counter() - t, 2),
                       "passes": passes.summary()}
                result["runs"].append(row)
                print(json.dumps(row), flush=True)
            same = {f"{x} = {y}": sum(p == q for p, q in zip(texts[x], texts[y]))
                    for x, y in (("ours", "ours, no drafts"), ("ours", "transformers"))
                    if x in texts and y in texts}
            result["runs"].append({"dtype": dtype, "round": rnd, "identical": same,
                                   "of": len(prompts)})
            print(dtype, rnd, same, f"of {len(prompts)}", flush=True)
        del model, passes
        if a.device.startswith("cuda"):
            torch.cuda.empty_cache()
        if a.json:
            a.json.write_text(json.dumps(result, indent=1))
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
