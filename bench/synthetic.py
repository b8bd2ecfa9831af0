"""Synthetic large checkpoints for benchmarks: random bf16 Llama-shaped, sharded safetensors.

    python bench/synthetic.py OUT_DIR [--params 1.1e9] [--seed 0] [--like OTHER_DIR --delta 0.01]

``--like`` writes an "expert": the tensors of OTHER_DIR plus small noise, same names and shards.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from layerswap_core.checkpoints.reading import INDEX_NAME, CheckpointReader  # noqa: E402


def llama_config_for(params: float) -> dict:
    """A Llama config of about ``params`` parameters (hidden 2048, 32k vocab, untied)."""
    hidden, inter, vocab = 2048, 5632, 32000
    per_layer = 4 * hidden * hidden + 3 * hidden * inter + 2 * hidden
    layers = max(2, round((params - 2 * vocab * hidden) / per_layer))
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
            "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": 16,
            "num_key_value_heads": 16, "vocab_size": vocab, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "bos_token_id": 1, "eos_token_id": 2}


def vocab8b_config(layers: int = 2) -> dict:
    """Llama-3-8B's non-layer shapes (vocab 128,256 x hidden 4096, untied head; MLP 14,336) with
    only ``layers`` decoder layers: what a merge does with an 8B model's embeddings and LM head,
    in a few GB."""
    cfg = llama_config_for(0)
    cfg.update(hidden_size=4096, intermediate_size=14336, vocab_size=128256,
               num_hidden_layers=layers, num_attention_heads=32, num_key_value_heads=32)
    return cfg


def tensor_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    out = [("model.embed_tokens.weight", (v, h))]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "self_attn.q_proj.weight", (h, h)), (p + "self_attn.k_proj.weight", (h, h)),
                (p + "self_attn.v_proj.weight", (h, h)), (p + "self_attn.o_proj.weight", (h, h)),
                (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                (p + "mlp.down_proj.weight", (h, i)),
                (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return out


def write_checkpoint(out: Path, cfg: dict, seed: int = 0, like: Path | None = None,
                     delta: float = 0.01, shard_bytes: int = 1 << 30) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    src = CheckpointReader(like) if like else None
    shapes = tensor_shapes(cfg)
    shards: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes:
        n = 2 * int(torch.tensor(shape).prod())
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    weight_map = {}
    shape_of = dict(shapes)
    for k, names in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name in names:
            if src is not None:
                t = src.get(name).float()
                t += delta * torch.randn(t.shape, generator=gen)
            elif name.endswith("norm.weight"):
                t = torch.ones(shape_of[name])
            else:
                t = 0.02 * torch.randn(shape_of[name], generator=gen)
            tensors[name] = t.to(torch.bfloat16)
            weight_map[name] = fname
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        del tensors
    (out / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--params", type=float, default=1.1e9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--like", type=Path)
    p.add_argument("--delta", type=float, default=0.01)
    a = p.parse_args()
    cfg = json.loads((a.like / "config.json").read_text()) if a.like else llama_config_for(a.params)
    write_checkpoint(a.out, cfg, a.seed, a.like, a.delta)
    print(a.out)


if __name__ == "__main__":
    main()
