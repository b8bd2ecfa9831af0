"""One function from a plan's Source to a tensor (merge/apply.py), for the disk executor and the
live model alike: every registered method gives the same tensors on disk and in memory, whole or
in row blocks, and the disk merge streams blends block by block into the shard."""
from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from layerswap_core.checkpoints.reading import CheckpointReader
from layerswap_core.checkpoints.writing import ShardedWriter
from layerswap_core.merge import apply, methods
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
