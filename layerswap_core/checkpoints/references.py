"""Model references: resolving a reference to a local folder (the one entry point, ``resolve``).

A *model reference* is one of:
  * ``embedded:NAME``   -- a model that ships with the install (no network), see ``embedded``;
  * a local folder      -- Hugging Face format: config.json, *.safetensors (sharded or not), tokenizer;
  * ``owner/name``      -- a Hugging Face Hub repo id, downloaded only when the network is allowed.

``resolve`` turns any reference into a local safetensors folder; everything downstream (merge,
analysis, evaluation) works on folders. Embedded models are rows of ``embedded``'s registry; a
folder of PyTorch .bin weights is converted once into the cache (``build_once``); a Hub id is
downloaded into the local Hub cache (bounded, served downloads are ``hub``).
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

from ..progress import Progress, say
from ..settings import env_number
from .adapters import is_adapter
from .embedded import DEFAULT_BASE, EMBEDDED_PREFIX, embedded_path
from .reading import INDEX_NAME, ModelLoadError, read_config_file, weight_files
from .tokenizers import TOKENIZER_FILES
from .cache import build_once, cache_dir, cache_key
from .writing import unwritable_reason

__all__ = ["DEFAULT_BASE", "EMBEDDED_PREFIX", "ModelLoadError", "bin_weights_allowed", "check_folder",
           "check_free_space", "hub_reachable", "is_adapter", "is_offline", "read_config_file",
           "resolve"]


def is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")


def hub_address() -> tuple[str, int]:
    """(host, port) a Hub request connects to first: the HTTPS proxy when one is set, else the
    Hub's endpoint (HF_ENDPOINT, default https://huggingface.co)."""
    url = (os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
           or os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    parts = urlsplit(url if "//" in url else f"//{url}")
    return parts.hostname or "huggingface.co", parts.port or (80 if parts.scheme == "http" else 443)


_REACHED: dict[tuple[str, int], tuple[float, bool]] = {}   # address -> (when, answer)


def hub_reachable(timeout: float = 3.0, max_age: float = 60.0) -> bool:
    """Whether the Hub can be used now: not switched off (HF_HUB_OFFLINE) and a TCP connection
    to it (``hub_address``) opens within ``timeout`` seconds, name lookup included (bounded by
    a thread: getaddrinfo has no timeout of its own). The answer is kept ``max_age`` seconds."""
    if is_offline():
        return False
    address = hub_address()
    when, answer = _REACHED.get(address, (float("-inf"), False))
    if time.monotonic() - when < max_age:
        return answer
    result: list[bool] = []
    import socket   # here: 3-5 ms of every command's start-up, when imported at the top

    def probe():
        try:
            socket.create_connection(address, timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)
    thread = threading.Thread(target=probe, name="layerswap-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    answer = bool(result and result[0])
    _REACHED[address] = (time.monotonic(), answer)
    return answer


# --------------------------------------------------------------------------- resolving references
REPO_ID_PATTERN = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def _bin_files(path: Path) -> list[Path]:
    return sorted(path.glob("pytorch_model*.bin"))


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
    """A folder of PyTorch .bin weights as safetensors, converted once into the cache."""
    bins = _bin_files(path)
    key = cache_key(*[(str(b.resolve()), b.stat().st_size, b.stat().st_mtime_ns) for b in bins])
    return build_once(cache_dir() / "from_bin" / f"{path.name}-{key}",
                      lambda tmp: _write_converted(path, bins, tmp, progress))


def _write_converted(path: Path, bins: list[Path], tmp: Path, progress: Progress | None) -> None:
    import torch
    from safetensors.torch import save_file

    weight_map = {}
    for i, b in enumerate(bins):
        say(progress, i / len(bins), f"Converting {b.name} to safetensors (weights_only=True)...")
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


# allow_bin's default where a caller does not pass it: False, or what ``bin_weights_allowed``
# set for the work running in this context (the CLI's --allow-bin). A context variable, not a
# process-wide flag: a served app's other threads never see one command's choice.
_BIN_ALLOWED: contextvars.ContextVar[bool] = contextvars.ContextVar("layerswap_allow_bin",
                                                                   default=False)


@contextlib.contextmanager
def bin_weights_allowed(value: bool = True):
    """Within the block (this thread or task only), ``allow_bin`` defaults to ``value`` where a
    caller does not pass it (the CLI's --allow-bin)."""
    token = _BIN_ALLOWED.set(bool(value))
    try:
        yield
    finally:
        _BIN_ALLOWED.reset(token)


def resolve(ref: str | os.PathLike, *, allow_bin: bool | None = None,
            progress: Progress | None = None) -> Path:
    """Local safetensors folder for a model reference (see module docstring).

    A folder with safetensors weights is used as it is, whatever .bin files lie beside them (every
    path reads the safetensors); one with only PyTorch .bin weights is refused unless
    ``allow_bin`` (default: ``bin_weights_allowed``), then converted once into the cache.
    """
    if allow_bin is None:
        allow_bin = _BIN_ALLOWED.get()
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
    if REPO_ID_PATTERN.match(s) and not s.startswith((".", "~")):
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
        limit = env_number("LAYERSWAP_MAX_DOWNLOAD_GB", None, off=True)
        if size and limit is not None and limit < size / 1e9:
            raise ModelLoadError(f"{repo_id} is {size / 1e9:.2f} GB to download; the limit is "
                                 f"{limit:g} GB (LAYERSWAP_MAX_DOWNLOAD_GB)")
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
                     margin: float = 1.05, shown: str | None = None) -> None:
    """ModelLoadError when the disk holding ``folder`` has less free space than ``nbytes`` (plus
    5%): said before anything is written, not half-way. ``shown``: the folder in words (a
    server's visitors do not see its paths)."""
    folder = Path(folder)
    why = unwritable_reason(folder)
    if why:   # before the space: a folder that cannot be written is not a full disk
        if shown is not None:   # any path in the reason: the folder in words
            why = re.sub(r"(?<![\w.])/[^\s:'\"]*", shown, why)
        raise ModelLoadError(f"{what}: cannot write there ({why})")
    if not nbytes:
        return
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < nbytes * margin:
        raise ModelLoadError(f"{what} needs {_gib(nbytes)} but {shown or folder} has only {_gib(free)} "
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
