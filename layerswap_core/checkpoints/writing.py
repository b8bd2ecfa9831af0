"""Writing checkpoints: the streaming sharded writer and the atomic output folder.

``ShardedWriter`` streams tensors into HF shards + index (nothing buffered); ``atomic_output_dir``
makes an output folder appear only when complete, never replacing what it must not (inputs, the
layerswap cache, folders that are not layerswap outputs); ``remove_stale`` clears the folders
stopped processes left behind.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import signal
import struct
import tempfile
import threading
from pathlib import Path
from collections.abc import Callable, Iterable, Iterator

from .cache import MODEL_CACHES, cache_dir
from .reading import DTYPE_TO_ST, INDEX_NAME, ST_SIZES, CheckpointError, TensorLocation

if TYPE_CHECKING:   # annotations only: torch is imported where it is used (start-up)
    import torch


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

    The layout (names, shapes, dtypes, in file order) is declared first with ``declare``; shards
    are then assigned greedily up to ``max_shard_bytes``, so every tensor's place in its file is
    known before anything is written. Each write then goes straight to that place (``pwrite``,
    nothing buffered), in any order and from several threads at once: the merge copies
    unchanged tensors on one thread while it blends others on another. ``finish`` checks that
    every declared tensor was written once and writes the index.

    Kept although ``huggingface_hub.save_torch_state_dict`` writes the same layout: that one
    needs the whole state dict in memory, this one holds at most one row block of a tensor
    (``write_rows``; see docs/performance.md for the measured peak) and copies unchanged tensors
    file-to-file (``copy_runs``, bit-identical, in the kernel).
    """

    # one kernel copy call moves at most this much (a stop request waits for one call at most)
    COPY_CHUNK = 256 << 20
    # A kernel copy is fastest when its calls start on the page cache's large folios in the
    # source and the destination offsets agree with the source's modulo their size (measured on
    # a 1 GB shard: 0.50-0.58 s so, 0.62-0.76 s at shifts of 100 B, 4 KiB or 8 KiB, or calls
    # starting mid-folio). So each shard's header is padded with spaces (as the format allows)
    # to put its first copied tensor at its source offset modulo ALIGN, a new shard starts
    # where the source file changes (``declare``'s ``group``), and calls end on the source's
    # ALIGN boundaries.
    ALIGN = 2 << 20
    # Shards copying less than this are not padded (up to 2 MiB of spaces would not pay there).
    PAD_MIN = 64 << 20

    def __init__(self, out_dir: str | Path, max_shard_bytes: int | str = "2GB", metadata: dict | None = None):
        self.out_dir = Path(out_dir)
        self.max_shard_bytes = parse_size(max_shard_bytes)
        self.metadata = {"format": "pt", **(metadata or {})}
        self._layout: dict[str, tuple[tuple[int, ...], str]] = {}   # shape, safetensors dtype
        self._shards: list[list[str]] | None = None
        self._order: list[str] = []
        self._offset: dict[str, int] = {}     # absolute byte offset of each tensor in its shard
        self._headers: list[bytes] = []
        self._fds: dict[int, int] = {}         # shard -> open file descriptor
        self._claimed: set[str] = set()        # tensors being or already written
        self._written: set[str] = set()
        self._lock = threading.Lock()
        self._align: dict[str, int] = {}       # tensor -> its source's offset (copy_runs)
        self._group: dict[str, object] = {}
        self.bytes_written = 0

    # ---- layout
    def declare(self, name: str, shape: Iterable[int], dtype: torch.dtype | str,
                copied_from: int | None = None, group=None):
        """``dtype``: a torch dtype or the format's name of one ("BF16"); ``copied_from``: the
        offset of the tensor in the file ``copy_runs`` will copy it from (its shard is then
        laid out for a fast kernel copy: ``ALIGN``); ``group``: tensors of
        different groups (e.g. source files) that follow each other go to different shards."""
        if self._shards is not None:
            raise RuntimeError("ShardedWriter: declare every tensor before the first write")
        if name in self._layout:
            raise ValueError(f"tensor {name!r} declared twice")
        st = dtype if isinstance(dtype, str) else DTYPE_TO_ST.get(dtype)
        if st not in ST_SIZES:
            raise ValueError(f"tensor {name!r}: dtype {dtype} cannot be written to safetensors")
        self._layout[name] = (tuple(int(d) for d in shape), st)
        self._order.append(name)
        if copied_from is not None:
            self._align[name] = copied_from
        self._group[name] = group

    @classmethod
    def most_bytes(cls, nbytes: dict[str, int], groups: int, max_shard_bytes: int | str = "2GB"
                   ) -> int:
        """At most the bytes of the shards holding tensors ``{name: bytes}`` in ``groups``
        groups (``declare``): the tensors, and a header per shard (its entries, the metadata
        and up to ``ALIGN`` of padding), a new shard starting at each group and at the cap."""
        tensors = sum(nbytes.values())
        shards = groups + tensors // parse_size(max_shard_bytes) + 1
        return (tensors + shards * (cls.ALIGN + 8 + 256)
                + sum(len(name) + 128 for name in nbytes))

    def _nbytes(self, name: str) -> int:
        shape, dtype = self._layout[name]
        n = 1
        for d in shape:
            n *= d
        return n * ST_SIZES[dtype]

    def _assign(self):
        shards: list[list[str]] = [[]]
        size = 0
        for name in self._order:
            n = self._nbytes(name)
            group = self._group[name]
            if shards[-1] and (size + n > self.max_shard_bytes
                               or (group is not None and group != self._group[shards[-1][-1]])):
                shards.append([])
                size = 0
            shards[-1].append(name)
            size += n
        self._shard_of = {n: k for k, names in enumerate(shards) for n in names}
        for names in shards:
            header, offset = {"__metadata__": self.metadata}, 0
            for name in names:
                shape, dtype = self._layout[name]
                n = self._nbytes(name)
                header[name] = {"dtype": dtype, "shape": list(shape),
                                "data_offsets": [offset, offset + n]}
                offset += n
            raw = json.dumps(header, separators=(",", ":")).encode()
            raw += b" " * (-len(raw) % 8)  # the format aligns the data start to 8 bytes
            first = next((n for n in names if n in self._align), None)
            copied = sum(self._nbytes(n) for n in names if n in self._align)
            if first is not None and copied >= self.PAD_MIN:
                # pad: the first copied tensor at its source offset mod ALIGN
                pad = (self._align[first] - 8 - len(raw) - header[first]["data_offsets"][0]) \
                    % self.ALIGN
                if pad % 8 == 0:
                    raw += b" " * pad
            raw = struct.pack("<Q", len(raw)) + raw
            self._headers.append(raw)
            for name in names:
                self._offset[name] = len(raw) + header[name]["data_offsets"][0]
        self._shards = shards

    def shard_name(self, k: int) -> str:
        return f"model-{k + 1:05d}-of-{len(self._shards):05d}.safetensors"

    def _fd(self, k: int) -> int:
        """The open file of shard ``k`` (created with its header on first use); under the lock."""
        fd = self._fds.get(k)
        if fd is None:
            fd = os.open(self.out_dir / self.shard_name(k), os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                         0o644)
            self._fds[k] = fd
            _pwrite_all(fd, memoryview(self._headers[k]), 0)
        return fd

    # ---- data
    def _claim(self, name: str) -> tuple[int, int, int]:
        """(file descriptor, offset, size) of ``name``, which is now being written (once)."""
        if name not in self._layout:
            raise ValueError(f"ShardedWriter: tensor {name!r} was not declared")
        with self._lock:
            if self._shards is None:
                self._assign()
            if name in self._claimed:
                raise ValueError(f"ShardedWriter: {name!r} written twice")
            self._claimed.add(name)
            return self._fd(self._shard_of[name]), self._offset[name], self._nbytes(name)

    def _done(self, name: str, n: int):
        with self._lock:
            self._written.add(name)
            self.bytes_written += n

    def write(self, name: str, tensor: torch.Tensor):
        shape, dtype = self._layout.get(name, (None, None))
        if shape is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"ShardedWriter: {name!r} declared {list(shape)} {dtype}, got "
                             f"{list(tensor.shape)} {tensor.dtype}")
        self.write_rows(name, [tensor])

    def write_rows(self, name: str, pieces: Iterable):
        """Write one tensor given as consecutive pieces of its rows (first dimension), each
        written as it arrives: a blend computed in row blocks never exists whole. The pieces
        must add up to the declared shape (a 0-d tensor is one piece). A piece is a torch tensor
        of the declared dtype or a numpy array of its size per element (``_piece_bytes``)."""
        shape, dtype = self._layout.get(name, (None, None))
        if shape is None:
            raise ValueError(f"ShardedWriter: tensor {name!r} was not declared")
        fd = None   # claimed at the first piece that fits (a refused one leaves it unwritten)
        done = 0
        for t in pieces:
            data = _piece_bytes(t, dtype)
            if data is None or tuple(t.shape[1:] if shape else t.shape) != shape[1:]:
                raise ValueError(f"ShardedWriter: {name!r} declared {list(shape)} {dtype}, got "
                                 f"a piece {list(t.shape)} {t.dtype}")
            if fd is None:
                fd, offset, n = self._claim(name)
            if done + len(data) > n:
                raise ValueError(f"ShardedWriter: {name!r}: pieces beyond its declared "
                                 f"{list(shape)}")
            if len(data):
                _pwrite_all(fd, data, offset + done)
            done += len(data)
        if fd is None:
            fd, offset, n = self._claim(name)
        if done != n:
            raise ValueError(f"ShardedWriter: {name!r}: pieces of {done} bytes for the declared "
                             f"{list(shape)} {dtype} ({n} bytes)")
        self._done(name, n)

    def copy_runs(self, items: list[tuple[str, TensorLocation]], stop: threading.Event | None = None,
                  on_bytes=None):
        """Copy each (name, source location)'s bytes file-to-file, in the kernel (bit-identical;
        the declared shape and dtype must match the source's); tensors that follow each
        other both in one source file and in one shard are copied as one range (one call per
        256 MiB instead of one or more per tensor: measured 0.50 against 0.66 s for a 1 GB
        shard of 84 tensors). ``stop`` (an Event) is checked between calls: when set, the copy
        ends early (the output is incomplete: ``finish`` will say so). ``on_bytes(n, name)`` is
        called after each call with the bytes it copied."""
        runs: list[list] = []   # [source path, source offset, fd, offset, length, names]
        for name, loc in items:
            shape, dtype = self._layout[name]
            if tuple(loc.shape) != shape or loc.dtype != dtype:
                raise ValueError(f"ShardedWriter: {name!r} declared {list(shape)} {dtype}, "
                                 f"source is {list(loc.shape)} {loc.dtype}")
            fd, offset, n = self._claim(name)
            last = runs[-1] if runs else None
            if (last and last[0] == loc.path and last[1] + last[4] == loc.offset
                    and last[2] == fd and last[3] + last[4] == offset):
                last[4] += n
                last[5].append(name)
            else:
                runs.append([loc.path, loc.offset, fd, offset, n, [name]])
        for path, src_offset, fd, offset, n, names in runs:
            with open(path, "rb", buffering=0) as src:
                with contextlib.suppress(AttributeError, OSError):  # a larger read-ahead, as cp
                    os.posix_fadvise(src.fileno(), src_offset, n, os.POSIX_FADV_SEQUENTIAL)
                done = 0
                while done < n:
                    if stop is not None and stop.is_set():
                        return
                    # a call that starts mid-folio is slow all along: up to the next ALIGN
                    # boundary of the source first, then whole chunks (see ALIGN)
                    head = (src_offset + done) % self.ALIGN
                    step = self.ALIGN - head if head else self.COPY_CHUNK
                    k = _copy_range(src.fileno(), src_offset + done, fd, offset + done,
                                    min(step, n - done))
                    if k <= 0:
                        raise CheckpointError(f"{path}: tensor {names[0]!r} is truncated")
                    done += k
                    if on_bytes is not None:
                        on_bytes(k, names[0])
            for name in names:
                self._done(name, self._nbytes(name))

    def finish(self) -> Path:
        with self._lock:
            if self._shards is None:
                self._assign()
            missing = [n for n in self._order if n not in self._written]
            if missing:
                raise ValueError(f"ShardedWriter: {len(missing)} declared tensor(s) never written, "
                                 f"first {missing[0]!r}")
            for k in range(len(self._shards)):  # shards of tensors with no data
                self._fd(k)
        self.close()
        index = {"metadata": {"total_size": sum(self._nbytes(n) for n in self._order)},
                 "weight_map": {n: self.shard_name(self._shard_of[n]) for n in self._order}}
        path = self.out_dir / INDEX_NAME
        path.write_text(json.dumps(index, indent=2) + "\n")
        return path

    def close(self):
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            os.close(fd)


