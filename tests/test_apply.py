"""One function from a plan's Source to a tensor (merge/apply.py), for the disk executor and the
live model alike: every registered method gives the same tensors on disk and in memory, whole or
in row blocks, and the disk merge streams blends block by block into the shard."""
from __future__ import annotations

import itertools
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file

from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.checkpoints.writing import ShardedWriter
from layerswap_core.merge import apply, executor, methods
from layerswap_core.merge.config import MergeConfig
from layerswap_core.merge.executor import merge_to_folder
from layerswap_core.merge.live import LiveModel
from layerswap_core.merge.registry import MERGE_METHODS, Source

CONFIGS = {
    "layer_swap": MergeConfig(bottom=2, top=1, transition_bottom=1, transition_top=1,
                              w_task=0.7, w_lang=0.3),
    "layer_swap magnitude": MergeConfig(bottom=1, top=1, transition_bottom=2,
                                        magnitude_weights=True),
    "soup": MergeConfig(method="soup", w_task=3.0, w_lang=1.0),
    "magnitude_soup": MergeConfig(method="magnitude_soup"),
    "task_arithmetic": MergeConfig(method="task_arithmetic", lambda_task=0.8, lambda_lang=0.6),
    "ties": MergeConfig(method="ties", ties_density=0.3, ties_lambda=0.9),
}


def tensors(folder) -> dict[str, torch.Tensor]:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def live(tiny, one_thread):
    return LiveModel.from_refs(tiny["task"], tiny["lang"], tiny["base"], dtype=torch.float32)


def test_every_registered_method_is_covered():
    assert set(MERGE_METHODS) <= {c.method for c in CONFIGS.values()}


@pytest.mark.parametrize("block_bytes", [None, 4096])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_disk_and_live_model_give_identical_tensors(live, tiny, tmp_path, monkeypatch, name,
                                                    block_bytes):
    if block_bytes:  # every blend of the tiny models in many row blocks, on disk and in memory
        monkeypatch.setattr(apply, "BLOCK_BYTES", block_bytes)
        monkeypatch.setattr(apply, "LARGE_BLOCK_BYTES", block_bytes)
    cfg = CONFIGS[name]
    disk = tensors(merge_to_folder(cfg, tiny["task"], tiny["lang"], tiny["base"], tmp_path / "m"))
    live.show("base")
    live.show(cfg)
    params = dict(live.model.named_parameters())
    assert set(disk) <= set(params)
    for n, t in disk.items():
        assert torch.equal(params[n].detach(), t), n
    base = tensors(tiny["base"])
    assert any(not torch.equal(disk[n], base[n]) for n in disk)  # a merge, not the base


@pytest.mark.parametrize("workers", [1, 3])
def test_row_blocks_equal_the_whole_tensor_for_ties(tiny, monkeypatch, workers):
    """TIES's trim keeps the top magnitudes of the WHOLE tensor: in row blocks the threshold is
    taken once over the whole tensor, so a block trims as the whole would (a per-block top-k
    would keep a different set). Blocks computed on several threads come back in row order with
    the same bits."""
    readers = {r: CheckpointReader(tiny[r]) for r in ("base", "task", "lang")}
    n = "model.embed_tokens.weight"
    src = Source("ties", ("base", "task", "lang"), (1.0, 1.0), (("density", 0.1), ("lam", 1.0)))
    shape = readers["task"].shape(n)
    fetch = lambda m, rows: readers[m].read_rows(n, rows)  # noqa: E731
    whole = methods.apply("ties", [readers[m].read(n) for m in src.models], src.weights,
                          src.kwargs())
    monkeypatch.setattr(apply, "BLOCK_BYTES", 1 << 16)
    blocks = list(apply.source_rows(n, src, shape, fetch, torch.float32, workers=workers))
    assert [r.start for r, _ in blocks[1:]] == [r.stop for r, _ in blocks[:-1]]
    assert len(blocks) > 10 and blocks[0][0].start == 0 and blocks[-1][0].stop == shape[0]
    assert torch.equal(torch.cat([v for _, v in blocks]), whole)
    per_block = torch.cat([methods.apply("ties", [fetch(m, rows) for m in src.models],
                                         src.weights, src.kwargs()) for rows, _ in blocks])
    assert not torch.equal(per_block, whole)  # what blocks without the whole threshold would give


def test_merge_workers_follow_the_variable_and_the_device(monkeypatch):
    monkeypatch.setenv(apply.WORKERS_ENV, "3")
    assert apply.merge_workers("cpu") == 3 and apply.merge_workers("cuda:0") == 1
    monkeypatch.setenv(apply.WORKERS_ENV, "not a number")
    assert 1 <= apply.merge_workers("cpu") <= 2


