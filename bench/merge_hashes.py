"""sha256 of every tensor file a disk merge writes, for every registered method on the tiny trio.

    python bench/merge_hashes.py [--out hashes.json] [--compare before.json] [--block-bytes N]

Builds the tiny base/task/lang trio of ``layerswap_core.testing`` (float32, 8 layers, vocab of
the embedded SmolLM2) in a temporary folder, merges it with every method of the registry and the
layer-swap variants below, and prints one line per output ``*.safetensors`` file (config, file,
sha256). ``--compare`` checks the hashes against a saved run (exit status 1 on any difference):
the check that a change to the merge code left every output bit-identical. ``--block-bytes``
sets ``merge.apply.BLOCK_BYTES`` and ``LARGE_BLOCK_BYTES`` (the row-block sizes of blends),
e.g. 4096 to force every blend of the tiny models through many row blocks.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (name, MergeConfig keyword arguments, whether the base model is given)
CONFIGS = [
    ("layer_swap default (non-layer blend)", {}, False),
    ("layer_swap --non-layer lang", {"non_layer": "lang"}, False),
    ("layer_swap --non-layer task", {"non_layer": "task"}, False),
    ("layer_swap transitions 2+2", {"transition_bottom": 2, "transition_top": 2}, False),
    ("layer_swap transitions 2+2 w 2:1", {"transition_bottom": 2, "transition_top": 2,
                                          "w_task": 2.0, "w_lang": 1.0}, False),
    ("layer_swap transitions 2+2 magnitude", {"bottom": 1, "top": 1, "transition_bottom": 2,
                                              "transition_top": 2, "magnitude_weights": True}, True),
    ("layer_swap partition A", {"partition": "A", "scale_partition": True}, False),
    ("layer_swap bfloat16", {"transition_bottom": 2, "transition_top": 2,
                             "dtype": "bfloat16"}, False),
    ("soup", {"method": "soup"}, False),
    ("soup 3:1 float16", {"method": "soup", "w_task": 3.0, "w_lang": 1.0, "dtype": "float16"},
     False),
    ("soup magnitude", {"method": "soup", "magnitude_weights": True}, True),
    ("magnitude_soup", {"method": "magnitude_soup"}, True),
    ("task_arithmetic", {"method": "task_arithmetic", "lambda_task": 0.7, "lambda_lang": 1.3},
     True),
    ("ties", {"method": "ties"}, True),
    ("ties d=0.5 lam=0.8 bfloat16", {"method": "ties", "ties_density": 0.5, "ties_lambda": 0.8,
                                      "dtype": "bfloat16"}, True),
    ("ties d=1", {"method": "ties", "ties_density": 1.0}, True),
]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="write the hashes here (JSON)")
    ap.add_argument("--compare", type=Path, help="compare with hashes saved by an earlier run")
    ap.add_argument("--block-bytes", type=int, help="row-block size of blends (merge.apply)")
    ap.add_argument("--models", type=Path, help="reuse (or build) the tiny trio in this folder")
    a = ap.parse_args()

    import torch
    torch.set_num_threads(1)
    from layerswap_core.merge.registry import MERGE_METHODS
    from layerswap_core.merge.config import MergeConfig
    from layerswap_core.merge.executor import merge_to_folder
    from layerswap_core.testing import tiny_family
    if a.block_bytes:
        from layerswap_core.merge import apply
        apply.BLOCK_BYTES = apply.LARGE_BLOCK_BYTES = a.block_bytes

    missing = set(MERGE_METHODS) - {kw.get("method", "layer_swap") for _, kw, _ in CONFIGS}
    if missing:
        raise SystemExit(f"merge_hashes: no configuration for method(s) {sorted(missing)}; "
                         "add them to CONFIGS")
    with tempfile.TemporaryDirectory(prefix="layerswap-hashes-") as tmp:
        models_dir = a.models or Path(tmp) / "models"
        if (models_dir / "lang" / "config.json").exists():
            trio = {r: models_dir / r for r in ("base", "task", "lang")}
        else:
            trio = tiny_family(models_dir)
        hashes: dict[str, dict[str, str]] = {}
        for label, kw, with_base in CONFIGS:
            out = Path(tmp) / "out" / str(len(hashes))
            merge_to_folder(MergeConfig(**kw), trio["task"], trio["lang"],
                            trio["base"] if with_base else None, out)
            hashes[label] = {f.name: sha256(f) for f in sorted(out.glob("*.safetensors"))}
            for name, h in hashes[label].items():
                print(f"{label:<40} {name:<36} {h}", flush=True)
    if a.out:
        a.out.write_text(json.dumps(hashes, indent=1) + "\n")
    if a.compare:
        before = json.loads(a.compare.read_text())
        diff = [k for k in set(before) | set(hashes) if before.get(k) != hashes.get(k)]
        if diff:
            print(f"DIFFERENT from {a.compare}: {', '.join(sorted(diff))}")
            raise SystemExit(1)
        print(f"all {len(hashes)} merges bit-identical to {a.compare}")


if __name__ == "__main__":
    main()
