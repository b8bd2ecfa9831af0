"""Load time of the embedded default from the cache (target: well under 2 s).

Prints, in one run: a fresh process's import cost (torch + transformers), its first load from
the cache, and a second load in the same process; and the ratio of the load to the time to read
the safetensors file once (the floor).
"""
import argparse
import subprocess
import sys

CODE = r"""
import time
t0 = time.perf_counter()
import torch, transformers
from transformers import LlamaForCausalLM  # the model classes import lazily; count them as import
from layerswap_core.checkpoints.references import DEFAULT_BASE, resolve
from layerswap_core.checkpoints.loading import load_model
from safetensors.torch import load_file
t1 = time.perf_counter()
path = resolve(DEFAULT_BASE)
load_model(DEFAULT_BASE)
t2 = time.perf_counter()
load_model(DEFAULT_BASE)
t3 = time.perf_counter()
sd = {k: v.clone() for k, v in load_file(str(path / "model.safetensors")).items()}
t4 = time.perf_counter()
print(f"imports            {t1 - t0:6.2f} s")
print(f"first load (cache) {t2 - t1:6.2f} s")
print(f"second load        {t3 - t2:6.2f} s")
print(f"read+copy tensors      {t4 - t3:6.2f} s")
print(f"ratio first load / file read: {(t2 - t1) / (t4 - t3):.1f}x")
"""

if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    sys.exit(subprocess.call([sys.executable, "-c", CODE]))
