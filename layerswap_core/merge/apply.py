"""One function from a plan's ``Source`` to a tensor, used by the disk executor and the live model.

``source_rows`` computes the tensor a ``Source`` makes (a copy, cast if the dtype differs, or a
blend of ``methods.py``) in row blocks of at most ``BLOCK_BYTES`` float32 bytes and yields them in
order: the executor writes each block to its shard as it comes (``ShardedWriter.write_rows``),
the live model copies it into its parameter. A blended embedding matrix (e.g. 128k x 4096) never
needs a float32 copy of itself, so the memory of a merge does not grow with the vocabulary or
the hidden size. Row blocks give the same bits as the whole tensor: every method is element-wise
once its whole-tensor statistics are known (TIES's trim thresholds: ``Method.whole_tensor``,
computed once per tensor before the blocks).

``array_rows`` is the same on the CPU with numpy (``Method.arrays``; float32, float16 and
bfloat16 tensors): the disk merge's copies and linear blends then never import torch, and give
the same bits (tests/test_apply.py).

``magnitude_weights`` computes the magnitude-adjusted blend weights (streamed in the same row
blocks) for both.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import collections
import contextlib
import functools
import itertools
import math
import os
from collections.abc import Callable, Iterator, Sequence

from . import methods
from ..checkpoints.reading import ST_TO_DTYPE
from ..progress import Progress, say as _say
from ..settings import env_number
from .errors import ConfigError, MergeError
from .registry import Source

if TYPE_CHECKING:   # annotations only: torch is imported where it is used (start-up)
    import torch
    import numpy

# Row blocks hold at most this many float32 bytes of the output (the inputs and the method's
# temporaries are a few blocks more): bounded working memory whatever the tensor's size.
# The disk merge on the CPU computes on one thread (``one_thread``) in small blocks that stay in
# the CPU's caches. Measured (bench/merge_bench.py's machine, 2 cores shared, load 8-9): blending
# two bf16 32000 x 2048 tensors took 1.3-2.4 s in 1 MiB blocks on one thread, 2.5-6 s in 16-64
# MiB blocks, and 20-30 s in 1 MiB blocks on torch's default 2 threads (each small parallel
# region waits for a descheduled thread); the peak RSS of the default layer swap of the 1.1B
# synthetic: 289 MB in 1 MiB blocks, 329 MB in 4 MiB, 366 MB in 16 MiB (an import of torch: 266).
BLOCK_BYTES = 1 << 20
# Threads computing row blocks side by side in a disk merge on the CPU (``merge_workers``).
# Independent single-threaded blocks do not wait on each other the way one op's parallel region
# waits for its descheduled threads, so two workers help on an idle machine and cost little on
# a busy one (bench/merge_bench.py --workers compares).
WORKERS_ENV = "LAYERSWAP_MERGE_THREADS"
# The live model (multi-threaded, sharing the process with generation) and GPUs (fewer, larger
# kernels) compute in larger blocks.
LARGE_BLOCK_BYTES = 64 << 20

# (model role, rows: a slice of the first dimension or None for all) -> that tensor's rows, in
# the checkpoint's dtype (a fresh read, or a view of a mapped file).
Fetch = Callable[[str, "slice | None"], "torch.Tensor"]
# The same as a fresh numpy array (``CheckpointReader.read_array``: BF16 as its 16 bits).
FetchArray = Callable[[str, "slice | None"], "numpy.ndarray"]
# The dtypes ``array_rows`` computes in (safetensors names).
ARRAY_DTYPES = ("F32", "F16", "BF16")


def row_blocks(shape: Sequence[int], method: str = "linear",
               block_bytes: int | None = None) -> list[slice | None]:
    """Row slices to compute ``method`` in: [None] (the whole tensor) for tensors under
    ``block_bytes`` (default BLOCK_BYTES) in float32, 0-/1-d tensors and methods that are not
    row-wise; else consecutive blocks of rows of at most that many float32 bytes each."""
    block_bytes = block_bytes or BLOCK_BYTES
    if len(shape) < 2 or not methods.get_method(method).row_wise:
        return [None]
    rows, per_row = int(shape[0]), 4 * math.prod(shape[1:])
    if per_row * rows <= block_bytes:
        return [None]
    step = max(1, block_bytes // max(per_row, 1))
    return [slice(i, min(i + step, rows)) for i in range(0, rows, step)]


def source_rows(name: str, src: Source, shape: Sequence[int], fetch: Fetch, dtype: torch.dtype,
                device: str | torch.device = "cpu", outcome: str = "nothing was written",
                block_bytes: int | None = None,
                workers: int = 1) -> Iterator[tuple[slice | None, torch.Tensor]]:
    """(rows, value) of the tensor ``name`` made by ``src``, block by block in row order
    (``row_blocks`` of ``block_bytes``); ``value`` is in ``dtype`` on ``device``; ``workers`` > 1
    computes blocks on that many threads (``merge_workers``). MergeError
    (``check_finite``, with ``outcome`` saying what happened to the output) if a block becomes
    inf/NaN from finite inputs; ConfigError if the blend weights are not resolved."""
    import torch
    blocks, kwargs = _blocks(name, src, shape, block_bytes)
    if len(blocks) > 1 and str(device).startswith("cpu"):
        roomy_heap()

    def inputs(rows):
        return [fetch(m, rows).to(device) for m in src.models]

    whole = methods.get_method(src.method).whole_tensor
    if whole is not None and len(blocks) > 1:
        kwargs.update(whole(lambda: (inputs(rows) for rows in blocks), math.prod(shape),
                            len(src.models) - 1, **kwargs))

    def one(rows):
        return rows, _torch_block(name, src, inputs(rows), kwargs, dtype, outcome)

    return _in_order(one, blocks, workers, torch.set_num_threads)


def _blocks(name: str, src: Source, shape: Sequence[int], block_bytes: int | None
            ) -> tuple[list, dict]:
    """(``row_blocks``, the method's keyword arguments) of one tensor; ConfigError if its blend
    weights are not resolved."""
    if src.method != "copy" and src.weights is None:
        raise ConfigError(f"{name}: blend weights not resolved (magnitude weights missing)")
    return row_blocks(shape, src.method, block_bytes), src.kwargs()


def _torch_block(name: str, src: Source, part: list, kwargs: dict, dtype, outcome: str):
    """One block of ``src`` from its inputs ``part`` (torch tensors), in ``dtype``, checked."""
    if src.method == "copy":
        value = part[0].to(dtype)
    else:
        value = methods.apply(src.method, part, src.weights, kwargs).to(dtype)
    check_finite(name, value, part, src, outcome)
    return value


def _in_order(one: Callable, blocks: list, workers: int, single_thread=None) -> Iterator:
    """``one(rows)`` for every block, yielded in order; ``workers`` > 1: computed by that many
    threads, each first calling ``single_thread(1)`` when given (see ``one_thread``), at most
    2 x workers in flight: the same results, memory still bounded."""
    if workers <= 1 or len(blocks) < 2:
        return map(one, blocks)
    return _pooled(one, blocks, workers, single_thread)


def _pooled(one, blocks, workers, single_thread):
    import concurrent.futures   # here: with logging, 5-8 ms of every command's start-up
    with concurrent.futures.ThreadPoolExecutor(
            workers, initializer=single_thread, initargs=(1,) if single_thread else ()) as pool:
        pending: collections.deque = collections.deque()
        todo = iter(blocks)
        try:
            for rows in itertools.islice(todo, 2 * workers):
                pending.append(pool.submit(one, rows))
            while pending:
                done = pending.popleft().result()
                for rows in itertools.islice(todo, 1):
                    pending.append(pool.submit(one, rows))
                yield done
        finally:
            for f in pending:
                f.cancel()


def arrays_can(src: Source, dtypes: Sequence[str], device: str | torch.device = "cpu") -> bool:
    """Whether ``array_rows`` computes ``src`` here: on the CPU, a copy (a cast) or a method with
    ``arrays`` and no whole-tensor statistics, every input and the output (``dtypes``, safetensors
    names) in ``ARRAY_DTYPES``."""
    if not str(device).startswith("cpu") or any(d not in ARRAY_DTYPES for d in dtypes):
        return False
    method = methods.get_method(src.method)
    return src.method == "copy" or (method.arrays is not None and method.whole_tensor is None)


def array_rows(name: str, src: Source, shape: Sequence[int], fetch: FetchArray,
               in_dtypes: dict[str, str], dtype: str, torch_fetch: Fetch,
               outcome: str = "nothing was written", block_bytes: int | None = None,
               workers: int = 1) -> Iterator[tuple[slice | None, object]]:
    """``source_rows`` with numpy, where ``arrays_can`` says so: (rows, value), ``value`` a numpy
    array of the output's raw values (``CheckpointReader.read_array``'s dtypes: BF16 as uint16
    bits). ``in_dtypes``: each input model's dtype of this tensor; ``dtype``: the output's. A
    block whose value is not all finite is computed again by ``source_rows``'s torch code from
    ``torch_fetch`` (a torch tensor then): torch's bits for NaN inputs, its MergeError for
    finite inputs that overflow. Rounding to float16/bfloat16 is round-to-nearest-even, as
    torch's."""
    import numpy as np
    blocks, kwargs = _blocks(name, src, shape, block_bytes)
    if len(blocks) > 1:
        roomy_heap()
    blend = methods.get_method(src.method).arrays

    def one(rows):
        part = [fetch(m, rows) for m in src.models]
        with np.errstate(all="ignore"):   # inf/NaN are found below, and torch says why
            if src.method == "copy" and in_dtypes[src.models[0]] == dtype:
                value = part[0]
            elif src.method == "copy":
                value = _cast(_as_float32(part[0], in_dtypes[src.models[0]]), dtype)
            else:
                value = _cast(blend([_as_float32(a, in_dtypes[m]) for a, m in zip(part, src.models)],
                                    src.weights, **kwargs), dtype)
        if _all_finite(value, dtype):
            return rows, value
        # torch (imported here) only for the rare block that is not finite
        return rows, _torch_block(name, src, [torch_fetch(m, rows) for m in src.models], kwargs,
                                  ST_TO_DTYPE[dtype], outcome)

    return _in_order(one, blocks, workers)