def _piece_bytes(t, dtype: str) -> memoryview | None:
    """The bytes of one piece for a tensor declared ``dtype`` (safetensors name): a torch tensor
    of that dtype (moved to the CPU), or a numpy array of that many bytes per element (numpy has
    no bfloat16: a BF16 piece is its raw 16 bits, uint16); None if it is neither."""
    if type(t).__module__ == "numpy":   # an ndarray: no torch needed
        if t.dtype.itemsize != ST_SIZES[dtype] or t.dtype.kind not in "fiub":
            return None
        return memoryview(t.reshape(-1) if t.flags.c_contiguous else t.copy().reshape(-1)).cast("B")
    if DTYPE_TO_ST.get(t.dtype) != dtype:
        return None
    import torch
    data = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
    return memoryview(data.numpy())


def _pwrite_all(fd: int, data: memoryview, offset: int):
    """All of ``data`` at ``offset`` (pwrite may write less than asked)."""
    data = data.cast("B")
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], offset + done)


def _copy_range(src: int, src_offset: int, dst: int, dst_offset: int, n: int) -> int:
    """Copy up to ``n`` bytes between two files at these offsets; returns the bytes copied
    (0 at the end of ``src``). In the kernel (copy_file_range) where it can, else through a
    buffer (other file systems, old kernels)."""
    try:
        k = os.copy_file_range(src, dst, n, src_offset, dst_offset)
        if k > 0:
            return k
    except (AttributeError, OSError) as e:
        if isinstance(e, OSError) and e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS,
                                                      errno.EOPNOTSUPP, errno.EBADF):
            raise   # disk full and the like: the caller turns it into a one-line error
    data = os.pread(src, min(n, 64 << 20), src_offset)
    if data:
        _pwrite_all(dst, memoryview(data), dst_offset)
    return len(data)


