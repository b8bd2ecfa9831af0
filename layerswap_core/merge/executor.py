"""The merge executor: plan + io + methods, streamed to a folder.

``merge_to_folder`` writes HF sharded safetensors into a temporary folder beside the output and
renames it at the end: a failed or cancelled merge leaves nothing, and the inputs are never
written. Single-source tensors are copied file-to-file (bit-identical); blends (and casts) are
computed in float32 row blocks of bounded size, read with pread and written as they come, so the
memory of a merge does not grow with the tensors: with numpy on the CPU where the method has
arrays (``apply.array_rows``: copies and linear blends, so a default layer swap never imports
torch), else by ``apply.source_rows`` with torch (on CUDA if asked); the same bits either way.
The in-memory counterpart (the app's model) is ``live.LiveModel``.
"""
from __future__ import annotations

import contextlib
import json
import math
import shutil
import threading
import time
from dataclasses import replace
from pathlib import Path

from .. import __version__
from ..checkpoints.compatibility import (CheckedModels, ModelSet, open_models, problems,
                                         quantized_problem, reopen)
from ..checkpoints.reading import (CONFIG_DTYPES, ST_SIZES, ST_TO_DTYPE, CheckpointError,
                                   CheckpointReader)
from ..checkpoints.tokenizers import TOKENIZER_FILES
from ..checkpoints.writing import (OutputWriteError, ShardedWriter, atomic_output_dir,
                                   check_output_dir, parse_size)
from ..progress import Progress, say as _say
from . import apply
from .apply import (array_rows, arrays_can, check_finite, magnitude_weights, merge_workers,
                    one_thread, source_rows)
from .config import MergeConfig
from .errors import ConfigError, MergeError
from .partition import Partition
from .plan import MergePlan, build_plan
from .registry import concrete
from ..checkpoints.loading import pick_device


# --------------------------------------------------------------------------- inputs
Inputs = ModelSet   # the models of a merge: task (the reference), lang, base; headers only


def open_inputs(task, lang, base=None, *, tokenizer_source: str | None = None,
                need: set[str] | None = None, checked: CheckedModels | None = None) -> Inputs:
    """Resolve and check the models (``checkpoints.compatibility``, the task expert as the
    reference); MergeError with every problem found (nothing is read but headers). ``need``:
    roles whose tensors the merge reads (all given roles by default). ``checked``: these models
    as a caller already checked them (a session): reopened from it while their folders are
    unchanged (``compatibility.reopen``), without resolving, reading configs or checking."""
    refs = {"task": task, "lang": lang, "base": base}
    refs = {r: str(v) for r, v in refs.items() if v is not None}
    for role in ("task", "lang"):
        if role not in refs:
            raise MergeError(f"the {role} expert is missing (give --{role})")
    inputs = reopen(checked, refs)
    if inputs is not None:
        quantized = quantized_problem(inputs)   # a record of other code's check: never merged
        if quantized:
            raise MergeError("cannot merge: " + quantized)
        return inputs
    inputs = open_models(refs)
    found = problems(inputs, roles=need, tokenizers=tokenizer_source is None,
                     tokenizer_hint="; choose the tokenizer explicitly (tokenizer_source / "
                                    "--tokenizer-source task|lang|base) if that is intended")
    if found:
        raise MergeError("cannot merge: " + "; ".join(found))
    return inputs


# --------------------------------------------------------------------------- plans
def plan_for(config: MergeConfig, task_ref=None) -> MergePlan:
    """The plan of ``config`` for the task model's architecture, from headers only."""
    ref = task_ref if task_ref is not None else config.task
    if ref is None:
        raise ConfigError("plan_for needs the task model (to know its layers and tensor names)")
    task = open_models({"task": ref})
    return build_plan(config, task.names, task.arch)


def _ordered(names: list[str], reader: CheckpointReader) -> list[str]:
    """Names in the task checkpoint's on-disk order (sequential reads)."""
    def key(n):
        loc = reader.location(n)
        return (loc.path.name, loc.offset)
    return sorted(names, key=key)


