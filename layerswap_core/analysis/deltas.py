"""Where an expert changed: streaming per-row delta statistics, their cache, a suggested swap.

For every 1-D and 2-D parameter we compute the row-wise mean absolute value (MAV) of
``W_expert - W_base`` (a 1-D parameter is one row), reading one tensor pair at a time
(zero-copy mmap views on CPU). Each tensor keeps its *sorted* row MAVs, so the fraction of rows
above any threshold tau is a binary search: moving the threshold slider never touches a tensor. Results are cached on disk, keyed by the
identity of both checkpoints (resolved paths, file sizes and mtimes).

Experts that are not dense checkpoints plug in through a *delta provider*: any callable
``provider(name) -> torch.Tensor | None`` giving ``W_expert - W_base`` for the base parameter
``name`` (None: unchanged). ``lora_delta_provider`` builds one from a PEFT LoRA adapter folder
(delta = B @ A * scale, the merged-adapter delta); a provider with an ``identity`` string
attribute is cached like a checkpoint.

``suggest_config`` turns the per-layer delta profiles of a task and a language expert into a
layer-swap configuration (see its docstring for the formula).
"""
from __future__ import annotations

import csv
import hashlib
import io as _io
import json
import math
import mmap
import os
import queue
import re
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Protocol

import numpy as np
import torch

from ..checkpoints.architectures import KIND_GROUPS, LAYER_KIND_ORDER, get_architecture
from ..checkpoints.io import INDEX_NAME, ST_TO_DTYPE, CheckpointReader, cache_dir
from ..merge.lora import read_adapter_config
from ..checkpoints.models import is_adapter, pick_device, resolve

Progress = Callable[[float, str], None]
CACHE_VERSION = 1
METRICS = ("frac_rows_above", "mean_row_mav", "max_row_mav", "mass")
# Rows per compute chunk are chosen so that one float32 chunk (~1 MiB) stays in cache.
CHUNK_ELEMS = 1 << 18


class DeltaMismatchError(ValueError):
    """Base and expert do not have the same tensors (names or shapes); the message names one."""


class DeltaProvider(Protocol):
    """``provider(name) -> W_expert - W_base`` for base parameter ``name``, or None if unchanged.

    Optional attribute ``identity: str``: a stable description of what the provider reads
    (e.g. adapter file path + size + mtime); providers that have one are cached on disk.
    The returned tensor must have the base tensor's shape (any float dtype, any device).
    """

    def __call__(self, name: str) -> torch.Tensor | None: ...


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
    skipped: list[str] = field(default_factory=list)  # tensors that are neither 1-D nor 2-D
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

    def mean_abs_delta(self) -> float:
        """Mean of the per-tensor mean row MAVs over all 1-D/2-D parameters."""
        return float(np.mean([s.mean_row_mav for s in self.tensors])) if self.tensors else 0.0

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
    def load(cls, path: Path) -> "DeltaStats":
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


# --------------------------------------------------------------------------- LoRA adapters
class LoraDeltaProvider:
    """Delta provider for a PEFT LoRA adapter folder: delta = B @ A * scale per target module.

    Keys ``base_model.model.<module>.lora_A.weight`` map to the base parameter
    ``<module>.weight``; scale = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora), with
    per-module ``rank_pattern``/``alpha_pattern`` as PEFT resolves them. Embedding LoRA
    (lora_embedding_A/B) is supported; DoRA is not (its delta is not B @ A).
    """

    def __init__(self, folder: str | Path):
        from safetensors.torch import load_file

        self.folder = Path(folder).expanduser().resolve()
        cfg_path = self.folder / "adapter_config.json"
        cfg = read_adapter_config(self.folder)
        if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
            raise ValueError(f"{cfg_path}: peft_type {cfg.get('peft_type')!r} is not LORA")
        if cfg.get("use_dora"):
            raise ValueError(f"{cfg_path}: DoRA adapters are not supported (delta is not B @ A)")
        weights = self.folder / "adapter_model.safetensors"
        if not weights.exists():
            raise ValueError(f"{self.folder}: no adapter_model.safetensors")
        self.config = cfg
        self.fan_in_fan_out = bool(cfg.get("fan_in_fan_out"))
        self._tensors = load_file(str(weights))  # adapters are small (MBs): keep them in memory
        self._modules: dict[str, tuple[str, str, bool]] = {}  # base name -> (A key, B key, embedding)
        rx = re.compile(r"^(?:base_model\.model\.)?(.*)\.(lora_A|lora_embedding_A)"
                        r"(?:\.[^.]+)?(?:\.weight)?$")
        for key in self._tensors:
            m = rx.match(key)
            if not m:
                continue
            module, which = m.group(1), m.group(2)
            b_key = key.replace(".lora_A", ".lora_B").replace(".lora_embedding_A", ".lora_embedding_B")
            if b_key not in self._tensors:
                raise ValueError(f"{weights}: {key} has no matching {b_key}")
            self._modules[module + ".weight"] = (key, b_key, which == "lora_embedding_A")
        self.identity = json.dumps({"lora": str(self.folder),
                                    "files": [[f.name, f.stat().st_size, f.stat().st_mtime_ns]
                                              for f in (cfg_path, weights)]})

    def names(self) -> list[str]:
        """Base parameter names this adapter changes."""
        return list(self._modules)

    def _scale(self, module: str, r: int) -> float:
        def pattern(d: dict, default):
            for k, v in (d or {}).items():
                if re.match(rf"(.*\.)?({k})$", module):
                    return v
            return default
        alpha = pattern(self.config.get("alpha_pattern"), self.config.get("lora_alpha", 8))
        return alpha / math.sqrt(r) if self.config.get("use_rslora") else alpha / r

    def __call__(self, name: str) -> torch.Tensor | None:
        entry = self._modules.get(name)
        if entry is None:
            return None
        a_key, b_key, embedding = entry
        A, B = self._tensors[a_key].float(), self._tensors[b_key].float()
        delta = B @ A * self._scale(name[: -len(".weight")], A.shape[0])
        if embedding:
            delta = delta.T  # lora_embedding_A: (r, vocab), B: (dim, r) -> (vocab, dim)
        elif self.fan_in_fan_out:
            delta = delta.T
        return delta