# --------------------------------------------------------------------------- atomic output folder
# A merge writes into ".NAME.partial-HOST-PID-xxxx" beside the output and renames it to NAME at
# the end, without ever replacing a folder that appeared meanwhile (unless overwrite allows it).
# HOST (a short hash of the host name) and PID let a later run remove the partial folders of a
# process that died (SIGKILL, power loss); SIGTERM is turned into an exception during the merge
# so that the partial folder is removed before the process ends.
class OutputFolderError(ValueError):
    """An output folder that must not be written (exists, overlaps an input, cannot be written)."""


class OutputWriteError(OutputFolderError):
    """Writing the output failed (disk full, read-only, permission); nothing was left written."""


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived while an output folder was being written (it was removed)."""


MARKER = "layerswap.yaml"   # every folder a merge writes has it: only such folders are replaced
def _hostname() -> str:
    """This host's name: uname's node name (what socket.gethostname returns on POSIX, without
    importing socket at start-up), else socket's."""
    if hasattr(os, "uname"):
        return os.uname().nodename
    import socket
    return socket.gethostname()


_HOST = hashlib.sha1(_hostname().encode()).hexdigest()[:6]
_TEMP = re.compile(r"^\..+\.(partial|old)-([0-9a-f]{6})-(\d+)-[^/]*$")


