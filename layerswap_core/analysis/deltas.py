"""Where an expert changed: streaming per-row delta statistics and their cache.

For every 1-D and 2-D parameter we compute the row-wise mean absolute value (MAV) of
``W_expert - W_base`` (a 1-D parameter is one row), reading one tensor pair at a time
(zero-copy mmap views on CPU). Each tensor keeps its *sorted* row MAVs, so the fraction of rows
above any threshold tau is a binary search: moving the threshold slider never touches a tensor. Results are cached on disk, keyed by the
identity of both checkpoints (resolved paths, file sizes and mtimes).

Experts that are not dense checkpoints (LoRA adapters) come in through a delta provider
(``providers.py``); ``suggest.py`` turns two experts' statistics into a layer-swap configuration.
"""
from __future__ import annotations

import csv
import hashlib
import io as _io
import json
import math
import os
import queue
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable, Iterable

import numpy as np
import torch

from ..checkpoints.architectures import LAYER_KIND_ORDER, get_architecture
from ..checkpoints.compatibility import open_models, problems
from ..checkpoints.reading import INDEX_NAME, CheckpointReader
from ..checkpoints.cache import cache_dir
from ..checkpoints.references import is_adapter, resolve
from ..checkpoints.loading import pick_device
from ..progress import Progress
from .providers import DeltaProvider, lora_delta_provider

CACHE_VERSION = 1
METRICS = ("frac_rows_above", "mean_row_mav", "max_row_mav", "mass")
# Rows per compute chunk are chosen so that one float32 chunk (~1 MiB) stays in cache.
CHUNK_ELEMS = 1 << 18


class DeltaMismatchError(ValueError):
    """Base and expert do not have the same tensors (names or shapes); the message names one."""


# --------------------------------------------------------------------------- statistics
@dataclass
class TensorStats:
    name: str
    layer: int | None
    kind: str
    shape: tuple[int, ...]
    mean_row_mav: float
    max_row_mav: float
    row_mavs: np.ndarray  # float32, sorted ascending; one entry per row (1-D: a single entry)

    @property
    def rows(self) -> int:
        return len(self.row_mavs)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def mass(self) -> float:
        """Sum of |delta| over all elements (row MAVs times row length)."""
        return self.mean_row_mav * self.numel

    def rows_above(self, tau: float) -> int:
        return self.rows - int(np.searchsorted(self.row_mavs, tau, side="right"))

    def frac_rows_above(self, tau: float) -> float:
        return self.rows_above(tau) / self.rows if self.rows else 0.0


