"""Reading checkpoints: one tensor at a time from (sharded) safetensors, headers parsed once.

Nothing here loads a whole model. ``CheckpointReader`` maps every tensor name to its shard from
the index (or the headers, which it parses itself: ``read_header``) and gives each tensor three
ways: ``read`` copies it out with pread (resident memory stays one tensor), ``view`` is a
zero-copy view of the memory-mapped file (pages shared through the page cache), ``map_tensor``
maps just that tensor's pages until released. ``get`` lets safetensors read exotic dtypes.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import json
import math
import mmap
import struct
import warnings
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple
from collections.abc import Callable

from safetensors import SafetensorError, safe_open

if TYPE_CHECKING:   # annotations only: torch is imported where it is used (start-up)
    import torch

INDEX_NAME = "model.safetensors.index.json"
# Files read so far in this process, by kind ("config": config.json, "header": a safetensors
# header): tests count them to prove that a step reads no file again.
FILE_READS: Counter = Counter()


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be read (missing, corrupt, inconsistent)."""


class ModelLoadError(ValueError):
    """A model reference that cannot be turned into a usable model; the message says why."""


def read_json_object(p: Path, error=None, kind: str = "a model config") -> dict:
    """A JSON object file as a dict; ``error`` (ModelLoadError) naming the file otherwise."""
    error = error or ModelLoadError
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{p}: cannot read it ({e})") from e
    except ValueError as e:
        raise error(f"{p}: not valid JSON ({e})") from e
    except RecursionError:    # json's parser recurses once per level of nesting
        raise error(f"{p}: nested too deeply to be {kind}") from None
    if not isinstance(cfg, dict):
        raise error(f"{p}: not a JSON object ({kind} is {{...}})")
    return cfg


def read_config_file(folder: Path) -> dict:
    """The one config reader: the folder's config.json as a dict; ModelLoadError naming the file
    if it is missing or unreadable (one line)."""
    p = Path(folder) / "config.json"
    FILE_READS["config"] += 1
    if not p.exists():
        raise ModelLoadError(f"{Path(folder)}: no config.json (not a Hugging Face model folder)")
    return read_json_object(p)


def weight_files(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("*.safetensors"))


# safetensors layout: 8-byte little-endian header length, JSON header, then the tensor bytes.
# Reading with pread (not mmap) and writing with plain writes keeps the resident memory at one
# tensor, whatever the checkpoint size; single-source tensors can be copied file-to-file in the
# kernel (os.copy_file_range) without passing through Python at all.

# The format's dtypes and their sizes, without torch: `layerswap merge` on the CPU (copies, and
# linear blends in numpy) never imports torch (2.3 s of a 3 s command, bench/merge_bench.py).
ST_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
            "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
# MergeConfig.dtype (and --dtype) names -> safetensors dtype
CONFIG_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
# safetensors dtype -> the numpy dtype ``read_array`` gives (BF16 as its raw 16 bits)
NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8",
                "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


class _OnFirstUse(Mapping):
    """A read-only mapping built by ``make()`` when first read: the torch dtype tables below
    import torch then, not when this module is imported."""

    def __init__(self, make: Callable[[], dict]):
        self._make, self._map = make, None

    def _built(self) -> dict:
        if self._map is None:
            self._map = self._make()
        return self._map

    def __getitem__(self, key):
        return self._built()[key]

    def __iter__(self):
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())


