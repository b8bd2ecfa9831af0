"""Streaming tensor I/O: read and write one tensor at a time, (sharded) safetensors.

Nothing here loads a whole model. ``CheckpointReader`` maps every tensor name to its shard from
the index (or the headers) and opens shards lazily; ``get`` copies a single tensor out, ``read``
does the same with pread (no mmap). ``ShardedWriter`` streams tensors into HF shards + index;
``atomic_output_dir`` makes an output folder appear only when complete.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

import torch
from safetensors import SafetensorError, safe_open

INDEX_NAME = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be read (missing, corrupt, inconsistent)."""


def weight_files(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("*.safetensors"))


# safetensors layout: 8-byte little-endian header length, JSON header, then the tensor bytes.
# Reading with pread (not mmap) and writing with plain writes keeps the resident memory at one
# tensor, whatever the checkpoint size; single-source tensors can be copied file-to-file in the
# kernel (os.copy_file_range) without passing through Python at all.

DTYPE_TO_ST = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}
ST_TO_DTYPE = {v: k for k, v in DTYPE_TO_ST.items()}
TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def dtype_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class TensorLocation(NamedTuple):
    path: Path
    offset: int      # absolute byte offset of the data in the file
    nbytes: int
    dtype: str       # safetensors dtype string
    shape: tuple[int, ...]