def _is_within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def is_layerswap_output(folder: str | Path) -> bool:
    return (Path(folder) / MARKER).is_file()


def _cache_refusal(target: Path) -> str | None:
    """Why ``target`` may never be written (the layerswap cache), or None.

    Never the cache, its model caches or a folder holding them; never a model built in a model
    cache; nothing new in the embedded models' cache (its builder fills an empty folder it made)."""
    try:
        cache = cache_dir().resolve()
    except OSError:  # no usable cache folder: nothing there to protect
        return None
    for folder in (cache, *(cache / name for name in MODEL_CACHES)):
        if _is_within(folder, target):
            return f"{target} holds the layerswap model cache ({folder})"
        if folder == cache or not _is_within(target, folder):
            continue
        empty = target.is_dir() and not any(target.iterdir())
        if not empty and (target.exists() or folder.name == "embedded"):
            return f"{target} is in the layerswap model cache ({folder})"
    return None


def check_output_dir(target: str | Path, *, overwrite: bool = False, force: bool = False,
                     inputs: Iterable[str | Path] = ()) -> Path:
    """Absolute target path, or OutputFolderError if writing there is refused.

    An existing folder is replaced only with ``overwrite``, and then only if it is a layerswap
    output (has its layerswap.yaml) or empty, unless ``force``. Input folders and the layerswap
    cache are never replaced, whatever the flags."""
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
    why = _cache_refusal(target)
    if why:
        raise OutputFolderError(f"refusing to write the output there: {why}; choose another folder")
    if target.exists() or target.is_symlink():
        if not target.is_dir():
            raise OutputFolderError(f"output {target} exists and is not a folder")
        if not overwrite:
            raise OutputFolderError(f"output folder {target} already exists; pass overwrite=True "
                                    "(CLI: --overwrite) to replace it")
        if not force and not is_layerswap_output(target) and any(target.iterdir()):
            raise OutputFolderError(f"output folder {target} exists and is not a layerswap output "
                                    f"(no {MARKER}); choose another folder, or pass force=True "
                                    "(CLI: --overwrite --force) to replace it anyway")
    why = unwritable_reason(target)
    if why:
        raise OutputWriteError(f"cannot write {target} ({why}); nothing was written: choose a "
                               "folder you can write to")
    return target