# --------------------------------------------------------------------------- disk merge
def merge_to_folder(config: MergeConfig, task=None, lang=None, base=None, out=None, *,
                    device: str = "cpu", shard_size: int | str = "2GB", overwrite: bool = False,
                    force: bool = False, progress: Progress | None = None,
                    checked: CheckedModels | None = None,
                    names: dict[str, str] | None = None) -> Path:
    """Merge into the folder ``out`` (HF format, loadable with from_pretrained); returns its path.

    Models default to ``config.task/lang/base``; the config saved with the output records the
    references actually used. An existing ``out`` is replaced only with ``overwrite``, and only
    if it is a layerswap output (or empty) unless ``force`` (see ``checkpoints.writing.check_output_dir``).
    ``checked``: the models as already checked (``open_inputs``). ``names``: role -> how
    layerswap.yaml and the card name the models instead (a server's visitor: as they named
    them, not the server's folders); then the progress names the output by its folder name.
    """
    if out is None:
        raise ValueError("no output folder given (out=... / --out DIR)")
    config = replace(config, task=str(task or config.task or "") or None,
                     lang=str(lang or config.lang or "") or None,
                     base=str(base or config.base or "") or None)
    config.validate(has_base=config.base is not None)
    max_shard = parse_size(shard_size)
    device = pick_device(device)
    t0 = time.time()
    _say(progress, 0.0, "checking the models")
    inputs = open_inputs(config.task, config.lang, config.base,
                         tokenizer_source=config.tokenizer_source, checked=checked)
    config = concrete(config, inputs.arch.num_layers)  # e.g. the layer counts actually used
    plan = build_plan(config, inputs.names, inputs.arch)
    refs = dict(inputs.refs)
    if names:
        refs = {role: str(names.get(role) or ref) for role, ref in refs.items()}
    recorded = replace(config, **{role: refs.get(role) for role in ("task", "lang", "base")})
    check_output_dir(out, overwrite=overwrite, force=force, inputs=inputs.paths.values())
    readers = inputs.readers
    if config.uses_magnitude:
        _say(progress, 0.0, "computing magnitude-adjusted weights")
        with one_thread(device):
            mag = magnitude_weights(lambda role, n, rows: readers[role].read_rows(n, rows),
                                    readers, inputs.names, readers["task"].shape,
                                    None if progress is None else lambda f, m: progress(0.3 * f, m),
                                    _block_bytes(device))
        plan = plan.with_magnitude(mag)
    missing_models = plan.needs - set(readers)
    if missing_models:
        raise ConfigError(f"the plan needs the {', '.join(sorted(missing_models))} model(s)")
    out_dtype = CONFIG_DTYPES.get(config.dtype) if config.dtype else None
    order = _ordered(inputs.names, readers["task"])
    start = 0.3 if config.uses_magnitude else 0.0

    try:
        with atomic_output_dir(out, overwrite=overwrite, force=force,
                               inputs=inputs.paths.values()) as tmp:
            _write_folder(tmp, inputs, config, plan, order, out_dtype, device, max_shard,
                          lambda f, m: _say(progress, start + (1 - start) * 0.98 * f, m),
                          recorded)
            (tmp / "README.md").write_text(model_card(recorded, plan, refs, time.time() - t0))
    except OutputWriteError as e:  # disk full, read-only...: one line, nothing left written
        raise MergeError(str(e)) from e
    _say(progress, 1.0, f"merged into {Path(out).name if names else out} in "
                        f"{time.time() - t0:.1f} s")
    return Path(out).expanduser().resolve()


