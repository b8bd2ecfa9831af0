"""One live model; every role (base, task expert, language expert, merge) is a plan over it.

The app explores models as large as its users bring (1B-8B). Loading base, task and language
expert as three models and copying one for the merge holds about eight checkpoints in memory; a
``LiveModel`` holds one:

* The checkpoints are memory-mapped (``MappedCheckpoint``): a tensor is a zero-copy view of the
  file's pages. Those pages are page cache, shared by every session and process, and the OS can
  evict them under pressure; ``release()`` advises them away when a step is done.
* One torch model (the task expert's architecture and tokenizer) is the only private copy. To
  show a role or a merge, ``apply_plan`` rewrites only the parameters whose source changed since
  the last plan: "base", "task" and "lang" are plans that copy every tensor from that model, a
  merge is the plan of its ``MergeConfig``. Switching roles costs about one read of the changed
  tensors.
* Blends are computed one tensor at a time by ``apply.source_rows`` (the disk executor's function),
  in float32 row blocks of bounded size, each cast into its rows of the parameter.

dtype: ``live_dtype`` picks float32 for small models on the CPU (faster there and bit-identical
to the float32 models the app evaluated before) and the checkpoint's own dtype otherwise (bf16 for
the 1B-8B models users bring: one checkpoint of memory instead of two).
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from collections.abc import Iterator

import torch

from ..checkpoints.compatibility import quantized_problem
from ..checkpoints.reading import CheckpointReader, ST_TO_DTYPE
from ..memory import release_freed_memory
from ..progress import Progress
from ..progress import say as _say
from . import apply
from .apply import magnitude_weights, source_rows
from .config import MergeConfig
from .errors import ConfigError, MergeError
from .executor import Inputs, open_inputs
from .plan import MergePlan, build_plan
from .registry import Source
from ..checkpoints.loading import load_model, runs_in_float32

ROLES = ("base", "task", "lang")


class MappedCheckpoint(Mapping):
    """name -> read-only tensor view of a safetensors checkpoint, memory-mapped (no copy):
    ``CheckpointReader.view``, limited to the plan's names.

    The views share the page cache; nothing is read until a view's data is touched. Views must not
    be written to (the mapping is private: a write would copy the page into this process)."""

    def __init__(self, reader: CheckpointReader, names: list[str] | None = None):
        self.reader = reader
        self.names = list(names if names is not None else reader.names())
        self._known = set(self.names)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._known:
            raise KeyError(name)
        return self.reader.view(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def nbytes(self, name: str) -> int:
        return self.reader.location(name).nbytes

    def read_into(self, name: str, out: torch.Tensor) -> bool:
        """``CheckpointReader.read_into``: plain reads straight into ``out`` (False: no fit)."""
        return name in self._known and self.reader.read_into(name, out)

    def release(self) -> None:
        """Drop this process's hold on the mapped pages (they stay in the page cache, and are
        read again when touched)."""
        self.reader.release()


def _contiguous_head_input(model) -> None:
    """On the CPU in bf16/fp16, give the LM head a contiguous input.

    Generation asks for the last position's logits only, so the head's input is a strided slice
    of the hidden states. PyTorch's CPU matmul then takes a path that holds about four copies of
    the head's weight at once (measured: +769 MiB for a 192 MiB head), which is most of the
    working memory of evaluation on a small model with a large vocabulary. A contiguous copy of
    the slice (a few KB) takes the ordinary bf16 kernel (+1 MiB). Logits can differ in the last
    bits from the strided path; float32 models are left as they are."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or head.weight.device.type != "cpu" or \
            head.weight.dtype not in (torch.bfloat16, torch.float16):
        return
    head.register_forward_pre_hook(lambda module, args: (args[0].contiguous(), *args[1:]))


def role_plan(role: str, names: list[str], arch, config: MergeConfig | None = None) -> MergePlan:
    """The plan that makes the live model one of the three input checkpoints."""
    if role not in ROLES:
        raise ConfigError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    src = Source.copy(role)
    return MergePlan(config or MergeConfig(), arch, {n: src for n in names})


def checkpoint_dtype(reader: CheckpointReader) -> torch.dtype:
    """The dtype most of a checkpoint's floating-point tensors are stored in."""
    counts: dict[torch.dtype, int] = {}
    for n in reader.names():
        loc = reader.location(n)
        dt = ST_TO_DTYPE.get(loc.dtype)
        if dt is not None and dt.is_floating_point:
            counts[dt] = counts.get(dt, 0) + loc.nbytes
    return max(counts, key=counts.get) if counts else torch.float32


def live_dtype(reader: CheckpointReader, device: str = "cpu") -> torch.dtype:
    """float32 for a small model on the CPU, else the checkpoint's dtype (module docstring)."""
    stored = checkpoint_dtype(reader)
    return torch.float32 if runs_in_float32(reader.numel(), device) else stored


@dataclass
class ShowResult:
    """What making the live model show a plan cost."""
    label: str
    rewritten: int        # parameters rewritten
    total: int            # parameters of the model
    nbytes: int           # bytes of the checkpoints' tensors read for them
    seconds: float


