"""Writing outputs safely and reading checkpoints strictly (issue #11: items 1, 5, 7, 9, 11).

Real tiny models, real files, real OS errors (a full device, a read-only location, a signal):
an existing folder that is not a layerswap output, an input or the model cache is never
replaced; two merges into one folder cannot both "succeed"; inf/NaN made from finite inputs is
refused; SIGTERM and dead processes leave no partial folders; disk full, read-only outputs and
inconsistent shard indexes end in one line (CLI: exit code 2).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from huggingface_hub import save_torch_state_dict

from layerswap_core.checkpoints import reading, writing
from layerswap_core.checkpoints.cache import build_once, cache_key
from layerswap_core.cli import main
from layerswap_core.checkpoints.reading import CheckpointError, CheckpointReader
from layerswap_core.checkpoints.writing import OutputFolderError, atomic_output_dir, check_output_dir
from layerswap_core.merge.executor import MergeError, merge_to_folder
from layerswap_core.merge.live import LiveModel
from layerswap_core.merge.config import MergeConfig

BLENDED = "model.layers.2.mlp.up_proj.weight"   # blended by BLEND (layer 2 is its transition)
BLEND = MergeConfig(bottom=2, top=1, transition_bottom=1, w_task=1.0, w_lang=1.0)


def tensors(folder) -> dict[str, torch.Tensor]:
    r = CheckpointReader(folder)
    return {n: r.get(n) for n in r.names()}


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def temp_entries(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".old-" in p.name)


def error_line(capsys) -> str:
    """The CLI's error: one line after the progress bar, and no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.endswith("\n"), err
    line = err.rstrip("\n").rsplit("\n", 1)[-1].rsplit("\r", 1)[-1]
    assert line.startswith("layerswap ") and ": error: " in line, err
    return line


def victim(folder: Path) -> Path:
    """A folder that is not a layerswap output, with a file that must survive."""
    folder.mkdir(parents=True)
    (folder / "precious.txt").write_text("do not delete")
    return folder


def edited_copy(src: Path, dst: Path, edit) -> Path:
    """Copy of a single-file tiny model whose tensors pass through ``edit(dict)``."""
    from safetensors.torch import save_file
    shutil.copytree(src, dst)
    (f,) = dst.glob("*.safetensors")
    t = edit(tensors(dst))
    f.unlink()
    save_file(t, str(f), metadata={"format": "pt"})
    return dst


def with_value(name: str, value: float):
    def edit(t):
        t[name] = torch.full_like(t[name], value)
        return t
    return edit


# --------------------------------------------------------------------------- 1: what --overwrite may replace
def test_overwrite_replaces_only_layerswap_outputs(tiny, tmp_path, capsys):
    args = ["merge", "--task", str(tiny["task"]), "--lang", str(tiny["lang"]), "--bottom", "2"]
    out = victim(tmp_path / "notes")
    assert main([*args, "--out", str(out), "--overwrite"]) == 2
    err = error_line(capsys)
    assert "not a layerswap output" in err and "--force" in err
    assert snapshot(out) == {"precious.txt": b"do not delete"} and temp_entries(tmp_path) == []
    assert main([*args, "--out", str(out), "--overwrite", "--force"]) == 0
    assert (out / "layerswap.yaml").is_file() and not (out / "precious.txt").exists()
    # a layerswap output (it has its layerswap.yaml) is replaced with --overwrite alone
    assert main([*args[:-1], "3", "--out", str(out), "--overwrite"]) == 0
    assert MergeConfig.load(out / "layerswap.yaml").bottom == 3
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([*args, "--out", str(empty), "--overwrite"]) == 0  # nothing to lose
    # an input folder, never: even with --force
    before = snapshot(Path(tiny["lang"]))
    assert main([*args, "--out", str(tiny["lang"]), "--overwrite", "--force"]) == 2
    assert "inside the input model folder" in error_line(capsys)
    assert snapshot(Path(tiny["lang"])) == before
    assert temp_entries(tmp_path) == []