def _as_float32(a, dtype: str):
    """A float32 array of the raw values ``a`` of ``dtype`` (the array itself when F32)."""
    import numpy as np
    if dtype == "BF16":   # the 16 bits are the top half of the float32
        wide = a.astype(np.uint32)   # then shifted in place: 30% faster than a widening shift
        wide <<= 16
        return wide.view(np.float32)
    return a if dtype == "F32" else a.astype(np.float32)


def _cast(f, dtype: str):
    """The float32 array ``f`` as ``dtype``'s raw values, rounded to nearest even (finite values
    bit-equal to torch's casts; non-finite ones are left to torch: ``array_rows``)."""
    import numpy as np
    if dtype == "F32":
        return f
    if dtype == "F16":
        return f.astype(np.float16)
    u = f.view(np.uint32)   # BF16: add 0x7FFF plus the lowest kept bit, keep the top 16 bits
    odd = np.right_shift(u, 16)
    odd &= 1
    odd += 0x7FFF
    odd += u
    odd >>= 16
    return odd.astype(np.uint16)


def _all_finite(a, dtype: str) -> bool:
    """No inf/NaN among the raw values ``a`` of ``dtype``."""
    import numpy as np
    if dtype == "BF16":   # exponent bits all set: inf or NaN
        return int(np.bitwise_and(a, 0x7F80).max(initial=0)) != 0x7F80
    if a.size == 0:
        return True
    return bool(np.isfinite(a.min()) and np.isfinite(a.max()))