def _write_folder(tmp: Path, inputs: Inputs, config: MergeConfig, plan: MergePlan, names: list[str],
                  out_dtype: str | None, device, max_shard: int, progress: Progress,
                  recorded: MergeConfig | None = None):
    """The tensors (sharded), the side files and layerswap.yaml of a merge, into ``tmp``.

    Two lanes side by side: a thread copies the single-source tensors file-to-file (in the
    kernel, contiguous tensors as one range) while this thread computes the blends in row
    blocks; each writes to its tensors' own places in the shards. A copy costs the kernel's
    time, a blend the CPU's, so on two cores the merge takes about the longer of the two
    instead of their sum (bench/merge_bench.py). Errors and cancellation in either lane stop
    both; nothing is left (the caller's temporary folder).
    ``out_dtype``: a safetensors dtype (None: each tensor's own); ``recorded``: the config
    layerswap.yaml records (default ``config``)."""
    readers = inputs.readers
    writer = ShardedWriter(tmp, max_shard, metadata={"layerswap": __version__})
    copies, blends = [], []   # blends: (name, output dtype)
    for n in names:
        loc = readers["task"].location(n)
        target = out_dtype or loc.dtype
        src = plan.sources[n]
        copied = readers[src.model].location(n) if src.method == "copy" else None
        if copied is not None and copied.dtype == target:
            writer.declare(n, loc.shape, target, copied_from=copied.offset, group=loc.path)
            copies.append((n, copied))  # bit-identical, no arithmetic
        else:
            writer.declare(n, loc.shape, target, group=loc.path)
            blends.append((n, target))
    # numpy where it can (no torch at all when it can everywhere), torch for the rest: the
    # inputs' dtypes of each tensor numpy computes
    in_dtypes = {n: {m: readers[m].location(n).dtype for m in plan.sources[n].models}
                 for n, _ in blends}
    with_numpy = {n: in_dtypes[n] for n, target in blends
                  if arrays_can(plan.sources[n], [*in_dtypes[n].values(), target], device)}
    total = sum(readers["task"].location(n).nbytes for n in names) or 1
    lane = None
    try:
        lane = _CopyLane(writer, copies)
        lane.start()
        done = 0
        with one_thread(device) if len(with_numpy) < len(blends) else contextlib.nullcontext():
            for n, target in blends:
                lane.check()
                # while the copies run they keep a core busy: one block thread fewer then
                # (bench/merge_bench.py, cold cache: 2.24 s with one, 3.22 s with two)
                workers = max(1, merge_workers(device) - lane.running())
                _write_tensor(writer, n, plan.sources[n], readers, target, device, workers,
                              with_numpy.get(n))
                done += readers["task"].location(n).nbytes
                progress((done + lane.copied) / total, n)
        _copy_side_files(inputs, config, tmp)   # while the copies finish
        (tmp / "layerswap.yaml").write_text((recorded or config).to_yaml())
        while lane.wait(0.25):
            progress((done + lane.copied) / total, lane.current)
        lane.check()
        writer.finish()
    finally:
        if lane is not None:
            lane.stop()
        writer.close()