def test_the_model_cache_is_never_an_output(tiny, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    model = victim(cache / "embedded" / "smollm2-135m-instruct-v1")
    monkeypatch.setenv("LAYERSWAP_CACHE", str(cache))
    with pytest.raises(OutputFolderError, match="is in the layerswap model cache .*embedded"):
        merge_to_folder(MergeConfig(), task=tiny["task"], lang=tiny["lang"], out=model,
                        overwrite=True, force=True)
    converted = victim(cache / "from_bin" / "model-0123")
    for target in (cache, cache / "embedded", cache / "embedded" / "new", tmp_path, converted,
                   cache / "adapters"):
        with pytest.raises(OutputFolderError, match="cache"):
            check_output_dir(target, overwrite=True, force=True)
    assert snapshot(cache) == {"embedded/smollm2-135m-instruct-v1/precious.txt": b"do not delete",
                               "from_bin/model-0123/precious.txt": b"do not delete"}
    # the builder of an embedded model writes into an empty temporary folder it made there
    tmp = cache / "embedded" / ".smollm2-build"
    tmp.mkdir()
    assert check_output_dir(tmp, overwrite=True) == tmp.resolve()
    # a new folder elsewhere in the cache is allowed (adapters merged into their base once;
    # the output root of the served app)
    for new in (cache / "adapters" / "a", cache / "outputs" / "m"):
        assert check_output_dir(new) == new.resolve()


# --------------------------------------------------------------------------- 5: concurrent merges
def test_two_merges_into_one_folder_exactly_one_wins(tiny, tmp_path):
    out = tmp_path / "m"
    barrier = threading.Barrier(2, timeout=60)
    results: dict[int, object] = {}

    def run(k: int):
        waited = []

        def progress(fraction, msg):
            if fraction > 0 and not waited:  # both are writing their partial folders
                waited.append(barrier.wait())

        try:
            results[k] = merge_to_folder(MergeConfig(bottom=1 + k), task=tiny["task"],
                                         lang=tiny["lang"], out=out, progress=progress)
        except Exception as e:  # noqa: BLE001 - the test looks at what each one got
            results[k] = e

    threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r for r in results.values() if isinstance(r, Exception)]
    assert len(errors) == 1 and isinstance(errors[0], OutputFolderError), results
    assert "appeared while writing" in str(errors[0])
    winner = MergeConfig.load(out / "layerswap.yaml").bottom
    ref = merge_to_folder(MergeConfig(bottom=winner), task=tiny["task"], lang=tiny["lang"],
                          out=tmp_path / "ref")
    got, want = tensors(out), tensors(ref)
    assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in got)
    assert temp_entries(tmp_path) == []


def test_a_folder_that_appears_meanwhile_is_not_replaced(tiny, tmp_path):
    def make_during_merge(action):
        def progress(fraction, msg):
            if fraction > 0.5 and not done:
                done.append(action())
        done = []
        return progress

    kw = dict(task=tiny["task"], lang=tiny["lang"])
    out = tmp_path / "m"   # an empty folder: os.rename would silently replace it
    with pytest.raises(OutputFolderError, match="appeared while writing"):
        merge_to_folder(MergeConfig(), out=out, progress=make_during_merge(out.mkdir), **kw)
    assert list(out.iterdir()) == []
    out.rmdir()
    # with overwrite, only a layerswap output may be replaced: not one that appeared meanwhile
    with pytest.raises(OutputFolderError, match="not a layerswap output"):
        merge_to_folder(MergeConfig(), out=out, overwrite=True,
                        progress=make_during_merge(lambda: victim(out)), **kw)
    assert snapshot(out) == {"precious.txt": b"do not delete"} and temp_entries(tmp_path) == []