@functools.cache
def roomy_heap(nbytes: int = 16 << 20):
    """Let the C heap keep a few row blocks' worth of freed memory (once per process).

    Each row block allocates and frees a few MiB (the inputs read, their float32 copies, the
    result). glibc serves such sizes from the heap but hands the freed top of the heap back to
    the kernel beyond its trim threshold (twice its mmap threshold, 2 MiB after 1 MiB blocks),
    so every block page-faulted its memory in again: blending two 32000 x 2048 bf16 tensors
    took 0.42-0.45 s on one thread, 0.27 s without the faults. glibc raises both thresholds
    when a block it mapped is freed (mallopt(3), "dynamic mmap threshold"): allocating and
    freeing ``nbytes`` once moves the trim threshold to 2 x ``nbytes``, process-wide, and costs
    nothing else (allocations up to ``nbytes`` then come from the heap). Elsewhere (no glibc)
    it does nothing useful and nothing harmful."""
    import numpy as np
    np.empty(nbytes, dtype=np.uint8)   # mapped, then freed at once


@contextlib.contextmanager
def one_thread(device: str | torch.device = "cpu"):
    """torch's intra-op threads set to 1 meanwhile on the CPU (see BLOCK_BYTES), restored after.
    The results are the same bits (element-wise arithmetic; the reductions of the magnitude
    weights run per row)."""
    import torch
    before = torch.get_num_threads()
    if str(device).startswith("cpu") and before != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def merge_workers(device: str | torch.device = "cpu") -> int:
    """Threads for a disk merge's row blocks: ``LAYERSWAP_MERGE_THREADS`` if set, else
    min(2, CPUs this process may use) on the CPU; 1 on a GPU (its kernels are the parallelism)."""
    if not str(device).startswith("cpu"):
        return 1
    return max(1, env_number(WORKERS_ENV, min(2, len(os.sched_getaffinity(0))), int))


