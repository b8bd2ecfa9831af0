"""Building a demo expert: base + LoRA adapter written as a full model folder.

In one run, on the embedded SmolLM2 and a shipped adapter: ``adapters.apply_adapter`` (streams the
base tensor by tensor, adds (B @ A) * scale to the adapted weights) vs what it replaced, PEFT's
``merge_and_unload`` on a loaded model followed by ``save_pretrained`` (timed from its first
import of peft, as in a fresh app process). Prints both times, the ratio, and whether the two
folders hold identical tensors.

    python bench/adapter_bench.py [--adapter smollm2-math-en] [--threads N]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--adapter", default="smollm2-math-en", help="a shipped demo adapter")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()

    import torch

    from layerswap_core.checkpoints import embedded as experts
    from layerswap_core.checkpoints.reading import CheckpointReader
    from layerswap_core.checkpoints.adapters import apply_adapter
    from layerswap_core.checkpoints.references import DEFAULT_BASE, resolve
    from layerswap_core.checkpoints.loading import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    base = resolve(DEFAULT_BASE)
    adapter = experts.demo_adapter_dir(args.adapter)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        ours = apply_adapter(base, adapter, Path(tmp) / "streamed")
        t_ours = time.perf_counter() - t0

        t0 = time.perf_counter()
        from peft import PeftModel   # a first import in this process, as in the app
        t_import = time.perf_counter() - t0
        model, tok = load_model(base, device="cpu", dtype=torch.float32)
        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().to(torch.bfloat16)
        model.save_pretrained(Path(tmp) / "peft", safe_serialization=True)
        tok.save_pretrained(Path(tmp) / "peft")
        t_peft = time.perf_counter() - t0

        a, b = CheckpointReader(ours), CheckpointReader(Path(tmp) / "peft")
        same = sorted(a.names()) == sorted(b.names()) and all(
            torch.equal(a.get(n), b.get(n)) for n in a.names())
    print(f"streamed apply_adapter        : {t_ours:6.2f} s")
    print(f"PEFT merge_and_unload + save  : {t_peft:6.2f} s (of which importing peft {t_import:.2f} s)")
    print(f"ratio PEFT / streamed: {t_peft / t_ours:.1f}x ({(t_peft - t_import) / t_ours:.1f}x with "
          f"peft already imported); identical tensors: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