def lora_delta_provider(folder: str | Path) -> LoraDeltaProvider:
    return LoraDeltaProvider(folder)


# --------------------------------------------------------------------------- computation
def _row_mavs(expert: torch.Tensor | None, base: torch.Tensor | None,
              delta: torch.Tensor | None) -> torch.Tensor:
    """Row MAVs of (expert - base), or of ``delta``; chunked so each float32 chunk stays in cache."""
    src = delta if delta is not None else expert
    x = src.reshape(1, -1) if src.dim() == 1 else src
    b = None if delta is not None else (base.reshape(1, -1) if base.dim() == 1 else base)
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

    On CPU the tensor is a zero-copy view of the file through mmap: the page cache is read
    once, by the computation itself (a pread copy would double the memory traffic). Only this
    tensor's pages are mapped, and ``release()`` unmaps them, so resident memory stays at the
    tensors in flight. On other devices, or for dtypes torch cannot view, it is read normally.
    """
    loc = reader.location(name)
    dtype = ST_TO_DTYPE.get(loc.dtype)
    if str(device) != "cpu" or dtype is None or loc.nbytes == 0:
        return reader.read(name, device), lambda: None
    start = loc.offset - loc.offset % mmap.ALLOCATIONGRANULARITY
    with open(loc.path, "rb") as f:
        mm = mmap.mmap(f.fileno(), loc.offset + loc.nbytes - start, access=mmap.ACCESS_READ,
                       offset=start)
    if hasattr(mm, "madvise"):
        mm.madvise(mmap.MADV_WILLNEED)  # start reading ahead before the computation gets there
    with warnings.catch_warnings():  # "buffer is not writable": we only ever read it
        warnings.simplefilter("ignore", UserWarning)
        t = torch.frombuffer(mm, dtype=dtype, count=math.prod(loc.shape),
                             offset=loc.offset - start).view(loc.shape)
    reader.reads += 1

    def release():
        try:
            mm.close()
        except BufferError:  # a view is still alive somewhere: the GC unmaps it later
            pass
    return t, release


def _row_mavs_parallel(expert, base, delta, pool, parts: int) -> torch.Tensor:
    """_row_mavs with the rows split over the pool's threads (each single-threaded torch).

    Python threads over row blocks scale on a busy machine where torch's own OpenMP threads,
    which synchronise on every small chunk, crawl.
    """
    src = delta if delta is not None else expert
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


def _check_same_tensors(base: CheckpointReader, expert: CheckpointReader, names: list[str]):
    b, e = set(base.names()), set(expert.names())
    for n in sorted(b - e):
        raise DeltaMismatchError(f"tensor {n}: in the base ({base.folder}) but not in the expert "
                                 f"({expert.folder})")
    for n in sorted(e - b):
        raise DeltaMismatchError(f"tensor {n}: in the expert ({expert.folder}) but not in the base "
                                 f"({base.folder})")
    for n in names:
        if base.shape(n) != expert.shape(n):
            raise DeltaMismatchError(f"tensor {n}: shape {list(expert.shape(n))} in the expert "
                                     f"({expert.folder}) vs {list(base.shape(n))} in the base "
                                     f"({base.folder})")


def delta_stats(base, expert=None, *, threshold: float | None = None, device: str = "cpu",
                progress: Progress | None = None, cache: bool = True,
                delta_provider: DeltaProvider | None = None, label: str | None = None) -> DeltaStats:
    """Per-tensor row-MAV statistics of ``expert - base`` for every 1-D/2-D parameter.

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
    base_r = CheckpointReader(base_path)
    exp_r = CheckpointReader(expert_path) if expert_path is not None else None
    arch = get_architecture(base_r.config())
    names = [n for n in base_r.names() if len(base_r.shape(n)) in (1, 2)]
    skipped = [n for n in base_r.names() if len(base_r.shape(n)) not in (1, 2)]
    if exp_r is not None:
        _check_same_tensors(base_r, exp_r, base_r.names())
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
                rm = torch.zeros(1 if b.dim() == 1 else b.shape[0])
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