def _finite(t: torch.Tensor) -> bool:
    """No inf/NaN in ``t`` (aminmax propagates NaN: ~30x faster than isfinite(t).all())."""
    import torch
    if not t.is_floating_point() or t.numel() == 0:
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(lo) & torch.isfinite(hi))


def check_finite(name: str, merged: torch.Tensor, inputs: list[torch.Tensor], src, outcome: str):
    """MergeError if ``merged`` has inf/NaN although every input tensor is finite."""
    if _finite(merged) or not all(_finite(t) for t in inputs):
        return  # finite, or non-finite inputs (they stay what they are)
    how = (f"the cast to {merged.dtype}" if src.method == "copy" else
           f"{src.method} with weights {list(src.weights or ())} {src.kwargs() or ''}".rstrip())
    raise MergeError(f"tensor {name}: {how} gives inf/NaN from finite inputs (weights too large, "
                     f"or values beyond the range of {merged.dtype}); {outcome}")


def magnitude_weights(fetch: Callable[[str, str, slice | None], torch.Tensor], roles,
                      names: list[str], shape_of: Callable[[str], Sequence[int]],
                      progress: Progress | None = None,
                      block_bytes: int | None = None) -> tuple[float, float]:
    """(w_task, w_lang): the inverse of each expert's mean row-wise mean |expert - base|
    (``methods.MagnitudeAccumulator``), over the 1-D/2-D tensors of ``names`` in that order.
    ``fetch(role, name, rows)`` gives a tensor's rows; ``roles``: the models at hand. Read in row
    blocks (the rows' means are kept, one float per row, and summed per tensor as a whole)."""
    import torch
    if "base" not in roles:
        raise ConfigError("magnitude-adjusted weights need the base model (--base)")
    acc = methods.MagnitudeAccumulator(("task", "lang"))
    eligible = [n for n in names if acc.eligible(shape_of(n))]
    for i, n in enumerate(eligible):
        means: dict[str, list[torch.Tensor]] = {"task": [], "lang": []}
        for rows in row_blocks(shape_of(n), "linear", block_bytes):
            base = fetch("base", n, rows)
            for e, found in means.items():
                found.append(methods.row_mean_abs_delta(fetch(e, n, rows), base))
        for e, found in means.items():
            acc.add_row_means(e, found[0] if len(found) == 1 else torch.cat(found))
        if i % 16 == 0:
            _say(progress, i / max(1, len(eligible)), f"magnitude weights: {n}")
    return acc.weights()