def checkpoint_places(model, params: dict, reader: CheckpointReader
                      ) -> tuple[dict[str, str], dict[str, tuple[int, ...]]]:
    """({checkpoint name: model parameter}, {checkpoint name: shape}) of the tensors the model
    is made of. A parameter the checkpoint holds under its own name is itself; any other is what
    transformers' conversion mapping makes of checkpoint tensors (fused experts, renamed blocks),
    found by transformers' own reverse conversion (what ``save_pretrained`` writes) on the
    meta device, not by a copy of its rules. MergeError where the checkpoint lacks a part."""
    from transformers.core_model_loading import revert_weight_conversion

    have = set(reader.names())
    place, shapes = {}, {}
    for live, p in params.items():
        if live in have:
            place[live], shapes[live] = live, tuple(p.shape)
            continue
        parts = revert_weight_conversion(model, {live: torch.empty(p.shape, device="meta")})
        lacking = [n for n in parts if n not in have]
        if lacking or not parts:
            raise MergeError(f"the task checkpoint lacks the model parameter {live!r}"
                             + (f" (transformers makes it of {lacking[0]!r} and others)"
                                if lacking else ""))
        for n, t in parts.items():
            place[n], shapes[n] = live, tuple(t.shape)
    return place, shapes


def checkpoint_buffers(model, reader: CheckpointReader) -> dict[str, torch.Tensor]:
    """{name: buffer} of the model's persistent buffers that are checkpoint tensors, under their
    own name or under what transformers' reverse conversion makes of them (hy_v3's
    ``mlp.e_score_correction_bias``, stored as ``mlp.expert_bias``)."""
    from transformers.core_model_loading import revert_weight_conversion

    have = set(reader.names())
    out = {}
    for prefix, module in model.named_modules():
        for name, b in module._buffers.items():
            if b is None or name in module._non_persistent_buffers_set:
                continue
            full = f"{prefix}.{name}" if prefix else name
            if full not in have:
                parts = revert_weight_conversion(model, {full: torch.empty(b.shape, device="meta")})
                if not parts or any(n not in have for n in parts):
                    continue
            out[full] = b
    return out


def part_indices(model, live: str, param: torch.Tensor) -> dict[str, torch.Tensor]:
    """{checkpoint name: the flat indices of its elements in the parameter ``live``}: the
    parameter's element numbers taken apart by transformers' reverse conversion."""
    from transformers.core_model_loading import revert_weight_conversion

    dtype = torch.int32 if param.numel() < 2 ** 31 else torch.int64
    probe = torch.arange(param.numel(), dtype=dtype).view(param.shape)
    return {n: t.reshape(-1).long() for n, t in revert_weight_conversion(model, {live: probe}).items()}