def _dtype_to_st() -> dict:
    import torch
    return {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
            torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
            torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
            torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2"}


DTYPE_TO_ST = _OnFirstUse(_dtype_to_st)                                   # torch dtype -> format
ST_TO_DTYPE = _OnFirstUse(lambda: {v: k for k, v in DTYPE_TO_ST.items()})  # format -> torch dtype
TORCH_DTYPES = _OnFirstUse(lambda: {name: ST_TO_DTYPE[st] for name, st in CONFIG_DTYPES.items()})


class TensorLocation(NamedTuple):
    path: Path
    offset: int      # absolute byte offset of the data in the file
    nbytes: int
    dtype: str       # safetensors dtype string
    shape: tuple[int, ...]


def read_header(path: Path) -> dict[str, TensorLocation]:
    """{tensor: location} of one safetensors file: the one parser of the
    format's header (8-byte little-endian length, JSON). CheckpointError if it is corrupt."""
    FILE_READS["header"] += 1
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path}: cannot read safetensors (too short)")
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8 or n > 100 << 20:
                raise CheckpointError(f"{path}: cannot read safetensors (bad header length: not a "
                                      "safetensors file)")
            header = json.loads(f.read(n))
    except RecursionError:
        raise CheckpointError(f"{path}: cannot read safetensors header (nested too deeply)") \
            from None
    except (OSError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: cannot read safetensors header ({e})") from e
    locations = {}
    try:
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            if end > size - 8 - n or begin > end:
                raise CheckpointError(f"{path}: tensor {name!r} lies beyond the end of the file "
                                      "(truncated or corrupt)")
            locations[name] = TensorLocation(path, 8 + n + begin, end - begin, info["dtype"],
                                             tuple(int(d) for d in info["shape"]))
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: cannot read safetensors header (malformed: {e})") from e
    return locations


def _read_index(index: Path) -> dict[str, str]:
    """tensor -> shard file name from a safetensors index; CheckpointError if malformed."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except RecursionError:
        raise CheckpointError(f"{index}: not a valid safetensors index (nested too deeply)") \
            from None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from e
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index}: not a valid safetensors index (weight_map is not a mapping)")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or Path(shard).name != shard or shard in ("", ".", ".."):
            raise CheckpointError(f"{index}: tensor {name!r} is mapped to {shard!r}, which is not a "
                                  "file name in the model folder")
    return dict(weight_map)


def _pread(path: Path, offset: int, buf: memoryview, name: str) -> None:
    """Fill the writable byte buffer ``buf`` with the bytes of ``path`` from ``offset`` on."""
    nbytes = len(buf)
    if not nbytes:
        return
    done = 0
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        while done < nbytes:  # one read per 2 GiB (the kernel's limit per call)
            got = f.readinto(buf[done:])
            if not got:
                raise CheckpointError(f"{path}: tensor {name!r} is truncated")
            done += got


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable in place."""
    import torch
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


class CheckpointReader:
    """Lazy, per-tensor reader of a Hugging Face safetensors folder (sharded or not).

    Shards are parsed with ``read_header`` when first needed (all of them at once when an index
    names them, so the index is checked against them). ``read`` (pread copy), ``view`` (zero-copy,
    the whole shard mapped and kept) and ``map_tensor`` (zero-copy, only the tensor's pages, until
    released) give the data; ``release`` advises the kept mappings' pages away."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise CheckpointError(f"{self.folder}: not a folder")
        self._handles: dict[str, object] = {}       # safetensors handles (exotic dtypes only)
        self._maps: dict[Path, mmap.mmap] = {}      # shard -> whole-file mapping (``view``)
        self._headers: dict[str, dict[str, TensorLocation]] = {}
        self.reads = 0  # tensors read so far (tests use it to prove that nothing was read)
        index = self.folder / INDEX_NAME
        if index.exists():
            self._shard_of = _read_index(index)
        else:
            files = weight_files(self.folder)
            if not files:
                raise CheckpointError(f"{self.folder}: no *.safetensors files")
            self._shard_of = {name: f.name for f in files  # names sorted, as safetensors lists them
                              for name in sorted(self._locations(f.name))}
        for shard in sorted(set(self._shard_of.values())):
            if not (self.folder / shard).exists():
                raise CheckpointError(f"{self.folder}: shard {shard} named in the index is missing")
        if index.exists():
            for name in self._shard_of:  # every header (small) is parsed: the index must agree
                self.location(name)

    # --- metadata (headers only, no tensor data) ---
    def names(self) -> list[str]:
        return list(self._shard_of)

    def __contains__(self, name: str) -> bool:
        return name in self._shard_of

    def __len__(self) -> int:
        return len(self._shard_of)

    def _locations(self, shard: str) -> dict[str, TensorLocation]:
        if shard not in self._headers:
            self._headers[shard] = read_header(self.folder / shard)
        return self._headers[shard]

    def location(self, name: str) -> TensorLocation:
        """File, byte offset, size, dtype and shape of one tensor's data (headers only)."""
        if name not in self._shard_of:
            raise CheckpointError(f"{self.folder}: no tensor named {name!r}")
        loc = self._locations(self._shard_of[name]).get(name)
        if loc is None:
            raise CheckpointError(f"{self.folder / self._shard_of[name]}: the index maps tensor "
                                  f"{name!r} to this shard, but the shard does not contain it "
                                  "(wrong or outdated model.safetensors.index.json)")
        return loc

    def shape(self, name: str) -> tuple[int, ...]:
        return self.location(name).shape

    def dtype(self, name: str) -> str:
        """safetensors dtype string, e.g. 'BF16', 'F32'."""
        return self.location(name).dtype

    def shard(self, name: str) -> str:
        return self._shard_of[name]

    def numel(self) -> int:
        return sum(math.prod(self.shape(n)) for n in self._shard_of)

    def nbytes(self) -> int:
        return sum((self.folder / s).stat().st_size for s in set(self._shard_of.values()))

    def config(self) -> dict:
        """The folder's config.json (``read_config_file``: missing or unreadable is an error)."""
        return read_config_file(self.folder)

    # --- data ---
    def get(self, name: str, device: str | torch.device = "cpu") -> torch.Tensor:
        """One tensor read by safetensors itself (any dtype it knows, also those torch lacks)."""
        shard = self._shard_of.get(name)
        if shard is None:
            raise CheckpointError(f"{self.folder}: no tensor named {name!r}")
        try:
            if shard not in self._handles:
                self._handles[shard] = safe_open(str(self.folder / shard), framework="pt",
                                                 device="cpu")
            t = self._handles[shard].get_tensor(name)
        except (SafetensorError, Exception) as e:  # noqa: BLE001 - report any as unreadable
            raise CheckpointError(f"{self.folder / shard}: cannot read {name!r} ({e})") from e
        self.reads += 1
        return t if str(device) == "cpu" else t.to(device)

    def _checked_location(self, name: str) -> TensorLocation:
        """``location``, its byte count checked against its shape and dtype (a known one)."""
        loc = self.location(name)
        size = ST_SIZES.get(loc.dtype)
        if size is not None and math.prod(loc.shape) * size != loc.nbytes:
            raise CheckpointError(f"{loc.path}: tensor {name!r} has {loc.nbytes} bytes for shape "
                                  f"{list(loc.shape)} {loc.dtype} (corrupt header)")
        return loc

    def _checked(self, name: str) -> tuple[TensorLocation, torch.dtype | None]:
        loc = self._checked_location(name)
        return loc, ST_TO_DTYPE.get(loc.dtype)

    def _row_span(self, loc: TensorLocation, rows: slice) -> tuple[int, int, int]:
        """(first row, rows, bytes per row) of the consecutive ``rows`` of a tensor."""
        start, stop, step = rows.indices(loc.shape[0])
        if step != 1:
            raise ValueError(f"read_rows: step {step} (only consecutive rows)")
        stop = max(start, stop)
        return start, stop - start, loc.nbytes // loc.shape[0] if loc.shape[0] else 0

    def read(self, name: str, device: str | torch.device = "cpu") -> torch.Tensor:
        """One tensor read with pread into fresh memory (no mmap: resident memory stays one tensor)."""
        loc, dtype = self._checked(name)
        if dtype is None:
            return self.get(name, device)  # exotic dtype: let safetensors handle it
        import torch
        t = torch.empty(loc.shape, dtype=dtype)
        self.read_into(name, t)
        return t if str(device) == "cpu" else t.to(device)

    def read_into(self, name: str, out: torch.Tensor) -> bool:
        """Read one tensor's bytes straight into ``out`` (contiguous, on the CPU, same dtype and
        size) with plain reads, as ``cat`` would: no mapping, no page faults, nothing held
        afterwards. False (nothing read) when ``out`` does not fit that."""
        loc, dtype = self._checked(name)
        if (dtype is None or out.device.type != "cpu" or not out.is_contiguous()
                or out.dtype != dtype or out.numel() * out.element_size() != loc.nbytes):
            return False
        _pread(loc.path, loc.offset, _bytes_of(out), name)
        self.reads += 1
        return True

    def read_rows(self, name: str, rows: slice | None = None) -> torch.Tensor:
        """Rows ``rows`` (a slice of the first dimension, step 1) of one tensor, read with pread
        into fresh memory: a row block of a large tensor without reading the rest (rows are
        contiguous in the file). ``None``: the whole tensor (``read``)."""
        if rows is None:
            return self.read(name)
        loc, dtype = self._checked(name)
        if dtype is None or not loc.shape:  # exotic dtype (safetensors reads it) or a scalar
            return self.read(name)[rows]
        import torch
        start, count, row_bytes = self._row_span(loc, rows)
        out = torch.empty((count, *loc.shape[1:]), dtype=dtype)
        _pread(loc.path, loc.offset + start * row_bytes, _bytes_of(out), name)
        self.reads += 1
        return out

    def read_array(self, name: str, rows: slice | None = None):
        """``read_rows`` as a numpy array, without torch: the raw values in ``NUMPY_DTYPES[dtype]``
        (BF16 as its 16 bits, uint16). CheckpointError for a dtype numpy lacks (F8)."""
        # lazy: numpy costs 0.13 s; `layerswap merge` imports it while its copies already run
        import numpy as np
        loc = self._checked_location(name)
        if loc.dtype not in NUMPY_DTYPES:
            raise CheckpointError(f"{loc.path}: tensor {name!r} is {loc.dtype}, which numpy "
                                  "cannot hold")
        if rows is None or not loc.shape:
            start, count, row_bytes = 0, None, 0
        else:
            start, count, row_bytes = self._row_span(loc, rows)
        out = np.empty(loc.shape if count is None else (count, *loc.shape[1:]),
                       dtype=NUMPY_DTYPES[loc.dtype])
        _pread(loc.path, loc.offset + start * row_bytes, memoryview(out).cast("B"), name)
        self.reads += 1
        return out

    def view(self, name: str) -> torch.Tensor:
        """A zero-copy, read-only view of one tensor in its memory-mapped shard (kept mapped:
        the pages are the page cache, shared by every process, read when touched). Never write
        to it (the mapping is private: a write would copy the page into this process)."""
        loc, dtype = self._checked(name)
        if dtype is None:  # an exotic dtype: safetensors reads it (a copy)
            return self.get(name)
        import torch
        if loc.nbytes == 0:
            return torch.empty(loc.shape, dtype=dtype)
        mm = self._maps.get(loc.path)
        if mm is None:
            with open(loc.path, "rb") as f:
                mm = self._maps[loc.path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        return torch.frombuffer(mm, dtype=dtype, count=math.prod(loc.shape),
                                offset=loc.offset).view(loc.shape)

    def map_tensor(self, name: str) -> tuple[torch.Tensor, Callable[[], None]]:
        """(tensor, release): a zero-copy view mapping only this tensor's pages (read ahead at
        once), unmapped by ``release()``: resident memory stays at the tensors in flight.
        Exotic dtypes are read (a copy)."""
        loc, dtype = self._checked(name)
        if dtype is None or loc.nbytes == 0:
            return self.read(name), lambda: None
        import torch
        start = loc.offset - loc.offset % mmap.ALLOCATIONGRANULARITY
        with open(loc.path, "rb") as f:
            mm = mmap.mmap(f.fileno(), loc.offset + loc.nbytes - start, access=mmap.ACCESS_READ,
                           offset=start)
        if hasattr(mm, "madvise"):
            mm.madvise(mmap.MADV_WILLNEED)  # start reading ahead before the computation gets there
        with warnings.catch_warnings():  # "buffer is not writable": it is only ever read
            warnings.simplefilter("ignore", UserWarning)
            t = torch.frombuffer(mm, dtype=dtype, count=math.prod(loc.shape),
                                 offset=loc.offset - start).view(loc.shape)
        self.reads += 1

        def release():
            try:
                mm.close()
            except BufferError:  # a view is still alive somewhere: the GC unmaps it later
                pass
        return t, release

    def release(self) -> None:
        """Drop this process's hold on the pages of ``view``'s mappings (they stay in the page
        cache, and are read again when touched)."""
        for mm in self._maps.values():
            try:
                mm.madvise(mmap.MADV_DONTNEED)
            except (AttributeError, OSError, ValueError):  # no madvise here: the OS evicts anyway
                pass

    def close(self):
        self._handles.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