@dataclass
class DeltaStats:
    """Per-tensor delta statistics of one expert against its base (threshold-free)."""

    base: str
    expert: str
    architecture: str
    num_layers: int
    tensors: list[TensorStats]
    threshold: float | None = None  # default tau for table()/grid(); None: auto_threshold()
    label: str = "expert"
    skipped: list[str] = field(default_factory=list)  # tensors that are not 1-D, 2-D or 3-D
    from_cache: bool = False
    seconds: float = 0.0

    # --- threshold ---
    def tau(self, tau: float | None = None) -> float:
        if tau is not None:
            return float(tau)
        return self.threshold if self.threshold is not None else auto_threshold(self)

    # --- views ---
    def table(self, tau: float | None = None) -> list[dict]:
        """One row per tensor: name, layer, kind, shape, mean_row_mav, max_row_mav, frac_rows_above."""
        t = self.tau(tau)
        return [{"name": s.name, "layer": s.layer, "kind": s.kind, "shape": list(s.shape),
                 "mean_row_mav": s.mean_row_mav, "max_row_mav": s.max_row_mav,
                 "frac_rows_above": s.frac_rows_above(t)} for s in self.tensors]

    def kinds(self) -> list[str]:
        """Module kinds present in decoder layers, in display order."""
        present = {s.kind for s in self.tensors if s.layer is not None}
        order = [k for k in LAYER_KIND_ORDER if k in present]
        return order + sorted(present - set(order))

    def grid(self, metric: str = "frac_rows_above", tau: float | None = None,
             kinds: Iterable[str] | None = None) -> tuple[list[int], list[str], np.ndarray]:
        """(layers, kinds, values[layer, kind]) over decoder layers; NaN where a kind is absent.

        Tensors sharing a cell (q_norm and k_norm, weight and bias) are pooled: fraction of all
        their rows above tau, row-weighted mean MAV, max of maxima, summed mass.
        """
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
        t = self.tau(tau)
        kinds = list(kinds) if kinds is not None else self.kinds()
        col = {k: j for j, k in enumerate(kinds)}
        layers = list(range(self.num_layers))
        num = np.zeros((len(layers), len(kinds)))
        den = np.zeros_like(num)
        mx = np.full_like(num, np.nan)
        for s in self.tensors:
            if s.layer is None or s.kind not in col or s.layer >= self.num_layers:
                continue
            i, j = s.layer, col[s.kind]
            if metric == "frac_rows_above":
                num[i, j] += s.rows_above(t)
                den[i, j] += s.rows
            elif metric == "mean_row_mav":
                num[i, j] += s.mean_row_mav * s.rows
                den[i, j] += s.rows
            elif metric == "mass":
                num[i, j] += s.mass
                den[i, j] = 1
            else:
                mx[i, j] = s.max_row_mav if np.isnan(mx[i, j]) else max(mx[i, j], s.max_row_mav)
        if metric == "max_row_mav":
            return layers, kinds, mx
        with np.errstate(invalid="ignore", divide="ignore"):
            return layers, kinds, np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)

    def layer_profile(self) -> np.ndarray:
        """Total delta mass (sum of |delta| over all elements) of each decoder layer."""
        out = np.zeros(self.num_layers)
        for s in self.tensors:
            if s.layer is not None and s.layer < self.num_layers:
                out[s.layer] += s.mass
        return out

    # --- export ---
    def to_csv(self, path: str | Path | None = None, tau: float | None = None) -> str:
        buf = _io.StringIO()
        cols = ["expert", "name", "layer", "kind", "shape", "mean_row_mav", "max_row_mav",
                "frac_rows_above", "threshold"]
        w = csv.DictWriter(buf, cols, lineterminator="\n")
        w.writeheader()
        t = self.tau(tau)
        for r in self.table(t):
            w.writerow({**r, "expert": self.label, "layer": "" if r["layer"] is None else r["layer"],
                        "shape": "x".join(map(str, r["shape"])), "threshold": t})
        if path is not None:
            Path(path).write_text(buf.getvalue())
        return buf.getvalue()

    def to_json(self, path: str | Path | None = None, tau: float | None = None) -> str:
        t = self.tau(tau)
        doc = {"expert": self.label, "base": self.base, "expert_path": self.expert,
               "architecture": self.architecture, "num_layers": self.num_layers, "threshold": t,
               "layer_profile": self.layer_profile().tolist(), "tensors": self.table(t)}
        text = json.dumps(doc, indent=1)
        if path is not None:
            Path(path).write_text(text)
        return text

    # --- cache (one .npz: a JSON header plus all sorted row MAVs concatenated) ---
    def save(self, path: Path):
        meta = {"version": CACHE_VERSION, "base": self.base, "expert": self.expert,
                "architecture": self.architecture, "num_layers": self.num_layers,
                "skipped": self.skipped, "seconds": self.seconds,
                "tensors": [[s.name, s.layer, s.kind, list(s.shape), s.mean_row_mav, s.max_row_mav]
                            for s in self.tensors]}
        rows = np.concatenate([s.row_mavs for s in self.tensors]) if self.tensors \
            else np.zeros(0, np.float32)
        offsets = np.cumsum([0] + [s.rows for s in self.tensors]).astype(np.int64)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".npz", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, meta=np.array(json.dumps(meta)), rows=rows, offsets=offsets)
                f.flush()
                os.fsync(f.fileno())  # complete on disk before it takes the entry's name
            os.replace(tmp, path)  # atomic: readers never see a half-written cache file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    @classmethod
    def load(cls, path: Path) -> DeltaStats:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            rows, offsets = z["rows"], z["offsets"]
        if meta.get("version") != CACHE_VERSION:
            raise ValueError(f"{path}: cache version {meta.get('version')} != {CACHE_VERSION}")
        if len(offsets) != len(meta["tensors"]) + 1 or (len(offsets) and offsets[-1] != len(rows)):
            raise ValueError(f"{path}: the cached rows do not match the cached tensors")
        tensors = [TensorStats(n, l, k, tuple(sh), mean, mx, rows[offsets[i]:offsets[i + 1]])
                   for i, (n, l, k, sh, mean, mx) in enumerate(meta["tensors"])]
        return cls(meta["base"], meta["expert"], meta["architecture"], meta["num_layers"], tensors,
                   skipped=meta["skipped"], seconds=meta["seconds"], from_cache=True)