def read_header(path: Path) -> tuple[int, dict]:
    """(data start offset, header dict) of one safetensors file; CheckpointError if corrupt."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{path}: not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", raw)
            if n > size - 8 or n > 100 << 20:
                raise CheckpointError(f"{path}: not a safetensors file (bad header length)")
            header = json.loads(f.read(n))
    except (OSError, ValueError) as e:
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError(f"{path}: cannot read safetensors header ({e})") from e
    header.pop("__metadata__", None)
    for name, info in header.items():
        begin, end = info["data_offsets"]
        if end > size - 8 - n or begin > end:
            raise CheckpointError(f"{path}: tensor {name!r} lies beyond the end of the file "
                                  "(truncated or corrupt)")
    return 8 + n, header


class CheckpointReader:
    """Lazy, per-tensor reader of a Hugging Face safetensors folder (sharded or not)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise CheckpointError(f"{self.folder}: not a folder")
        self._handles: dict[str, object] = {}
        self.reads = 0  # tensors read so far (tests use it to prove that nothing was read)
        index = self.folder / INDEX_NAME
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError) as e:
                raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from e
            self._shard_of = dict(weight_map)
        else:
            files = weight_files(self.folder)
            if not files:
                raise CheckpointError(f"{self.folder}: no *.safetensors files")
            self._shard_of = {}
            for f in files:
                for name in self._open(f.name).keys():
                    self._shard_of[name] = f.name
        for shard in sorted(set(self._shard_of.values())):
            if not (self.folder / shard).exists():
                raise CheckpointError(f"{self.folder}: shard {shard} named in the index is missing")
        self._meta: dict[str, tuple[tuple[int, ...], str]] = {}
        self._raw_headers: dict[str, dict[str, TensorLocation]] = {}

    def _open(self, shard: str):
        h = self._handles.get(shard)
        if h is None:
            try:
                h = safe_open(str(self.folder / shard), framework="pt", device="cpu")
            except (SafetensorError, OSError, Exception) as e:  # noqa: BLE001 - report any as corrupt
                raise CheckpointError(f"{self.folder / shard}: cannot read safetensors ({e})") from e
            self._handles[shard] = h
        return h

    # --- metadata (headers only, no tensor data) ---
    def names(self) -> list[str]:
        return list(self._shard_of)

    def __contains__(self, name: str) -> bool:
        return name in self._shard_of

    def __len__(self) -> int:
        return len(self._shard_of)

    def _info(self, name: str) -> tuple[tuple[int, ...], str]:
        info = self._meta.get(name)
        if info is None:
            if name not in self._shard_of:
                raise CheckpointError(f"{self.folder}: no tensor named {name!r}")
            sl = self._open(self._shard_of[name]).get_slice(name)
            info = (tuple(sl.get_shape()), sl.get_dtype())
            self._meta[name] = info
        return info

    def shape(self, name: str) -> tuple[int, ...]:
        return self._info(name)[0]

    def dtype(self, name: str) -> str:
        """safetensors dtype string, e.g. 'BF16', 'F32'."""
        return self._info(name)[1]

    def shard(self, name: str) -> str:
        return self._shard_of[name]

    def numel(self) -> int:
        total = 0
        for n in self._shard_of:
            k = 1
            for d in self.shape(n):
                k *= d
            total += k
        return total

    def nbytes(self) -> int:
        return sum((self.folder / s).stat().st_size for s in set(self._shard_of.values()))

    # --- data ---
    def get(self, name: str, device: str | torch.device = "cpu") -> torch.Tensor:
        if name not in self._shard_of:
            raise CheckpointError(f"{self.folder}: no tensor named {name!r}")
        try:
            t = self._open(self._shard_of[name]).get_tensor(name)
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"{self.folder / self._shard_of[name]}: cannot read {name!r} ({e})") from e
        self.reads += 1
        return t if str(device) == "cpu" else t.to(device)

    # --- raw access: pread, no mmap (resident memory stays one tensor)
    def _locations(self, shard: str) -> dict[str, TensorLocation]:
        cache = self._raw_headers
        if shard not in cache:
            path = self.folder / shard
            start, header = read_header(path)
            cache[shard] = {name: TensorLocation(path, start + info["data_offsets"][0],
                                                 info["data_offsets"][1] - info["data_offsets"][0],
                                                 info["dtype"], tuple(info["shape"]))
                            for name, info in header.items()}
        return cache[shard]

    def location(self, name: str) -> TensorLocation:
        """File, byte offset and size of one tensor's data (headers only)."""
        if name not in self._shard_of:
            raise CheckpointError(f"{self.folder}: no tensor named {name!r}")
        loc = self._locations(self._shard_of[name]).get(name)
        if loc is None:
            raise CheckpointError(f"{self.folder / self._shard_of[name]}: the index names {name!r} "
                                  "but the shard does not contain it")
        return loc

    def read(self, name: str, device: str | torch.device = "cpu") -> torch.Tensor:
        """One tensor read with pread into fresh memory (no mmap: resident memory stays one tensor)."""
        loc = self.location(name)
        if loc.dtype not in ST_TO_DTYPE:
            return self.get(name, device)  # exotic dtype: let safetensors handle it
        t = torch.empty(loc.shape, dtype=ST_TO_DTYPE[loc.dtype])
        if t.numel() * t.element_size() != loc.nbytes:
            raise CheckpointError(f"{loc.path}: tensor {name!r} has {loc.nbytes} bytes for shape "
                                  f"{list(loc.shape)} {loc.dtype} (corrupt header)")
        if loc.nbytes:
            buf = t.reshape(-1).view(torch.uint8).numpy()
            with open(loc.path, "rb") as f:
                f.seek(loc.offset)
                got = f.readinto(buf)
            if got != loc.nbytes:
                raise CheckpointError(f"{loc.path}: tensor {name!r} is truncated")
        self.reads += 1
        return t if str(device) == "cpu" else t.to(device)

    def config(self) -> dict:
        p = self.folder / "config.json"
        return json.loads(p.read_text()) if p.exists() else {}

    def close(self):
        self._handles.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def parse_size(size: int | str) -> int:
    """Bytes from 2000000, "2GB", "500MB", "1.5GiB" (decimal GB/MB; GiB/MiB binary)."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(i?)B?\s*", str(size), re.IGNORECASE)
    if not m:
        raise ValueError(f"cannot read size {size!r} (use e.g. 2GB, 500MB, 1.5GiB)")
    base = 1024 if m.group(3) else 1000
    exp = " KMGT".index(m.group(2).upper() or " ")
    value = int(float(m.group(1)) * base ** exp)
    if value <= 0:
        raise ValueError(f"size {size!r} must be positive")
    return value


class ShardedWriter:
    """Streams tensors into HF sharded safetensors: model-0000k-of-0000N.safetensors + index.

    The layout (names, shapes, dtypes, in write order) is declared first with ``declare``; shards
    are then assigned greedily up to ``max_shard_bytes`` so every header can be written before
    its data and nothing is buffered: each ``write`` goes straight to disk. ``finish`` checks that
    every declared tensor was written and writes the index.
    """

    def __init__(self, out_dir: str | Path, max_shard_bytes: int | str = "2GB", metadata: dict | None = None):
        self.out_dir = Path(out_dir)
        self.max_shard_bytes = parse_size(max_shard_bytes)
        self.metadata = {"format": "pt", **(metadata or {})}
        self._layout: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        self._shards: list[list[str]] | None = None
        self._order: list[str] = []
        self._next = 0            # index into _order of the next tensor to write
        self._file = None
        self._file_shard = -1
        self.bytes_written = 0

    # ---- layout
    def declare(self, name: str, shape: Iterable[int], dtype: torch.dtype):
        if self._shards is not None:
            raise RuntimeError("ShardedWriter: declare every tensor before the first write")
        if name in self._layout:
            raise ValueError(f"tensor {name!r} declared twice")
        if dtype not in DTYPE_TO_ST:
            raise ValueError(f"tensor {name!r}: dtype {dtype} cannot be written to safetensors")
        self._layout[name] = (tuple(int(d) for d in shape), dtype)
        self._order.append(name)

    def _nbytes(self, name: str) -> int:
        shape, dtype = self._layout[name]
        n = 1
        for d in shape:
            n *= d
        return n * dtype_size(dtype)

    def _assign(self):
        shards: list[list[str]] = [[]]
        size = 0
        for name in self._order:
            n = self._nbytes(name)
            if shards[-1] and size + n > self.max_shard_bytes:
                shards.append([])
                size = 0
            shards[-1].append(name)
            size += n
        self._shards = shards
        self._shard_of = {n: k for k, names in enumerate(shards) for n in names}

    def shard_name(self, k: int) -> str:
        return f"model-{k + 1:05d}-of-{len(self._shards):05d}.safetensors"

    def _open_shard(self, k: int):
        if self._file is not None:
            self._file.close()
        header, offset = {"__metadata__": self.metadata}, 0
        for name in self._shards[k]:
            shape, dtype = self._layout[name]
            n = self._nbytes(name)
            header[name] = {"dtype": DTYPE_TO_ST[dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + n]}
            offset += n
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # the format aligns the data start to 8 bytes
        self._file = open(self.out_dir / self.shard_name(k), "wb")
        self._file.write(struct.pack("<Q", len(raw)) + raw)
        self._file_shard = k

    # ---- data
    def _begin(self, name: str) -> int:
        """Open the right shard for the next tensor, which must be ``name``; returns its size."""
        if self._shards is None:
            self._assign()
        if self._next >= len(self._order) or self._order[self._next] != name:
            expected = self._order[self._next] if self._next < len(self._order) else "nothing"
            raise ValueError(f"ShardedWriter: got {name!r}, expected {expected!r} (write in the "
                             "declared order)")
        if self._shard_of[name] != self._file_shard:
            self._open_shard(self._shard_of[name])
        self._next += 1
        return self._nbytes(name)

    def write(self, name: str, tensor: torch.Tensor):
        shape, dtype = self._layout.get(name, (None, None))
        if shape is None:
            raise ValueError(f"ShardedWriter: tensor {name!r} was not declared")
        if tuple(tensor.shape) != shape or tensor.dtype != dtype:
            raise ValueError(f"ShardedWriter: {name!r} declared {list(shape)} {dtype}, got "
                             f"{list(tensor.shape)} {tensor.dtype}")
        n = self._begin(name)
        if n:
            t = tensor.detach().to("cpu").contiguous()
            self._file.write(t.reshape(-1).view(torch.uint8).numpy().data)
        self.bytes_written += n

    def copy_raw(self, name: str, loc: TensorLocation):
        """Copy a tensor's bytes file-to-file (bit-identical; same shape and dtype required)."""
        shape, dtype = self._layout[name]
        if tuple(loc.shape) != shape or loc.dtype != DTYPE_TO_ST[dtype]:
            raise ValueError(f"ShardedWriter: {name!r} declared {list(shape)} {dtype}, source is "
                             f"{list(loc.shape)} {loc.dtype}")
        n = self._begin(name)
        self._file.flush()
        with open(loc.path, "rb") as src:
            done = 0
            while done < n:
                try:
                    k = os.copy_file_range(src.fileno(), self._file.fileno(), n - done,
                                           loc.offset + done)
                except (AttributeError, OSError):
                    k = 0
                if k <= 0:  # not supported here: plain chunked copy
                    src.seek(loc.offset + done)
                    while done < n:
                        chunk = src.read(min(64 << 20, n - done))
                        if not chunk:
                            raise CheckpointError(f"{loc.path}: tensor {name!r} is truncated")
                        self._file.write(chunk)
                        done += len(chunk)
                    break
                done += k
        # copy_file_range wrote at the fd's position; keep Python's file object in step.
        self._file.seek(0, os.SEEK_END)
        self.bytes_written += n

    def finish(self) -> Path:
        if self._shards is None:
            self._assign()
        if self._next != len(self._order):
            missing = self._order[self._next:]
            raise ValueError(f"ShardedWriter: {len(missing)} declared tensor(s) never written, "
                             f"first {missing[0]!r}")
        if self._file is not None:
            self._file.close()
            self._file = None
        for k, names in enumerate(self._shards):  # shards of tensors with no data
            if not (self.out_dir / self.shard_name(k)).exists():
                self._open_shard(k)
                self._file.close()
                self._file = None
        index = {"metadata": {"total_size": sum(self._nbytes(n) for n in self._order)},
                 "weight_map": {n: self.shard_name(self._shard_of[n]) for n in self._order}}
        path = self.out_dir / INDEX_NAME
        path.write_text(json.dumps(index, indent=2) + "\n")
        return path

    def close(self):
        if self._file is not None:
            self._file.close()
            self._file = None