# --------------------------------------------------------------------------- 7: inf/NaN from finite inputs
def test_non_finite_results_from_finite_inputs_are_refused(tiny, tmp_path):
    big = 3e38  # finite in float32; the sum of two overflows
    task = edited_copy(tiny["task"], tmp_path / "task", with_value(BLENDED, big))
    lang = edited_copy(tiny["lang"], tmp_path / "lang", with_value(BLENDED, big))
    out = tmp_path / "out"
    with pytest.raises(MergeError, match=f"tensor {BLENDED}: linear .*inf/NaN.*nothing was written"):
        merge_to_folder(BLEND, task=task, lang=lang, out=out)
    assert not out.exists() and temp_entries(tmp_path) == []
    # a cast that overflows the output dtype (a copied tensor of 1e5 in float16)
    copied = "model.layers.4.mlp.up_proj.weight"
    huge = edited_copy(tiny["task"], tmp_path / "huge", with_value(copied, 1e5))
    with pytest.raises(MergeError, match=f"tensor {copied}: the cast to torch.float16"):
        merge_to_folder(MergeConfig(dtype="float16"), task=huge, lang=tiny["lang"], out=out)
    assert not out.exists() and temp_entries(tmp_path) == []
    # inputs that already hold NaN are what they are: merged as given
    nan = edited_copy(tiny["task"], tmp_path / "nan", with_value(BLENDED, float("nan")))
    merged = tensors(merge_to_folder(BLEND, task=nan, lang=tiny["lang"], out=out))
    assert merged[BLENDED].isnan().all()


def test_live_model_refuses_non_finite_and_the_next_plan_rewrites_everything(tiny, tmp_path):
    task = edited_copy(tiny["task"], tmp_path / "task", with_value(BLENDED, 3e38))
    lang = edited_copy(tiny["lang"], tmp_path / "lang", with_value(BLENDED, 3e38))
    live = LiveModel.from_refs(task, lang, dtype=torch.float32)
    for applied in (None, MergeConfig(bottom=2, top=1)):  # first apply, and a later one
        if applied is not None:
            live.show(applied)
        with pytest.raises(MergeError, match=f"tensor {BLENDED}.*non-finite result refused"):
            live.show(BLEND)
        assert live.plan is None  # unknown state: the next plan rewrites every tensor
        res = live.show(MergeConfig(bottom=2, top=1))
        assert res.rewritten == res.total
        expected = tensors(merge_to_folder(MergeConfig(bottom=2, top=1), task=task, lang=lang,
                                           out=tmp_path / "ok", overwrite=True))
        params = dict(live.model.named_parameters())
        assert all(torch.equal(params[n], t) for n, t in expected.items())


# --------------------------------------------------------------------------- 9: SIGTERM, dead processes
SLOW_MERGE = """
import sys, time
from layerswap_core.merge.executor import merge_to_folder
from layerswap_core.merge.config import MergeConfig
def slow(fraction, msg):
    print(f"at {fraction:.3f}", flush=True)
    time.sleep(0.1)
merge_to_folder(MergeConfig(), task=sys.argv[1], lang=sys.argv[2], out=sys.argv[3], progress=slow)
print("finished", flush=True)
"""