# --------------------------------------------------------------------------- suggested configuration
# Knobs of the suggestion formula (see suggest_config), in units of a uniform layer's share 1/L.
LAYER_COST = 0.1        # a swapped layer must add at least this much language advantage
AMBIGUOUS = 0.25        # |advantage| below this: neither expert dominates -> transition layer
SHARED = 0.5            # ... provided both experts changed it at least this much (else: task)
ELIGIBLE = 0.5          # the language expert changed a swapped layer at least this much
ATTENTION_RATIO = 1.5   # language expert this much more attention-heavy in the middle -> partition A
ATTENTION_KINDS = tuple(k for k in KIND_GROUPS["attention"] if k != "norm_qk")
MLP_KINDS = KIND_GROUPS["mlp"]


@dataclass
class Suggestion:
    bottom: int
    top: int
    transition_bottom: int
    transition_top: int
    partition: str | None
    explanation: str
    advantage: list[float] = field(default_factory=list)  # per layer: lang share - task share
    protected: list[int] = field(default_factory=list)    # the task expert's strongest layers

    def merge_config_kwargs(self) -> dict:
        """Keyword arguments for ``plan.MergeConfig`` (plain ints / None)."""
        return {"bottom": self.bottom, "top": self.top, "transition_bottom": self.transition_bottom,
                "transition_top": self.transition_top, "partition": self.partition}


