"""Synthetic large checkpoints for benchmarks: random bf16 Llama-shaped, sharded safetensors.

    python bench/synthetic.py OUT_DIR [--params 1.1e9] [--vocab 32000] [--seed 0]
                              [--shape NAME] [--like OTHER_DIR --delta 0.01]

``--shape`` takes a published model's exact shapes instead (``SHAPES``: Llama-3.2-1B, its
embeddings tied to the LM head; TinyLlama-1.1B), random weights all the same.

``--like`` writes an "expert": the tensors of OTHER_DIR plus small noise, same names and shards.
Each checkpoint carries the side files a real one has, at a real one's size: a byte-level BPE
tokenizer.json with the config's vocabulary (Llama-3-like: 256 special tokens at the end, a
chat template in tokenizer_config.json) and a generation_config.json (``write_tokenizer``; built
once per vocabulary into the layerswap cache, then copied).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from layerswap_core.checkpoints.reading import INDEX_NAME, CheckpointReader  # noqa: E402
from layerswap_core.checkpoints.cache import build_once, cache_dir  # noqa: E402


def llama_config_for(params: float, vocab: int = 32000) -> dict:
    """A Llama config of about ``params`` parameters (hidden 2048, ``vocab`` tokens, untied)."""
    hidden, inter = 2048, 5632
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


# Published models' shapes (their config.json's fields that set a tensor's shape), for benches
# on real-shaped checkpoints: Llama-3.2-1B ties its LM head to the embeddings (one 128k x 2048
# tensor, 21% of its 1.24 B parameters); TinyLlama-1.1B has Llama-2's 32k vocabulary, untied.
SHAPES = {
    "llama-3.2-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
                     "vocab_size": 128256, "tie_word_embeddings": True,
                     "max_position_embeddings": 131072, "rope_theta": 500000.0},
    "tinyllama-1.1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
                       "num_attention_heads": 32, "num_key_value_heads": 4,
                       "vocab_size": 32000, "tie_word_embeddings": False},
}


def shape_config(name: str) -> dict:
    """A Llama config with the published model ``name``'s shapes (``SHAPES``)."""
    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}: one of {', '.join(SHAPES)}")
    return {**llama_config_for(0), **SHAPES[name]}


def tensor_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or h // heads
    kv = cfg.get("num_key_value_heads", heads) * head_dim
    out = [("model.embed_tokens.weight", (v, h))]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out += [(p + "self_attn.q_proj.weight", (heads * head_dim, h)),
                (p + "self_attn.k_proj.weight", (kv, h)), (p + "self_attn.v_proj.weight", (kv, h)),
                (p + "self_attn.o_proj.weight", (h, heads * head_dim)),
                (p + "mlp.gate_proj.weight", (i, h)), (p + "mlp.up_proj.weight", (i, h)),
                (p + "mlp.down_proj.weight", (h, i)),
                (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))]
    out.append(("model.norm.weight", (h,)))
    if not cfg.get("tie_word_embeddings"):
        out.append(("lm_head.weight", (v, h)))
    return out


# Llama-3's chat template, shortened to what a template does (roles, headers, end of turn).
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + "
                 "message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
                 "'<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
                 "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
TOKENIZER_VERSION = "1"   # bump when the tokenizer written below changes


def special_tokens() -> list[str]:
    """Llama-3's 256 special tokens, the last ids of the vocabulary."""
    named = {0: "<|begin_of_text|>", 1: "<|end_of_text|>", 6: "<|start_header_id|>",
             7: "<|end_header_id|>", 9: "<|eot_id|>"}
    return [named.get(k, f"<|reserved_special_token_{k}|>") for k in range(256)]


def special_ids(vocab_size: int) -> dict[str, int]:
    first = vocab_size - 256
    return {"bos_token_id": first, "eos_token_id": first + 9}


def _build_tokenizer(out: Path, vocab_size: int):
    """A byte-level BPE of ``vocab_size`` tokens: the 256 byte symbols, ``vocab_size - 512``
    merges of random earlier tokens (2-16 characters: real vocabularies' lengths), 256 special
    tokens. Only its size and format are real; it tokenizes text consistently, not well."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    if vocab_size < 1024:
        raise ValueError(f"a synthetic tokenizer needs a vocabulary of 1024 or more, not {vocab_size}")
    rng = random.Random(vocab_size)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(alphabet)}
    short = list(alphabet)        # the tokens new ones are built from
    merges = []
    while len(vocab) < vocab_size - 256:
        a, b = rng.choice(short), rng.choice(short if rng.random() < 0.5 else alphabet)
        token = a + b
        if token in vocab or len(token) > 16:
            continue
        vocab[token] = len(vocab)
        merges.append((a, b))
        if len(token) <= 8:
            short.append(token)
    tok = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = special_tokens()
    tok.add_special_tokens(specials)
    bos = specials[0]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab_size - 256)])
    tok.save(str(out / "tokenizer.json"))
    ids = special_ids(vocab_size)
    decoder = {str(vocab_size - 256 + k): {"content": t, "lstrip": False, "normalized": False,
                                           "rstrip": False, "single_word": False, "special": True}
               for k, t in enumerate(specials)}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "added_tokens_decoder": decoder, "bos_token": bos, "eos_token": "<|eot_id|>",
        "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2, ensure_ascii=False))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": bos, "eos_token": "<|eot_id|>"}, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {**ids, "eos_token_id": [ids["eos_token_id"], ids["bos_token_id"] + 1], "do_sample": True,
         "temperature": 0.6, "top_p": 0.9}, indent=2))
    (out / "done").write_text("")


def write_tokenizer(out: Path, vocab_size: int) -> Path:
    """The synthetic tokenizer of ``vocab_size`` tokens and a generation_config.json in ``out``
    (built once into the cache: 128k tokens take seconds)."""
    built = build_once(cache_dir() / "bench" / f"tokenizer-{vocab_size}-v{TOKENIZER_VERSION}",
                       lambda tmp: _build_tokenizer(Path(tmp), vocab_size), done="done")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
              "generation_config.json"):
        shutil.copyfile(built / f, out / f)
    return out


def write_checkpoint(out: Path, cfg: dict, seed: int = 0, like: Path | None = None,
                     delta: float = 0.01, shard_bytes: int = 1 << 30,
                     tokenizer: bool = True) -> Path:
    """``tokenizer``: with the synthetic tokenizer of the config's vocabulary (its special ids
    in the config); False: weights and config alone."""
    out.mkdir(parents=True, exist_ok=True)
    if tokenizer:
        write_tokenizer(out, cfg["vocab_size"])
        cfg = {**cfg, **special_ids(cfg["vocab_size"])}
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
    p.add_argument("--vocab", type=int, default=32000, help="vocabulary (and tokenizer) size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shape", choices=sorted(SHAPES), help="a published model's exact shapes")
    p.add_argument("--like", type=Path)
    p.add_argument("--delta", type=float, default=0.01)
    a = p.parse_args()
    cfg = (json.loads((a.like / "config.json").read_text()) if a.like else
           shape_config(a.shape) if a.shape else llama_config_for(a.params, a.vocab))
    write_checkpoint(a.out, cfg, a.seed, a.like, a.delta)
    print(a.out)


if __name__ == "__main__":
    main()