def test_sigterm_mid_merge_leaves_nothing(tiny, tmp_path):
    out = tmp_path / "parent" / "m"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_MERGE, str(tiny["task"]), str(tiny["lang"]),
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        for line in proc.stdout:  # wait until tensors are being written into the partial folder
            if line.startswith("at ") and float(line.split()[1]) > 0.1:
                break
        assert temp_entries(out.parent), "the merge should be writing its partial folder"
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, err    # ended by the signal, as without a handler
    assert "finished" not in rest and "Traceback" not in err
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_stale_partials_of_dead_processes_are_removed(tiny, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    live = subprocess.Popen(["sleep", "60"])
    try:
        def partial(kind, pid, host=writing._HOST, name="m"):
            p = tmp_path / f".{name}.{kind}-{host}-{pid}-abc123"
            (p / "x").mkdir(parents=True)
            (p / "x" / "f").write_text(f"{kind} {pid}")
            return p

        stale = partial("partial", dead.pid)
        kept = [partial("partial", live.pid), partial("partial", os.getpid()),
                partial("partial", dead.pid, host="0" * 6)]  # another host's: cannot be judged
        orphan = partial("old", dead.pid, name="earlier")  # died between its two renames
        merge_to_folder(MergeConfig(), task=tiny["task"], lang=tiny["lang"], out=tmp_path / "m")
        assert not stale.exists() and not orphan.exists() and all(p.exists() for p in kept)
        assert (tmp_path / "earlier" / "f").read_text() == f"old {dead.pid}"  # put back
    finally:
        live.kill()
        live.wait()


# --------------------------------------------------------------------------- 11: disk full, read-only
def test_disk_full_is_one_line_and_leaves_nothing(tiny, tmp_path, capsys, monkeypatch):
    """The second shard's file is /dev/full when the writer opens it (the kernel answers
    ENOSPC, as a full disk does), whichever lane (copies or blends) writes there first."""
    from layerswap_core.checkpoints.writing import ShardedWriter

    opened = ShardedWriter._fd

    def full_second_shard(self, k):
        if k == 1 and k not in self._fds:
            (self.out_dir / self.shard_name(k)).symlink_to("/dev/full")
        return opened(self, k)
    monkeypatch.setattr(ShardedWriter, "_fd", full_second_shard)
    out = tmp_path / "m"
    with pytest.raises(MergeError, match="disk full while writing .*nothing was written") as e:
        merge_to_folder(MergeConfig(), task=tiny["task"], lang=tiny["lang"], out=out,
                        shard_size="1MB")
    assert "\n" not in str(e.value)
    assert list(tmp_path.iterdir()) == []


def test_disk_full_on_a_real_small_filesystem(tiny, tmp_path, capsys):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (needs root); /dev/full test covers ENOSPC")
    try:
        rc = main(["merge", "--task", str(tiny["task"]), "--lang", str(tiny["lang"]),
                   "--out", str(mnt / "m")])
        assert rc == 2 and "disk full while writing" in error_line(capsys)
        assert list(mnt.iterdir()) == []
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_read_only_output_is_one_line(tiny, tmp_path, capsys):
    # /sys refuses new folders to everyone, root included (chmod does not stop root)
    rc = main(["merge", "--task", str(tiny["task"]), "--lang", str(tiny["lang"]),
               "--out", "/sys/layerswap-test/m"])
    assert rc == 2 and "nothing was written" in error_line(capsys)
    assert not Path("/sys/layerswap-test").exists()
    frozen = tmp_path / "frozen"
    frozen.mkdir()
    if subprocess.run(["chattr", "+i", str(frozen)], capture_output=True).returncode != 0:
        return  # no immutable folders here: /sys above is the read-only case
    try:
        with pytest.raises((MergeError, writing.OutputWriteError),   # refused before it starts
                           match="Operation not permitted.*nothing was written"):
            merge_to_folder(MergeConfig(), task=tiny["task"], lang=tiny["lang"], out=frozen / "m")
    finally:
        subprocess.run(["chattr", "-i", str(frozen)], check=True)
    assert list(frozen.iterdir()) == []


def test_atomic_output_dir_turns_os_errors_into_one_line(tmp_path):
    with pytest.raises(writing.OutputWriteError, match="disk full while writing .*/o; nothing was written"):
        with atomic_output_dir(tmp_path / "o") as d:
            (d / "f").symlink_to("/dev/full")
            with open(d / "f", "wb") as f:
                f.write(b"x" * 100_000)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- 11: inconsistent shard index
@pytest.fixture()
def sharded(tiny, tmp_path):
    """The tiny task model as 3+ shards with an index."""
    folder = tmp_path / "sharded"
    folder.mkdir()
    for f in Path(tiny["task"]).iterdir():
        if not f.name.endswith(".safetensors"):
            shutil.copy2(f, folder / f.name)
    save_torch_state_dict(tensors(tiny["task"]), folder, max_shard_size="300KB")
    return folder


def _edit_index(folder: Path, name: str, shard: str):
    index = folder / reading.INDEX_NAME
    data = json.loads(index.read_text())
    data["weight_map"][name] = shard
    index.write_text(json.dumps(data))


def test_index_naming_the_wrong_shard_is_one_line(tiny, sharded, capsys):
    r = CheckpointReader(sharded)
    assert len({r.shard(n) for n in r.names()}) >= 3
    name = "model.layers.7.mlp.down_proj.weight"
    wrong = next(s for s in sorted({r.shard(n) for n in r.names()}) if s != r.shard(name))
    _edit_index(sharded, name, wrong)
    with pytest.raises(CheckpointError) as e:
        CheckpointReader(sharded)
    assert wrong in str(e.value) and name in str(e.value) and "index" in str(e.value)
    for argv in (["info", str(sharded)],
                 ["analyze", "--base", str(tiny["base"]), "--expert", str(sharded), "--no-cache"]):
        assert main(argv) == 2
        assert name in error_line(capsys), argv


@pytest.mark.parametrize("shard, msg", [("model-00009-of-00009.safetensors", "is missing"),
                                        ("../task/model.safetensors", "not a file name")])
def test_index_naming_a_missing_or_outside_shard(sharded, shard, msg, capsys):
    _edit_index(sharded, "model.norm.weight", shard)
    with pytest.raises(CheckpointError, match=msg):
        CheckpointReader(sharded)
    assert main(["info", str(sharded)]) == 2
    assert msg in error_line(capsys)


def test_one_reader_reads_views_and_maps_the_same_tensors(sharded):
    """read (pread), view (the mapped shard) and map_tensor (the tensor's pages) give what
    safetensors itself reads, located by the reader's own header parser."""
    r = CheckpointReader(sharded)
    for n in r.names():
        want = r.get(n)
        mapped, release = r.map_tensor(n)
        assert torch.equal(r.read(n), want) and torch.equal(r.view(n), want), n
        assert torch.equal(mapped, want) and tuple(want.shape) == r.shape(n), n
        del mapped
        release()
    r.release()
    assert torch.equal(r.view(n), want)  # released pages are read again when touched


def test_malformed_header_is_one_line(tmp_path):
    import struct

    header = json.dumps({"w": {"dtype": "F32", "shape": [2]}}).encode()  # no data_offsets
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(CheckpointError, match="model.safetensors: cannot read safetensors header"):
        CheckpointReader(tmp_path)


def test_cli_turns_os_errors_into_one_line(tmp_path, capsys):
    from safetensors.torch import save_file
    odd = tmp_path / "model"
    odd.mkdir()
    (odd / "config.json").mkdir()  # a folder where a file is expected: IsADirectoryError
    save_file({"w": torch.zeros(2)}, str(odd / "model.safetensors"))
    assert main(["info", str(odd)]) == 2
    assert "config.json" in error_line(capsys)


# --------------------------------------------------------------------------- the cached build
def test_build_once_first_rename_wins_and_leaves_no_temp_folder(tmp_path):
    final = tmp_path / "cache" / "thing-0123"

    def loser(tmp):    # another process publishes the same folder while this one builds
        (tmp / "config.json").write_text('{"who": "loser"}')
        winner = tmp.parent / "winner"
        winner.mkdir()
        (winner / "config.json").write_text('{"who": "winner"}')
        (winner / "other.txt").write_text("x")
        winner.rename(final)

    assert build_once(final, loser) == final
    assert json.loads((final / "config.json").read_text()) == {"who": "winner"}
    assert sorted(p.name for p in final.parent.iterdir()) == ["thing-0123"]
    calls = []
    assert build_once(final, calls.append) == final and not calls   # built: not again

    def broken(tmp):
        (tmp / "half.bin").write_bytes(b"12")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_once(tmp_path / "cache" / "broken", broken)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["thing-0123"]
    assert cache_key("a", (1, 2)) == cache_key("a", [1, 2]) != cache_key("b")


@pytest.mark.parametrize("out, reason", [
    ("/proc/layerswap-nope/merge", "/proc: No such file or directory"),
    ("/sys/layerswap-nope/merge", "/sys: Operation not permitted"),
    ("/etc/hostname/merge", "/etc/hostname: Not a folder")])
def test_an_unwritable_output_is_named_as_such_never_as_disk_space(tiny, out, reason, capsys):
    """A folder that cannot be written (the kernel's, a read-only one, a file in the way) is
    said so, by the CLI and by the app's save check, before anything runs: never "needs
    0.26 GiB but /proc has only 0.00 GiB free", never "File exists"."""
    from layerswap_core.checkpoints.references import ModelLoadError, check_free_space
    rc = main(["merge", "--task", str(tiny["task"]), "--lang", str(tiny["lang"]), "--out", out])
    line = error_line(capsys)
    assert rc == 2 and reason in line and "nothing was written" in line and "free" not in line
    with pytest.raises(ModelLoadError) as err:
        check_free_space(Path(out).parent, 10**8, f"saving the merge to {out}")
    assert reason in str(err.value) and "GiB" not in str(err.value)