def test_read_rows_and_write_rows_round_trip(tiny, tmp_path):
    reader = CheckpointReader(tiny["task"])
    n = "model.embed_tokens.weight"
    full = reader.read(n)
    rows = [slice(0, 7), slice(7, 1000), slice(1000, full.shape[0])]
    pieces = [reader.read_rows(n, r) for r in rows]
    assert torch.equal(torch.cat(pieces), full)
    w = ShardedWriter(tmp_path, "1GB")
    w.declare(n, full.shape, full.dtype)
    w.declare("scalar", (), torch.float32)
    w.write_rows(n, iter(pieces))
    w.write_rows("scalar", [torch.tensor(2.5)])
    w.finish()
    w.close()
    got = tensors(tmp_path)
    assert torch.equal(got[n], full) and got["scalar"].item() == 2.5
    w = ShardedWriter(tmp_path / "short", "1GB")
    (tmp_path / "short").mkdir()
    w.declare(n, full.shape, full.dtype)
    with pytest.raises(ValueError, match="pieces of"):
        w.write_rows(n, pieces[:2])
    w.close()


def test_copy_runs_join_neighbours_and_keep_the_source_alignment(tmp_path):
    """Tensors that follow each other in one source file are copied by one kernel call, at an
    offset that agrees with the source's modulo ALIGN (the header is padded); a new group starts
    a new shard; any write order gives the same file, readable by safetensors."""
    from safetensors.torch import save_file

    src = {"a": torch.randn(3, 5), "b": torch.arange(10, dtype=torch.float32),
           "c": torch.randn(4).to(torch.bfloat16), "d": torch.randn(2, 2)}
    (tmp_path / "src").mkdir()
    save_file(src, tmp_path / "src" / "model.safetensors")
    reader = CheckpointReader(tmp_path / "src")
    locs = {n: reader.location(n) for n in src}
    order = sorted(src, key=lambda n: locs[n].offset)
    first, second, last = order[0], order[1], order[-1]
    out = tmp_path / "out"
    out.mkdir()
    w = ShardedWriter(out, "1GB")
    w.PAD_MIN = 0   # pad even this small shard (by default only shards copying >= 64 MiB)
    for n in order:
        group = "later" if n == last else "first"
        w.declare(n, src[n].shape, src[n].dtype,
                  copied_from=None if n == order[2] else locs[n].offset, group=group)
    w.write(last, src[last])   # before the others: every tensor has its place
    w.write(order[2], src[order[2]])
    calls = []
    w.copy_runs([(first, locs[first]), (second, locs[second])],
                on_bytes=lambda k, name: calls.append((k, name)))
    assert calls == [(locs[first].nbytes + locs[second].nbytes, first)]   # one call for both
    w.finish()
    w.close()
    shards = sorted(out.glob("*.safetensors"))
    assert len(shards) == 2   # the group changed before the last tensor
    got = load_file(shards[0]) | load_file(shards[1])
    assert set(got) == set(src) and all(torch.equal(got[n], src[n]) for n in src)
    placed = CheckpointReader(out).location(first)
    assert placed.offset % ShardedWriter.ALIGN == locs[first].offset % ShardedWriter.ALIGN
    assert CheckpointReader(out).location(last).offset < ShardedWriter.ALIGN   # no copy: no pad


def test_a_failing_copy_stops_the_merge_and_leaves_nothing(tiny, tmp_path, monkeypatch):
    """The copy lane runs on its own thread: a disk that fills up under it reaches the caller as
    the merge's one-line error, and no output folder is left."""
    import errno

    from layerswap_core.checkpoints import writing
    from layerswap_core.merge.errors import MergeError

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(writing, "_copy_range", full)
    cfg = MergeConfig(task=str(tiny["task"]), lang=str(tiny["lang"]), bottom=1, top=1)
    with pytest.raises(MergeError, match="disk full") as e:
        merge_to_folder(cfg, out=tmp_path / "m")
    assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- numpy blocks
