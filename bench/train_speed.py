"""Seconds per optimizer step of SFT on the embedded SmolLM2-135M: LoRA vs full, fp32 vs bf16
autocast, on this machine. Batch 4 of the demo math data (<= 256 tokens).

    python bench/train_speed.py [--steps 3] [--threads 1] [--device cpu]

Prints s/step per setting and the ratio to LoRA fp32 measured in the same run.
"""
import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from layerswap_core.demos import recipes as expert_data  # noqa: E402
from layerswap_core.training.config import TrainConfig  # noqa: E402
from layerswap_core.training.trainer import Trainer  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=3, help="timed steps per setting (after 1 warm-up)")
p.add_argument("--threads", type=int, default=1)
p.add_argument("--device", default="cpu")
a = p.parse_args()

with tempfile.TemporaryDirectory() as tmp:
    data = expert_data.write_jsonl(expert_data.math_examples("train", variants=0), f"{tmp}/d.jsonl")
    results = {}
    for mode, autocast in (("lora", False), ("lora", True), ("full", False), ("full", True)):
        cfg = TrainConfig(data=str(data), output=f"{tmp}/o", mode=mode, autocast=autocast,
                          threads=a.threads, device=a.device, batch_size=4, max_length=256,
                          steps=a.steps + 1, seed=0)
        t = Trainer(cfg)
        t.step(0)  # warm-up
        t0 = time.time()
        for s in range(1, a.steps + 1):
            t.step(s)
        results[(mode, autocast)] = (time.time() - t0) / a.steps
        print(f"{mode:5s} {'bf16 autocast' if autocast else 'fp32':13s} "
              f"{results[(mode, autocast)]:6.2f} s/step", flush=True)
        del t
    ref = results[("lora", False)]
    print("ratio to LoRA fp32: " + ", ".join(f"{m} {'bf16' if ac else 'fp32'} {v / ref:.2f}x"
                                             for (m, ac), v in results.items()))