def auto_threshold(*stats: DeltaStats) -> float:
    """A threshold that separates weakly from strongly changed tensors.

    Geometric mean of the 10th and 90th percentiles of the per-tensor mean row MAVs of the
    decoder-layer matrices (pooled over all given experts): the midpoint, on a log scale,
    between the quiet and the busy parts of the model. Deterministic, data-scaled (fine-tuning
    deltas range over orders of magnitude between models), and it lights up a planted change.
    """
    # 2-D only: norm vectors change on their own (much smaller) scale and would drag it down.
    vals = np.array([s.mean_row_mav for st in stats for s in st.tensors
                     if s.layer is not None and len(s.shape) == 2 and s.mean_row_mav > 0])
    if len(vals) == 0:
        return 1e-6
    lo, hi = np.percentile(vals, [10, 90])
    return float(math.sqrt(lo * hi))


# --------------------------------------------------------------------------- identity and cache
def _files_identity(folder: Path) -> list:
    files = sorted(list(folder.glob("*.safetensors")) + [folder / INDEX_NAME])
    return [[f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files if f.exists()]


def checkpoint_identity(folder: str | Path) -> dict:
    """What a cache entry depends on: resolved folder, weight file names, sizes and mtimes."""
    folder = Path(folder).resolve()
    return {"path": str(folder), "files": _files_identity(folder)}


def cache_path(base: Path, expert_identity) -> Path:
    key = json.dumps([CACHE_VERSION, checkpoint_identity(base), expert_identity], sort_keys=True)
    return cache_dir() / "deltas" / (hashlib.sha1(key.encode()).hexdigest()[:24] + ".npz")


def _cache_entry(base_path: Path, ident) -> Path | None:
    """The cache file of this pair, or None (with a warning) when the cache cannot be used."""
    try:
        return cache_path(base_path, ident)
    except OSError as e:  # e.g. the cache folder cannot be created
        warnings.warn(f"delta cache unavailable, statistics are not cached: {e}", stacklevel=3)
        return None


def _load_cached(path: Path) -> DeltaStats | None:
    """The cached statistics, or None. An entry that cannot be read for any reason (truncated,
    emptied, garbage, old version) is deleted, so that it is recomputed and written again."""
    try:
        if not path.is_file():
            return None
        return DeltaStats.load(path)
    except Exception:  # noqa: BLE001 - BadZipFile, EOFError, ValueError, ...: all mean unreadable
        try:
            path.unlink()
        except OSError:
            pass
        return None


def _save_cached(st: DeltaStats, path: Path) -> None:
    """Write the cache entry (atomically); a failure (disk full, read-only folder) only warns:
    the statistics were computed and are returned all the same."""
    try:
        st.save(path)
    except OSError as e:
        warnings.warn(f"could not write the delta cache {path}: {e}", stacklevel=3)


# --------------------------------------------------------------------------- computation
def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """A tensor as rows: a vector is one row, a stack of matrices (fused experts) its matrices'
    rows one after another."""
    return t.reshape(1, -1) if t.dim() == 1 else t.reshape(-1, t.shape[-1]) if t.dim() > 2 else t


def _row_mavs(expert: torch.Tensor | None, base: torch.Tensor | None,
              delta: torch.Tensor | None) -> torch.Tensor:
    """Row MAVs of (expert - base), or of ``delta``; chunked so each float32 chunk stays in cache."""
    src = delta if delta is not None else expert
    x = _as_rows(src)
    b = None if delta is not None else _as_rows(base)
    rows, cols = x.shape
    out = torch.empty(rows, dtype=torch.float32, device=x.device)
    step = max(1, CHUNK_ELEMS // max(cols, 1))
    buf = torch.empty(step * cols, dtype=torch.float32, device=x.device)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        d = buf[: (r1 - r0) * cols].view(r1 - r0, cols)
        d.copy_(x[r0:r1])          # into float32 whatever the checkpoint dtype
        if b is not None:
            d.sub_(b[r0:r1])
        d.abs_()
        torch.mean(d, dim=1, out=out[r0:r1])
    return out


def open_tensor(reader: CheckpointReader, name: str, device: str = "cpu"):
    """(tensor, release) for one checkpoint tensor, read-only.

    On CPU the tensor is a zero-copy view of only its pages (``CheckpointReader.map_tensor``):
    the page cache is read once, by the computation itself (a pread copy would double the memory
    traffic), and ``release()`` unmaps them, so resident memory stays at the tensors in flight.
    On other devices it is read normally.
    """
    if str(device) != "cpu":
        return reader.read(name, device), lambda: None
    return reader.map_tensor(name)


def _row_mavs_parallel(expert, base, delta, pool, parts: int) -> torch.Tensor:
    """_row_mavs with the rows split over the pool's threads (each single-threaded torch).

    Python threads over row blocks scale on a busy machine where torch's own OpenMP threads,
    which synchronise on every small chunk, crawl.
    """
    src = delta if delta is not None else expert
    if src.dim() > 2:
        return _row_mavs(expert, base, delta)
    rows = src.shape[0] if src.dim() == 2 else 1
    if pool is None or parts < 2 or rows < 64 * parts:
        return _row_mavs(expert, base, delta)
    cut = [rows * i // parts for i in range(parts + 1)]
    part = lambda t, i: None if t is None else t[cut[i]:cut[i + 1]]  # noqa: E731
    futures = [pool.submit(_row_mavs, part(expert, i), part(base, i), part(delta, i))
               for i in range(parts)]
    return torch.cat([f.result() for f in futures])


_threads_lock = threading.Lock()
_threads_state = {"users": 0, "saved": 1}


def _single_threaded_torch(enter: bool) -> int:
    """Set torch's intra-op threads to 1 while any analysis runs (restored by the last one).

    torch's thread count is process-wide; the count keeps concurrent analyses (the app serves
    several visitors) from restoring it early or to 1. Returns the thread count saved.
    """
    with _threads_lock:
        if enter:
            if _threads_state["users"] == 0:
                _threads_state["saved"] = torch.get_num_threads()
                torch.set_num_threads(1)
            _threads_state["users"] += 1
        else:
            _threads_state["users"] -= 1
            if _threads_state["users"] == 0:
                torch.set_num_threads(_threads_state["saved"])
        return _threads_state["saved"]


def _prefetch(items: list, load: Callable, depth: int = 1):
    """Yield load(item) for each item, loading up to ``depth`` ahead in a background thread.

    Overlaps file reads with computation: reading a tensor releases the GIL, as does torch.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def work():
        try:
            for it in items:
                if stop.is_set():
                    return
                q.put((it, load(it), None))
        except BaseException as e:  # noqa: BLE001 - re-raised in the consumer
            q.put((None, None, e))
        q.put(None)

    th = threading.Thread(target=work, daemon=True)
    th.start()
    try:
        while True:
            got = q.get()
            if got is None:
                return
            it, value, err = got
            if err is not None:
                raise err
            yield it, value
    finally:
        stop.set()
        while th.is_alive():  # drain so the worker can finish
            try:
                q.get(timeout=0.05)
            except queue.Empty:
                pass
        th.join()


def _open_pair(base_path: Path, expert_path: Path | None):
    """(base reader, expert reader or None), the expert checked against the base with the one
    compatibility check (same tensors, same shapes); DeltaMismatchError names the difference."""
    if expert_path is None:
        return CheckpointReader(base_path), None
    models = open_models({"base": base_path, "expert": expert_path})
    found = problems(models, exact=True, tokenizers=False)
    if found:
        raise DeltaMismatchError("; ".join(found))
    return models.readers["base"], models.readers["expert"]


def delta_stats(base, expert=None, *, threshold: float | None = None, device: str = "cpu",
                progress: Progress | None = None, cache: bool = True,
                delta_provider: DeltaProvider | None = None, label: str | None = None) -> DeltaStats:
    """Per-tensor row-MAV statistics of ``expert - base`` for every 1-D/2-D/3-D parameter.

    base, expert: model references or folders (an expert folder holding a PEFT LoRA adapter is
    read through ``lora_delta_provider``). Instead of ``expert``, a ``delta_provider`` (see
    ``DeltaProvider``) may give the deltas directly. Reads one tensor pair at a time (on CPU as
    zero-copy mmap views, unmapped after use; the next pair is mapped ahead) and computes on
    ``device`` ("cuda" when asked and present). On CPU, torch runs single-threaded meanwhile
    (restored afterwards) with the rows split over our own threads: faster on small chunks,
    much faster on a busy machine. ``threshold`` is only the default tau of the result (None:
    ``auto_threshold``); the statistics do not depend on it.
    ``cache``: reuse/write ``cache_dir()/deltas/<key>.npz`` keyed by both checkpoints' identity.
    """
    t0 = time.perf_counter()
    if expert is not None and delta_provider is not None:
        raise ValueError("give either an expert checkpoint or a delta_provider, not both")
    if expert is None and delta_provider is None:
        raise ValueError("no expert: give an expert checkpoint or a delta_provider")
    if expert is not None and is_adapter(expert):
        delta_provider, expert = lora_delta_provider(expert), None
    base_path = resolve(base)
    expert_path = resolve(expert) if expert is not None else None
    if delta_provider is not None:
        ident = getattr(delta_provider, "identity", None)
        expert_label = getattr(delta_provider, "folder", None) or "delta provider"
    else:
        ident = checkpoint_identity(expert_path)
        expert_label = expert_path
    label = label or (Path(str(expert_label)).name if expert_label != "delta provider" else "expert")

    cpath = _cache_entry(base_path, ident) if (cache and ident is not None) else None
    st = _load_cached(cpath) if cpath is not None else None
    if st is not None:
        st.threshold, st.label = threshold, label
        st.seconds = time.perf_counter() - t0
        return st

    device = pick_device(device)
    base_r, exp_r = _open_pair(base_path, expert_path)
    arch = get_architecture(base_r.config())
    # 3-D: a stack of matrices (fused experts), each matrix's rows
    names = [n for n in base_r.names() if len(base_r.shape(n)) in (1, 2, 3)]
    skipped = [n for n in base_r.names() if len(base_r.shape(n)) not in (1, 2, 3)]
    # Read shard by shard, in index order: sequential file access.
    names.sort(key=lambda n: base_r.shard(n))
    total = sum(math.prod(base_r.shape(n)) for n in names) or 1

    def load(name):  # -> (base, expert, delta, releases)
        if exp_r is not None:
            (b, rel_b), (e, rel_e) = open_tensor(base_r, name, device), open_tensor(exp_r, name, device)
            return b, e, None, (rel_b, rel_e)
        b = base_r.read(name, device)
        d = delta_provider(name)
        if d is not None and tuple(d.shape) != tuple(b.shape):
            raise DeltaMismatchError(f"tensor {name}: the delta provider gave shape {list(d.shape)} "
                                     f"but the base has {list(b.shape)}")
        return b, None, (d.to(device) if d is not None else None), ()

    tensors: list[TensorStats] = []
    done = 0
    pool, parts = None, 1
    if device == "cpu":
        # Single-threaded torch ops on ~1 MiB chunks, the rows split over our own threads.
        parts = min(_single_threaded_torch(True), 8)
        if parts > 1:
            from concurrent.futures import ThreadPoolExecutor
            pool = ThreadPoolExecutor(parts, thread_name_prefix="layerswap-delta")
    try:
        for name, (b, e, d, releases) in _prefetch(names, load):
            info = arch.classify(name)
            if exp_r is None and d is None:
                rm = torch.zeros(_as_rows(b).shape[0])
            else:
                rm = _row_mavs_parallel(e, b, d, pool, parts)
            rm_sorted = torch.sort(rm).values.cpu().numpy().astype(np.float32, copy=False)
            tensors.append(TensorStats(name, info.layer, info.kind, tuple(b.shape),
                                       float(rm.double().mean()) if rm.numel() else 0.0,
                                       float(rm_sorted[-1]) if rm.numel() else 0.0, rm_sorted))
            done += b.numel()
            del b, e, d
            for release in releases:
                release()
            if progress is not None:
                progress(done / total, f"delta statistics: {name}")
    finally:
        if device == "cpu":
            _single_threaded_torch(False)
        if pool is not None:
            pool.shutdown()
        base_r.close()
        if exp_r is not None:
            exp_r.close()
    tensors.sort(key=lambda s: (s.layer if s.layer is not None else -1, s.name))
    st = DeltaStats(str(base_path), str(expert_label), arch.name, arch.num_layers, tensors,
                    threshold=threshold, label=label, skipped=skipped)
    st.seconds = time.perf_counter() - t0
    if cpath is not None:
        _save_cached(st, cpath)
    return st