def save_sharded(out_dir: str | Path, tensors: dict[str, torch.Tensor],
                 max_shard_bytes: int | str = "2GB") -> Path:
    """Write a state dict as HF sharded safetensors (convenience over ShardedWriter)."""
    w = ShardedWriter(out_dir, max_shard_bytes)
    for n, t in tensors.items():
        w.declare(n, t.shape, t.dtype)
    try:
        for n, t in tensors.items():
            w.write(n, t)
        return w.finish()
    finally:
        w.close()


# --------------------------------------------------------------------------- atomic output folder
class OutputFolderError(ValueError):
    """An output folder that must not be written (exists, or overlaps an input)."""


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_output_dir(target: str | Path, *, overwrite: bool = False,
                     inputs: Iterable[str | Path] = ()) -> Path:
    """Absolute target path, or OutputFolderError if writing there is refused."""
    target = Path(target).expanduser().resolve()
    for inp in inputs:
        if inp is None:
            continue
        inp = Path(inp).expanduser().resolve()
        if _is_within(target, inp):
            raise OutputFolderError(f"output folder {target} is inside the input model folder {inp}; "
                                    "choose a folder outside the inputs")
        if _is_within(inp, target):
            raise OutputFolderError(f"input model folder {inp} is inside the output folder {target}; "
                                    "writing there could destroy the input")
    if target.exists():
        if not target.is_dir():
            raise OutputFolderError(f"output {target} exists and is not a folder")
        if not overwrite:
            raise OutputFolderError(f"output folder {target} already exists; pass overwrite=True "
                                    "(CLI: --overwrite) to replace it")
    return target


@contextlib.contextmanager
def atomic_output_dir(target: str | Path, *, overwrite: bool = False,
                      inputs: Iterable[str | Path] = ()) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``; on success it becomes ``target`` (replacing an
    existing one only with ``overwrite``); on any failure or interrupt nothing is left behind."""
    target = check_output_dir(target, overwrite=overwrite, inputs=inputs)
    created = []
    p = target.parent
    while not p.exists():
        created.append(p)
        p = p.parent
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            target.rename(old / "x")
            tmp.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in created:  # parents made for this output, innermost first
            try:
                d.rmdir()
            except OSError:
                break
        raise