class LiveModel:
    """A torch model whose parameters are rewritten to show a role or a merge (module docstring)."""

    def __init__(self, inputs: Inputs, *, device: str = "cpu", dtype: torch.dtype | None = None,
                 progress: Progress | None = None):
        quantized = quantized_problem(inputs)   # before transformers loads (or dequantizes) it
        if quantized:
            raise MergeError(f"cannot build the live model: {quantized}")
        self.inputs = inputs
        self.arch = inputs.arch
        self.device = device
        self.dtype = dtype or live_dtype(inputs.readers["task"], device)
        _say(progress, 0.05, "loading the task expert as the live model")
        self.model, self.tokenizer = load_model(inputs.paths["task"], device=device, dtype=self.dtype)
        for p in self.model.parameters():
            p.requires_grad_(False)
        _contiguous_head_input(self.model)
        self.params = dict(self.model.named_parameters())
        # checkpoint tensors the model keeps as buffers (hy_v3's router bias) are written like
        # parameters: the merge's values, not the task expert's left behind
        self.params.update(checkpoint_buffers(self.model, inputs.readers["task"]))
        # checkpoint name -> the model parameter it is (or is part of: fused experts, renamed
        # blocks); plans are over the checkpoint's names
        self.place, self.shapes = checkpoint_places(self.model, self.params, inputs.readers["task"])
        self.names = list(self.place)
        self.fused = {self.place[n] for n in self.names if self.place[n] != n}
        for live in self.fused:   # written through a flat view of its elements
            self.params[live].data = self.params[live].data.contiguous()
        self.sources = {role: MappedCheckpoint(inputs.readers[role], self.names)
                        for role in inputs.readers}
        for role, src in self.sources.items():
            for n in self.names:
                if tuple(src.reader.location(n).shape) != self.shapes[n]:
                    raise MergeError(f"tensor {n}: shape {list(src.reader.location(n).shape)} in "
                                     f"{role} but {list(self.shapes[n])} in the model")
        _say(progress, 0.5, "reading the task expert into the live model")
        self.opened = self._own_parameters()
        release_freed_memory()  # what loading freed goes back to the OS
        self.plan: MergePlan | None = role_plan("task", self.names, self.arch)
        self.label = "task"
        self._magnitude: tuple[float, float] | None = None
        _say(progress, 1.0, "live model ready")

    @torch.no_grad()
    def _own_parameters(self) -> ShowResult:
        """Give each CPU parameter its own memory, read from the task checkpoint once (one read of
        the file, like ``cat``).

        transformers leaves parameters whose dtype matches the file as views of a private mapping
        of it: the first plan that rewrote them paid a page fault and a copy-on-write per page
        (measured 10-17x a ``cat`` of the same bytes). Owned from the start, every later switch is
        a plain read into the same memory. Parameters converted to another dtype are private
        already and are left as they are. Returns what was read, and how long it took (most of
        it, measured, is the kernel handing out fresh zeroed pages, not the read)."""
        t0 = time.perf_counter()
        task, count, nbytes = self.sources["task"], 0, 0
        for n in self.names:
            if self.place[n] != n:   # part of a fused parameter: transformers made it already
                continue
            p = self.params[n]
            if p.device.type != "cpu" or p.dtype != ST_TO_DTYPE.get(task.reader.location(n).dtype):
                continue
            own = torch.empty(p.shape, dtype=p.dtype)
            if task.read_into(n, own):
                p.data = own
                count, nbytes = count + 1, nbytes + task.nbytes(n)
        return ShowResult("task", count, len(self.names), nbytes, time.perf_counter() - t0)

    @classmethod
    def from_refs(cls, task, lang, base=None, **kw) -> LiveModel:
        return cls(open_inputs(task, lang, base), **kw)

    @property
    def has_base(self) -> bool:
        return "base" in self.sources

    def magnitude(self) -> tuple[float, float]:
        """Magnitude-adjusted (w_task, w_lang), read once from the mapped checkpoints."""
        if self._magnitude is None:
            self._magnitude = magnitude_weights(
                lambda role, n, rows: self.sources[role][n] if rows is None
                else self.sources[role][n][rows], self.sources, self.names,
                lambda n: self.shapes[n], block_bytes=apply.LARGE_BLOCK_BYTES)
            self.release()
        return self._magnitude

    def plan_for(self, what: str | MergeConfig) -> MergePlan:
        if isinstance(what, str):
            if what not in self.sources:
                raise ConfigError(f"no {what} model chosen")
            return role_plan(what, self.names, self.arch)
        what.validate(self.arch.num_layers, has_base=self.has_base)
        mag = self.magnitude() if what.uses_magnitude else None
        return build_plan(what, self.names, self.arch, mag)

    def show(self, what: str | MergeConfig, progress: Progress | None = None) -> ShowResult:
        """Make the model a role ("base", "task", "lang") or the merge of a config."""
        label = what if isinstance(what, str) else "merged"
        return self.apply_plan(self.plan_for(what), label, progress)

    @torch.no_grad()
    def apply_plan(self, plan: MergePlan, label: str = "merged",
                   progress: Progress | None = None) -> ShowResult:
        t0 = time.perf_counter()
        changed = plan.changed_names(self.plan)
        nbytes = 0
        self.plan, self.label = None, "unknown"  # a failure half-way: the next plan rewrites all
        # the parts of one fused parameter one after another (its parts' places computed once)
        changed = sorted(changed, key=lambda n: (self.place[n] != n, self.place[n]))
        index: dict[str, dict[str, torch.Tensor]] = {}
        for i, n in enumerate(changed):
            if i % 16 == 0:
                _say(progress, i / max(1, len(changed)), f"{label}: {i}/{len(changed)} tensors")
            src = plan.sources[n]
            live = self.place[n]
            param = self.params[live]
            nbytes += sum(self.sources[m].nbytes(n) for m in src.models)
            if live != n:   # a part of a fused parameter: computed whole, then put in its place
                if live not in index:
                    index = {live: part_indices(self.model, live, param)}
                out = torch.empty(self.shapes[n], dtype=param.dtype, device=param.device)
            else:
                out = param
            if not (src.method == "copy" and self.sources[src.model].read_into(n, out)):
                views = {m: self.sources[m][n] for m in src.models}
                for rows, value in source_rows(
                        n, src, out.shape,
                        lambda m, rows: views[m] if rows is None else views[m][rows],  # noqa: F821
                        out.dtype, out.device,
                        "non-finite result refused; the next plan rewrites every tensor",
                        apply.LARGE_BLOCK_BYTES):
                    (out if rows is None else out[rows]).copy_(value)
                del views
            if out is not param:
                param.data.view(-1)[index[live][n].to(param.device)] = out.reshape(-1)
        del index
        self.plan, self.label = plan, label
        self.release()
        release_freed_memory()
        _say(progress, 1.0, f"{label}: {len(changed)} tensors rewritten")
        return ShowResult(label, len(changed), len(self.names), nbytes, time.perf_counter() - t0)

    def release(self) -> None:
        """Advise the mapped pages away (page cache keeps them while memory allows)."""
        for src in self.sources.values():
            src.release()

    def resident_bytes(self) -> int:
        """Bytes of the live model's own parameters (the session's private memory)."""
        return sum(p.numel() * p.element_size() for p in self.params.values())