def _spans(layers: list[int]) -> str:
    if not layers:
        return "none"
    out, start = [], layers[0]
    for a, b in zip(layers, layers[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)


def _kind_mass(stats: DeltaStats, layers: Iterable[int], group: tuple[str, ...]) -> float:
    keep = set(layers)
    return sum(s.mass for s in stats.tensors if s.layer in keep and s.kind in group)


def suggest_config(task_stats: DeltaStats, lang_stats: DeltaStats,
                   num_layers: int | None = None) -> Suggestion:
    """A layer-swap configuration from the per-layer delta profiles of the two experts.

    With m(l) the total delta mass of layer l (``layer_profile``) and p(l) = m(l) / sum m each
    expert's share of its own change (so experts trained with different learning rates compare),
    the language advantage is a(l) = p_lang(l) - p_task(l). In units of u = 1/L:

    1. protected: the task expert's k = max(1, round(L/8)) layers of largest p_task never swap;
    2. bottom b maximises  sum_{l<b} a(l) - 0.1 u b  over b <= L/2 (ties: the smaller b), the
       block stopping before a protected layer or one the language expert barely changed
       (p_lang < 0.5 u); top u likewise over the last layers. The 0.1 u cost per layer keeps
       near-zero advantages out; the 0.5 u floor keeps out layers that neither expert changed
       much (their shares differ only because the experts' totals do);
    3. transition layers: the layers right after the bottom block (right before the top block)
       that both experts changed (p_lang, p_task >= 0.5 u) and neither dominates (|a(l)| <
       0.25 u), at most max(1, L/8) on each side, never protected, always leaving at least one
       pure task layer;
    4. partition "A" (all attention to the language expert) when, over the middle layers, the
       language expert's attention share of its attention+MLP change is >= 1.5x the task
       expert's; then transitions are 0 (a partition replaces them), else None.
    """
    L = int(num_layers or task_stats.num_layers)
    if lang_stats.num_layers != task_stats.num_layers or L != task_stats.num_layers:
        raise ValueError(f"the experts have {task_stats.num_layers} and {lang_stats.num_layers} "
                         f"layers, and num_layers is {L}: they must agree")
    m_task, m_lang = task_stats.layer_profile(), lang_stats.layer_profile()
    if m_task.sum() <= 0 or m_lang.sum() <= 0:
        who = "task" if m_task.sum() <= 0 else "language"
        raise ValueError(f"the {who} expert does not differ from the base in any layer: "
                         "nothing to suggest from")
    p_task, p_lang = m_task / m_task.sum(), m_lang / m_lang.sum()
    adv = p_lang - p_task
    unit = 1.0 / L
    k = max(1, round(L / 8))
    protected = sorted(int(i) for i in np.argsort(-p_task, kind="stable")[:k])

    def best_block(order: list[int]) -> int:
        best, best_n, total = 0.0, 0, 0.0
        for n, l in enumerate(order, start=1):
            if l in protected or p_lang[l] < ELIGIBLE * unit:
                break
            total += adv[l] - LAYER_COST * unit
            if total > best + 1e-12:
                best, best_n = total, n
        return best_n

    b = best_block(list(range(L // 2)))
    u = best_block(list(range(L - 1, L - 1 - L // 2, -1)))
    while b + u >= L:  # keep at least one task layer (only possible for L <= 2)
        u, b = (u - 1, b) if u >= b else (u, b - 1)

    cap = max(1, L // 8)

    def transitions(order: Iterable[int], room: int) -> int:
        n = 0
        for l in order:
            if n >= min(cap, room) or l in protected or abs(adv[l]) >= AMBIGUOUS * unit \
                    or min(p_lang[l], p_task[l]) < SHARED * unit:
                break
            n += 1
        return n

    room = L - b - u - 1  # layers that may become transitions, keeping one task layer
    tb = transitions(range(b, L - u), room)
    tu = transitions(range(L - u - 1, b + tb - 1, -1), room - tb)
    middle = list(range(b, L - u))
    def att_share(st):
        a, m = _kind_mass(st, middle, ATTENTION_KINDS), _kind_mass(st, middle, MLP_KINDS)
        return a / (a + m) if a + m > 0 else 0.0

    share_task, share_lang = att_share(task_stats), att_share(lang_stats)
    attention_heavy = share_lang > 0 and share_lang >= ATTENTION_RATIO * share_task
    partition = "A" if attention_heavy and _preset_fits("A", L) else None
    if partition:
        tb = tu = 0

    pct = lambda x: f"{100 * x:.0f}%"  # noqa: E731
    lang_layers = list(range(b)) + list(range(L - u, L))
    text = ["Each expert's change is measured per layer as its share of the expert's total delta "
            "mass (sum of |expert - base|), so experts trained with different strengths compare."]
    if lang_layers:
        gain = float(adv[lang_layers].sum())
        text.append(f"The language expert changed layers {_spans(lang_layers)} most relative to the "
                    f"task expert: they hold {pct(p_lang[lang_layers].sum())} of its change but only "
                    f"{pct(p_task[lang_layers].sum())} of the task expert's (advantage "
                    f"{pct(gain)}), so bottom = {b} and top = {u} layers come from the language expert.")
    else:
        text.append("No bottom or top layers changed more in the language expert than in the task "
                    "expert (relative to each expert's total), so no layers are swapped.")
    text.append(f"The task expert's strongest layers ({_spans(protected)}, "
                f"{pct(p_task[protected].sum())} of its change) stay with the task expert.")
    if tb or tu:
        where = "next to the swapped blocks" if lang_layers else "at the bottom and top edges"
        text.append(f"{tb} bottom and {tu} top transition layer(s) {where} changed "
                    f"about equally in both experts (|advantage| < {AMBIGUOUS:g}/L), so they are "
                    "blended.")
    if partition:
        text.append(f"In the middle layers the language expert's change is attention-heavy "
                    f"({pct(share_lang)} of its attention+MLP change vs {pct(share_task)} for the "
                    f"task expert), so partition A (all attention to the language expert) is "
                    f"suggested; it replaces the layer counts above.")
    elif attention_heavy:
        text.append(f"In the middle layers the language expert's change is attention-heavy "
                    f"({pct(share_lang)} vs {pct(share_task)}), but the published partition A "
                    f"(first 6 + last 2 layers) does not fit {L} layers, so it is not suggested.")
    text.append("(This suggestion is layerswap's own heuristic over the delta statistics, not a "
                "rule from the papers.)")
    return Suggestion(int(b), int(u), int(tb), int(tu), partition, " ".join(text),
                      [float(x) for x in adv], protected)


def _preset_fits(name: str, num_layers: int) -> bool:
    """Whether a partition preset, in its published absolute layers, fits this depth."""
    from ..merge.plan import ConfigError, Partition
    try:
        Partition.preset(name, num_layers)
    except ConfigError:
        return False
    return True