def _edge_rows(cols: int) -> torch.Tensor:
    """float32 rows of the values casts get wrong most easily: halfway cases of bfloat16 and
    float16 rounding (ties to even, up and down), large values (a quarter of the largest:
    weights up to 4 do not overflow), subnormals, signed
    zeros, and numbers just around 1."""
    bits = torch.tensor([0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF, 0x7E7F7FFF, 0x7E7F8000,
                         0x00000001, 0x00400000, 0x80000000, 0x3F800001, 0xBF808000, 0x477FE000,
                         0x477FF000, 0x33800000, 0x33000001, 0x387FC000], dtype=torch.int64)
    vals = bits.to(torch.int32).view(torch.float32)
    return vals.repeat(cols // len(vals) + 1)[:cols].reshape(1, cols).repeat(4, 1)


@pytest.fixture(scope="module")
def dtyped(tiny, tmp_path_factory):
    """The tiny task and language experts' embeddings (their first 4,000 rows, scaled and not,
    around rows of edge values: 125 row blocks at the test's block size) saved in float32,
    float16 and bfloat16 as "wide", and as "narrow" without the edge values beyond float16's
    range: {st dtype: {model: folder}}. (All 49,152 rows made 1,540 blocks a tensor: 3.4 s a
    case, 82 s for the 24, in per-block overhead.)"""
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("dtyped")
    n = "model.embed_tokens.weight"
    found = {}
    for m in ("task", "lang"):
        t = CheckpointReader(tiny[m]).read(n).float()[:4000]
        edge = _edge_rows(t.shape[1]) * (1.0 if m == "task" else -0.5)
        found[m] = torch.cat([t * 3000, edge, t])   # *3000: beyond float16's precision
        found[m + " narrow"] = torch.where(found[m].abs() <= 65504, found[m], 0.5)
    out = {}
    for st, dt in (("F32", torch.float32), ("F16", torch.float16), ("BF16", torch.bfloat16)):
        out[st] = {}
        for m in ("task", "lang"):
            (root / st / m).mkdir(parents=True)
            save_file({"wide": found[m].to(dt), "narrow": found[m + " narrow"].to(dt)},
                      root / st / m / "model.safetensors")
            out[st][m] = root / st / m
    return out


@pytest.mark.parametrize("weights", [(0.7, 0.3), (3.0, 1.0), (1.0, 2.0), (1.0, 1.0)])
@pytest.mark.parametrize("st_in,st_out", [("BF16", "BF16"), ("F16", "F16"), ("F32", "F32"),
                                          ("F32", "BF16"), ("BF16", "F16"), ("F16", "F32")])
def test_numpy_blocks_are_torchs_bits(dtyped, monkeypatch, st_in, st_out, weights):
    """A linear blend (and a cast) computed with numpy (``array_rows``, the disk merge on the
    CPU) gives the bits torch gives (``source_rows``), in every supported input and output dtype,
    halfway rounding cases and weights that do not sum to 1 included; with several workers too.
    Where torch refuses (values beyond float16's range), numpy refuses with the same error."""
    from layerswap_core.checkpoints.reading import ST_TO_DTYPE
    from layerswap_core.merge.errors import MergeError

    readers = {m: CheckpointReader(dtyped[st_in][m]) for m in ("task", "lang")}
    monkeypatch.setattr(apply, "BLOCK_BYTES", 1 << 14)
    compared = 0
    for n, src in itertools.product(("wide", "narrow"), (Source("linear", ("task", "lang"), weights),
                                                       Source.copy("lang"))):
        shape = readers["task"].shape(n)
        fetch = lambda m, rows: readers[m].read_rows(n, rows)  # noqa: E731
        arrays = lambda m, rows: readers[m].read_array(n, rows)  # noqa: E731
        assert apply.arrays_can(src, [st_in, st_out])
        try:
            want = torch.cat([v for _, v in apply.source_rows(n, src, shape, fetch,
                                                              ST_TO_DTYPE[st_out])])
        except MergeError as e:
            with pytest.raises(MergeError) as got:
                list(apply.array_rows(n, src, shape, arrays, {"task": st_in, "lang": st_in},
                                      st_out, fetch, workers=2))
            assert str(got.value) == str(e)
            continue
        compared += 1
        for workers in (1, 2):
            blocks = list(apply.array_rows(n, src, shape, arrays, {"task": st_in, "lang": st_in},
                                           st_out, fetch, workers=workers))
            numpy_blocks = [v for _, v in blocks if type(v).__module__ == "numpy"]
            # the edge rows past the input dtype's range are inf there: torch computes those
            assert len(blocks) > 100 and len(numpy_blocks) >= len(blocks) - 2
            got = torch.cat([_as_torch(v, want.dtype) for _, v in blocks])
            bits = torch.int16 if want.dtype.itemsize == 2 else torch.int32   # NaN too
            assert torch.equal(got.view(bits), want.view(bits)), (n, src, workers)
    assert compared >= 2


def _as_torch(v, dtype: torch.dtype) -> torch.Tensor:
    """A block of ``array_rows`` (a numpy array of raw values, or torch's tensor) as ``dtype``."""
    if isinstance(v, torch.Tensor):
        return v
    return torch.from_numpy(v.view("<i2") if v.dtype.kind == "u" else v).view(dtype)


def test_numpy_blocks_leave_non_finite_values_to_torch(tmp_path):
    """A block that is not finite is computed again by torch: NaN inputs come out as torch writes
    them, and finite inputs that overflow the output dtype raise torch's MergeError."""
    from safetensors.torch import save_file

    from layerswap_core.merge.errors import MergeError

    n = "w"
    a = torch.ones(8, 16)
    a[5, 3] = float("nan")
    b = torch.full((8, 16), 3e38)
    for m, t in (("a", a), ("b", b)):
        (tmp_path / m).mkdir()
        save_file({n: t.to(torch.bfloat16)}, tmp_path / m / "model.safetensors")
    readers = {m: CheckpointReader(tmp_path / m) for m in ("a", "b")}
    fetch = lambda m, rows: readers[m].read_rows(n, rows)  # noqa: E731
    arrays = lambda m, rows: readers[m].read_array(n, rows)  # noqa: E731
    dtypes = {"a": "BF16", "b": "BF16"}
    src = Source("linear", ("a", "a"), (1.0, 2.0))
    got = [v for _, v in apply.array_rows(n, src, (8, 16), arrays, dtypes, "BF16", fetch)]
    want = next(apply.source_rows(n, src, (8, 16), fetch, torch.bfloat16))[1]
    assert len(got) == 1 and isinstance(got[0], torch.Tensor)
    assert torch.equal(got[0].view(torch.int16), want.view(torch.int16))   # NaN's bits too
    assert torch.isnan(want.float()).sum() == 1
    src = Source("linear", ("b", "b"), (1.0, 1.0))   # 3e38 + 3e38: inf in float32
    with pytest.raises(MergeError, match="gives inf/NaN from finite inputs"):
        list(apply.array_rows(n, src, (8, 16), arrays, {"b": "BF16"}, "BF16", fetch))
    assert not apply.arrays_can(Source("ties", ("a", "b"), (1.0,)), ["BF16"])
    assert not apply.arrays_can(src, ["BF16"], "cuda")
    assert not apply.arrays_can(src, ["F64"])


def test_a_bfloat16_layer_swap_is_the_same_with_numpy_and_with_torch(tiny, tmp_path, monkeypatch):
    """The disk merge of bfloat16 experts (layer swap with transitions and a blended embedding,
    float16 output too) writes the same bytes whether its blends run in numpy or in torch."""
    from safetensors.torch import save_file

    models = {}
    for m in ("task", "lang"):
        models[m] = tmp_path / m
        shutil.copytree(tiny[m], models[m])
        (models[m] / "model.safetensors").unlink()
        save_file({k: v.to(torch.bfloat16) for k, v in tensors(tiny[m]).items()},
                  models[m] / "model.safetensors", metadata={"format": "pt"})
    cfg = MergeConfig(bottom=2, top=1, transition_bottom=1, transition_top=1, w_task=0.7,
                      w_lang=0.3)
    paths = []   # which path computed each blended tensor

    def counted(name, real):
        def run(*a, **k):
            paths.append(name)
            return real(*a, **k)
        return run

    for dtype in (None, "float16"):
        cfg = replace(cfg, dtype=dtype)
        monkeypatch.setattr(executor, "array_rows", counted("numpy", apply.array_rows))
        monkeypatch.setattr(executor, "source_rows", counted("torch", apply.source_rows))
        numpy_out = merge_to_folder(cfg, models["task"], models["lang"], out=tmp_path / "np")
        assert paths and set(paths) == {"numpy"}
        paths.clear()
        monkeypatch.setattr(executor, "arrays_can", lambda *a, **k: False)   # the executor's name
        torch_out = merge_to_folder(cfg, models["task"], models["lang"], out=tmp_path / "pt")
        assert paths and set(paths) == {"torch"}
        paths.clear()
        monkeypatch.undo()
        files = sorted(p.name for p in numpy_out.glob("*.safetensors"))
        assert files == sorted(p.name for p in torch_out.glob("*.safetensors"))
        for f in files:
            assert (numpy_out / f).read_bytes() == (torch_out / f).read_bytes(), (dtype, f)
        got = tensors(numpy_out)
        assert got["model.embed_tokens.weight"].dtype == (torch.float16 if dtype else torch.bfloat16)
        shutil.rmtree(numpy_out)
        shutil.rmtree(torch_out)