def unwritable_reason(folder: str | Path) -> str | None:
    """Why no folder can be written at ``folder`` ("<nearest existing folder>: <the OS's
    reason>": permission, read-only file system, a file in the way), or None. Tried by making and
    removing an empty folder there, since permission bits do not tell (root, mounts, /proc)."""
    folder = Path(folder).expanduser()
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe}: Not a folder"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".layerswap-probe-", dir=probe))
    except OSError as e:
        return f"{probe}: {e.strerror or e}"
    return None


def remove_stale(parent: str | Path, stale: Callable[[Path], bool]) -> list[Path]:
    """Remove the folders in ``parent`` (not links) that ``stale`` picks: what stopped processes
    left behind. Returns them."""
    removed = []
    try:
        entries = list(Path(parent).iterdir())
    except OSError:
        return removed
    for p in entries:
        if p.is_dir() and not p.is_symlink() and stale(p):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def remove_stale_partials(parent: str | Path) -> list[Path]:
    """Remove the partial folders that dead processes of this host left in ``parent``.

    A stale ".old-" folder holds a replaced output whose successor never arrived: it is put back
    if its name is free. Folders of live processes (and of this process) are kept."""
    return remove_stale(parent, _left_by_dead_process)


def _left_by_dead_process(p: Path) -> bool:
    """Whether ``p`` is a temporary folder of a dead process of this host; an ".old-" one's
    replaced output is first put back where its name is free."""
    m = _TEMP.match(p.name)
    if not m or m.group(2) != _HOST or _alive(int(m.group(3))):
        return False
    if m.group(1) == "old":
        original = p.parent / p.name[1:].rsplit(".old-", 1)[0]
        if (p / "x").is_dir() and not original.exists():
            with contextlib.suppress(OSError):
                os.rename(p / "x", original)
    return True


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True   # another thread of this process may be writing it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True   # exists, owned by someone else
    return True


def _temp_dir(target: Path, kind: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.{kind}-{_HOST}-{os.getpid()}-",
                                 dir=target.parent))


