"""layerswap's cache folder, the one cached build, and LRU eviction under a byte cap.

``cache_dir`` is the cache ($LAYERSWAP_CACHE); ``build_once`` fills a folder of it once (keys
from ``cache_key``); ``evict_lru`` removes the least recently used folders until a new one fits
under a cap (the served Hub downloads, the served saves).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

MODEL_CACHES = ("embedded", "adapters", "from_bin", "deltas")  # folders of cache_dir()


def cache_dir() -> Path:
    """layerswap's cache ($LAYERSWAP_CACHE, else ~/.cache/layerswap), created if missing."""
    d = Path(os.environ.get("LAYERSWAP_CACHE") or Path.home() / ".cache" / "layerswap")
    d.mkdir(parents=True, exist_ok=True)
    return d


def cache_key(*parts) -> str:
    """The one key scheme of built caches: 16 hex digits of the sha1 of the parts as JSON (paths,
    sizes, mtimes, versions: whatever identifies the inputs)."""
    return hashlib.sha1(json.dumps(list(parts), default=str).encode()).hexdigest()[:16]


def build_once(final: str | Path, build, *, done: str = "config.json") -> Path:
    """Build a cache folder once: ``final`` as it is when it holds ``done``; else
    ``build(tmp)`` fills a temporary folder beside it, which is renamed to ``final`` atomically.
    The race rule: the first rename wins; a process that loses it uses the winner's folder, and
    its own temporary folder is removed (so is a failed build's: nothing half-written)."""
    final = Path(final)
    if (final / done).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        build(tmp)
        try:
            tmp.rename(final)
        except OSError:  # another process finished first
            if not (final / done).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def folder_bytes(folder: str | Path) -> int:
    """The bytes of the files under ``folder`` (links counted as links, not followed); 0 when
    it is not a folder."""
    total = 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def evict_lru(sizes: dict[Path, int], used: int, nbytes: int, cap: int, *,
              oldest_first: Callable[[Path], float], keep: Callable[[Path], bool]) -> int:
    """Remove folders of ``sizes`` ({folder: bytes}), least recently used first (the order of
    ``oldest_first``), skipping those ``keep`` says are in use, until ``nbytes`` more fit beside
    ``used`` bytes under ``cap``; returns the bytes then used (the caller refuses when still
    ``used + nbytes > cap``)."""
    for folder in sorted(sizes, key=oldest_first):
        if used + nbytes <= cap:
            break
        if keep(folder):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        used -= sizes[folder]
    return used
