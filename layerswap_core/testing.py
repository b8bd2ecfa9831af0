"""Tiny real models for tests and benchmarks: built from configs, saved as safetensors.

Experts are made from a base by deterministic, planted perturbations, so tests know exactly
which layers and module kinds each expert changed.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch

from .checkpoints.architectures import get_architecture
from .checkpoints.reading import CheckpointReader
from .checkpoints.references import DEFAULT_BASE, resolve
from .checkpoints.tokenizers import TOKENIZER_FILES


def tiny_config(num_layers: int = 8, hidden: int = 64, vocab_size: int = 49152, tie: bool = True,
                model_type: str = "llama"):
    from transformers import AutoConfig

    kw = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
              num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=512, tie_word_embeddings=tie,
              bos_token_id=1, eos_token_id=2, pad_token_id=2)
    if model_type in ("llama", "mistral", "qwen2", "qwen3"):
        kw["head_dim"] = hidden // 4
    return AutoConfig.for_model(model_type, **kw)


def copy_tokenizer(src: Path, dst: Path):
    for name in TOKENIZER_FILES:
        if (Path(src) / name).exists():
            shutil.copy2(Path(src) / name, Path(dst) / name)


def make_tiny_model(out: str | Path, *, seed: int = 0, num_layers: int = 8, hidden: int = 64,
                    tie: bool = True, model_type: str = "llama", dtype=torch.float32,
                    tokenizer_from: str | Path | None = DEFAULT_BASE) -> Path:
    """A randomly initialised (seeded) causal LM saved as a HF safetensors folder.

    The tokenizer (and vocabulary size) come from ``tokenizer_from`` (default: the embedded
    SmolLM2), so prompts and chat templates are real.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    vocab = 49152
    if tokenizer_from is not None:
        tok_dir = resolve(tokenizer_from)
        tok = AutoTokenizer.from_pretrained(tok_dir)
        vocab = len(tok)
        copy_tokenizer(tok_dir, out)
    cfg = tiny_config(num_layers, hidden, vocab, tie, model_type)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    with torch.no_grad():  # small default init gives near-uniform logits; make outputs varied
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.08)
    model.save_pretrained(out, safe_serialization=True)
    return out


def make_expert(base: str | Path, out: str | Path, *, seed: int,
                layer_scale: dict[int, float] | None = None, kinds: set[str] | None = None,
                global_scale: float = 0.0, default_scale: float = 0.0) -> Path:
    """Copy of ``base`` with Gaussian noise planted: std = scale * (row std of the tensor).

    ``layer_scale[l]`` sets the scale of layer l (``default_scale`` for the others); ``kinds``
    restricts the change to these module kinds; ``global_scale`` applies to non-layer tensors.
    """
    from safetensors.torch import save_file

    base, out = Path(base), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors"):
            shutil.copy2(f, out / f.name)
    reader = CheckpointReader(base)
    arch = get_architecture(reader.config())
    gen = torch.Generator().manual_seed(seed)
    shards: dict[str, dict[str, torch.Tensor]] = {}
    for name in reader.names():
        t = reader.get(name)
        info = arch.classify(name)
        if info.layer is None:
            scale = global_scale
        else:
            scale = (layer_scale or {}).get(info.layer, default_scale)
        if kinds is not None and info.kind not in kinds:
            scale = 0.0
        if scale:
            t32 = t.float()
            std = t32.std().clamp_min(1e-3) if t32.numel() > 1 else t32.abs().mean().clamp_min(1e-3)
            t = (t32 + scale * std * torch.randn(t32.shape, generator=gen)).to(t.dtype)
        shards.setdefault(reader.shard(name), {})[name] = t.contiguous()
    for shard, tensors in shards.items():
        save_file(tensors, str(out / shard), metadata={"format": "pt"})
    return out


def tiny_family(root: str | Path, num_layers: int = 8, **kw) -> dict[str, Path]:
    """base + task expert (middle layers changed) + language expert (bottom/top layers changed)."""
    root = Path(root)
    base = make_tiny_model(root / "base", seed=0, num_layers=num_layers, **kw)
    L = num_layers
    task = make_expert(base, root / "task", seed=1, default_scale=0.02,
                       layer_scale={l: 0.3 for l in range(L // 4, L - L // 4)}, global_scale=0.05)
    lang = make_expert(base, root / "lang", seed=2, default_scale=0.02,
                       layer_scale={**{l: 0.3 for l in range(L // 4)},
                                    **{l: 0.3 for l in range(L - L // 8, L)}}, global_scale=0.05)
    return {"base": base, "task": task, "lang": lang}


def mergekit_yaml() -> str | None:
    """mergekit's command in this environment (beside this Python first: ``make test`` runs the
    venv's Python without putting its bin folder on PATH), else on PATH; None without mergekit.
    requirements-dev.txt pins it for the cross-checks and the merge bench."""
    beside = Path(sys.executable).with_name("mergekit-yaml")
    return str(beside) if beside.exists() else shutil.which("mergekit-yaml")


def run_mergekit(jobs: list[tuple[Path, Path]]):
    """Run ``mergekit-yaml CONFIG OUT`` for each (config, out) in ONE subprocess (its start-up
    costs several seconds): its own entry point, ``mergekit.scripts.run_yaml.main``, on the CPU,
    with the Hub offline. Raises with mergekit's output when one fails."""
    import os
    import subprocess
    script = ("import sys\nfrom mergekit.scripts.run_yaml import main\n"
              "args = sys.argv[1:]\n"
              "for cfg, out in zip(args[::2], args[1::2]):\n"
              "    main([cfg, out], standalone_mode=False)\n")
    python, command = sys.executable, mergekit_yaml()
    if command:  # the Python mergekit-yaml runs with (its #! line)
        first = Path(command).read_text(errors="replace").split("\n", 1)[0]
        python = first[2:].strip() if first.startswith("#!") else python
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    res = subprocess.run([str(python), "-c", script, *(str(p) for job in jobs for p in job)],
                         capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"mergekit-yaml failed:\n{res.stderr[-3000:]}")