def _write_error(target: Path, e: OSError) -> OutputWriteError:
    where = f" ({e.filename})" if e.filename else ""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return OutputWriteError(f"disk full while writing {target}{where}; nothing was written "
                                "(free some space or choose another folder)")
    return OutputWriteError(f"writing {target} failed: {e.strerror or e}{where}; nothing was "
                            "written (choose a folder you can write to)")


@contextlib.contextmanager
def _sigterm_raises():
    """In the main thread, SIGTERM raises Terminated (so cleanup runs); restored afterwards and
    the signal delivered again once the cleanup is done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_IGN or previous is None:
        yield
        return
    got = []

    def handler(signum, frame):
        if not got:
            got.append(signum)
            raise Terminated("terminated (SIGTERM) while writing an output folder")

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        if got:
            signal.raise_signal(signal.SIGTERM)   # what the process would have done without us


@contextlib.contextmanager
def _dir_lock(folder: Path):
    """Exclusive lock on a folder among the processes that take it (the final renames)."""
    try:
        import fcntl
        fd = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _rename_noreplace(src: Path, dst: Path):
    """Rename ``src`` to ``dst``; FileExistsError if ``dst`` exists (even an empty folder)."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.renameat2(-100, os.fsencode(src), -100, os.fsencode(dst), 1)  # RENAME_NOREPLACE
    except (AttributeError, OSError, TypeError):  # no renameat2 (not Linux, old libc)
        rc, err = -1, errno.ENOSYS
    else:
        err = ctypes.get_errno() if rc else 0
    if rc == 0:
        return
    if err in (errno.EEXIST, errno.ENOTEMPTY):
        raise FileExistsError(err, os.strerror(err), str(dst))
    if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        raise OSError(err, os.strerror(err), str(dst))
    os.mkdir(dst)       # no renameat2 here: reserve the name (fails if taken), then fill it;
    try:                # a rename onto an empty folder succeeds, onto a non-empty one fails
        os.rename(src, dst)
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(dst)
        raise


def _publish(tmp: Path, target: Path, *, overwrite: bool, force: bool, inputs: list):
    """Make ``tmp`` the folder ``target``, checking again (it may have appeared meanwhile)."""
    with _dir_lock(target.parent):
        if (target.exists() or target.is_symlink()) and not overwrite:
            raise OutputFolderError(f"output folder {target} appeared while writing (another merge "
                                    "into the same folder?); it was left as it is and this result "
                                    "discarded; choose another folder or pass overwrite=True "
                                    "(CLI: --overwrite)")
        check_output_dir(target, overwrite=overwrite, force=force, inputs=inputs)
        old = None
        if target.exists() or target.is_symlink():
            old = _temp_dir(target, "old")
            os.rename(target, old / "x")
        try:
            _rename_noreplace(tmp, target)
        except BaseException as e:
            if old is not None:  # put the replaced folder back (else a later run restores it)
                with contextlib.suppress(OSError):
                    os.rename(old / "x", target)
                    shutil.rmtree(old, ignore_errors=True)
            if isinstance(e, FileExistsError):
                raise OutputFolderError(f"output folder {target} appeared while writing (another "
                                        "merge?); it was left as it is and this result discarded") from e
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def atomic_output_dir(target: str | Path, *, overwrite: bool = False, force: bool = False,
                      inputs: Iterable[str | Path] = ()) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``; on success it becomes ``target`` (replacing an
    existing one only as ``check_output_dir`` allows, checked again at the end); on any failure,
    SIGTERM or interrupt nothing is left behind. OS errors while writing (disk full, read-only)
    become one-line ``OutputWriteError``."""
    inputs = list(inputs)
    target = check_output_dir(target, overwrite=overwrite, force=force, inputs=inputs)
    created = []
    p = target.parent
    while not p.exists():
        created.append(p)
        p = p.parent
    tmp = None
    with _sigterm_raises():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_partials(target.parent)
            tmp = _temp_dir(target, "partial")
            yield tmp
            _publish(tmp, target, overwrite=overwrite, force=force, inputs=inputs)
        except BaseException as e:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            for d in created:  # parents made for this output, innermost first
                try:
                    d.rmdir()
                except OSError:
                    break
            if isinstance(e, OSError):
                raise _write_error(target, e) from e
            raise