class _CopyLane:
    """The single-source tensors of a merge, copied by a thread (``ShardedWriter.copy_runs``).
    ``copied``/``current``: its progress; ``check`` raises its error in the caller's thread;
    ``stop`` asks it to end after its current call and waits for it."""

    def __init__(self, writer: ShardedWriter, items: list):
        self.items, self.copied, self.current, self.error = items, 0, "", None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(writer,), daemon=True,
                                        name="layerswap-copy")

    def _run(self, writer: ShardedWriter):
        def moved(k, name):
            self.copied += k
            self.current = name
        try:
            writer.copy_runs(self.items, self._stop, moved)
        except BaseException as e:  # noqa: BLE001 - raised again in the merging thread
            self.error = e

    def start(self):
        if self.items:
            self._thread.start()

    def wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` for the copies; True while they are still running."""
        if self._thread.is_alive():
            self._thread.join(seconds)
        self.check()
        return self._thread.is_alive()

    def running(self) -> int:
        """1 while the copies are running, else 0."""
        return int(self._thread.is_alive())

    def check(self):
        if self.error is not None:
            raise self.error

    def stop(self):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def _block_bytes(device) -> int:
    """Small row blocks on the CPU (one thread, cache-sized), large ones on a GPU."""
    return apply.BLOCK_BYTES if str(device).startswith("cpu") else apply.LARGE_BLOCK_BYTES


def _write_tensor(writer: ShardedWriter, name: str, src, readers, target: str, device,
                  workers: int, in_dtypes: dict[str, str] | None):
    """One tensor that is not a plain copy: a blend, or a copy cast to another dtype, in
    ``target`` (a safetensors dtype), its row blocks computed by ``workers`` threads; with numpy
    when its inputs' dtypes ``in_dtypes`` are given (``apply.arrays_can``), else with torch."""
    shape = readers["task"].location(name).shape
    rows = lambda m, r: readers[m].read_rows(name, r)  # noqa: E731
    if in_dtypes is not None:
        blocks = array_rows(name, src, shape, lambda m, r: readers[m].read_array(name, r),
                            in_dtypes, target, rows, "nothing was written",
                            _block_bytes(device), workers)
    else:
        blocks = source_rows(name, src, shape, rows, ST_TO_DTYPE[target], device,
                             "nothing was written", _block_bytes(device), workers)
    writer.write_rows(name, (value for _, value in blocks))


def _copy_side_files(inputs: Inputs, config: MergeConfig, dst: Path):
    task = inputs.paths["task"]
    cfg = dict(inputs.configs["task"])
    if config.dtype:
        cfg["dtype"] = config.dtype
        cfg.pop("torch_dtype", None)
    (dst / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    if (task / "generation_config.json").exists():
        shutil.copy2(task / "generation_config.json", dst / "generation_config.json")
    tok_src = inputs.paths[config.tokenizer_source or "task"]
    for f in TOKENIZER_FILES:
        if (tok_src / f).exists():
            shutil.copy2(tok_src / f, dst / f)


CARD_ROOM = 1 << 20      # README.md (the model card), layerswap.yaml and the shard index


def most_output_bytes(inputs: Inputs, shard_size: int | str = "2GB", dtype: str | None = None
                      ) -> int:
    """At most the bytes ``merge_to_folder`` writes for these models (what a save quota
    reserves): the shards (``ShardedWriter.most_bytes``, grouped by the task model's files as
    ``_write_folder`` declares them), every tensor in ``dtype`` (a ``MergeConfig.dtype``; None:
    the task model's own dtypes); config.json and generation_config.json; the largest of the
    models' tokenizer files (any of them may be the tokenizer source); the card, layerswap.yaml
    and the index (``CARD_ROOM``)."""
    task = inputs.readers["task"]
    size = ST_SIZES[CONFIG_DTYPES[dtype]] if dtype else None
    locations = {n: task.location(n) for n in inputs.names}
    shards = ShardedWriter.most_bytes(
        {n: math.prod(loc.shape) * size if size else loc.nbytes for n, loc in locations.items()},
        len({task.shard(n) for n in inputs.names}), shard_size)
    task_dir = inputs.paths["task"]
    side = len(json.dumps(inputs.configs["task"], indent=2)) + 64
    if (task_dir / "generation_config.json").is_file():
        side += (task_dir / "generation_config.json").stat().st_size
    side += max(sum((folder / f).stat().st_size for f in TOKENIZER_FILES
                    if (folder / f).is_file()) for folder in inputs.paths.values())
    return shards + side + CARD_ROOM


def model_card(config: MergeConfig, plan: MergePlan, refs: dict[str, str], seconds: float) -> str:
    """The README.md of a merge of the models ``refs`` (role -> reference, as ``Inputs.refs``)."""
    models = "\n".join(f"- **{role}**: `{ref}`" for role, ref in refs.items())
    return f"""---
tags: [merge, layerswap, layer-swapping]
---
# Merged model (layerswap {__version__})

{config.describe(plan.num_layers)}.

Layer swapping composes a task expert and a language expert fine-tuned from one base: the
bottom and top layers come from the language expert, the middle from the task expert
(Bandarkar et al., 2024, https://arxiv.org/abs/2410.01335).

## Models
{models}

## Plan
```
{plan.summary_text()}
```

## Exact configuration (`layerswap.yaml`)
Re-run with `layerswap merge --config layerswap.yaml --out DIR`.
```yaml
{config.to_yaml().rstrip()}
```

Merged in {seconds:.1f} s.
"""


__all__ = ["MergeConfig", "MergePlan", "Partition", "MergeError", "CheckpointError", "merge_to_folder",
           "most_output_bytes", "plan_for", "check_finite", "open_inputs", "model_card"]
