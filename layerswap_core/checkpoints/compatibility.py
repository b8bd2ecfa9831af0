"""The one compatibility check of models used together: merged, compared or shown side by side.

``open_models`` resolves the references and opens them (headers only); ``problems`` lists what
keeps them from being used together, one sentence per problem naming the models: architecture
and depth, vocabulary size, tensor names and shapes, tokenizer identity. The merge
(``merge.executor.open_inputs``), the analysis (``analysis.deltas.delta_stats``) and the app
(``workbench.models.check_models``, through ``compatibility``) all ask it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .architectures import Architecture, get_architecture, text_config, tied_embeddings
from .quantized import quantization, quantization_problem
from .reading import CheckpointReader
from .references import read_config_file, resolve
from .tokenizers import tokenizer_difference

TIED_HEADS = ("lm_head.weight", "embed_out.weight", "language_model.lm_head.weight")


@dataclass
class ModelSet:
    """Models opened together (headers only). The first role is the reference: the others are
    checked against it, and its architecture and tensor names are the set's."""
    refs: dict[str, str]             # role -> reference as given
    paths: dict[str, Path]
    readers: dict[str, CheckpointReader]
    configs: dict[str, dict]
    arch: Architecture               # the reference's
    names: list[str]                 # the reference's tensor names, minus a tied head

    @property
    def reference(self) -> str:
        return next(iter(self.refs))

    @property
    def tied(self) -> bool:
        return tied_embeddings(self.configs[self.reference])


def open_models(refs: dict[str, str | os.PathLike]) -> ModelSet:
    """Resolve and open the models ``{role: reference}`` (headers and configs only); the first
    role is the reference. ModelLoadError / CheckpointError when one cannot be read at all."""
    refs = {role: str(ref) for role, ref in refs.items()}
    paths = {role: resolve(ref) for role, ref in refs.items()}
    return _model_set(refs, paths, {role: read_config_file(p) for role, p in paths.items()})


def _model_set(refs: dict[str, str], paths: dict[str, Path], configs: dict[str, dict]) -> ModelSet:
    readers = {role: CheckpointReader(p) for role, p in paths.items()}
    first = next(iter(refs))
    tied = tied_embeddings(configs[first])
    names = [n for n in readers[first].names() if not (tied and n in TIED_HEADS)]
    return ModelSet(refs, paths, readers, configs, get_architecture(configs[first]), names)


# --------------------------------------------------------------------------- checked once
@dataclass(frozen=True)
class CheckedModels:
    """Models that passed ``problems``, as plain data (it pickles: a session keeps it): their
    references, folders and configs, and a stamp of each folder (its files' names, sizes and
    modification times: no file is read to compare it). ``reopen`` opens them again without
    resolving, reading configs or checking, as long as no stamp changed."""
    refs: dict[str, str]
    paths: dict[str, str]
    configs: dict[str, dict]
    stamps: dict[str, tuple | None]


def folder_stamp(folder: str | os.PathLike) -> tuple | None:
    """(name, size, mtime_ns) of every file in ``folder``, sorted; None when it cannot be listed."""
    try:
        with os.scandir(folder) as entries:
            return tuple(sorted((e.name, st.st_size, st.st_mtime_ns)
                                for e in entries if e.is_file() for st in (e.stat(),)))
    except OSError:
        return None


def checked_models(models: ModelSet) -> CheckedModels:
    """The record of ``models`` after ``problems(models)`` found nothing."""
    return CheckedModels(dict(models.refs), {r: str(p) for r, p in models.paths.items()},
                         {r: dict(c) for r, c in models.configs.items()},
                         {r: folder_stamp(p) for r, p in models.paths.items()})


def reopen(record: CheckedModels | None, refs: dict[str, str]) -> ModelSet | None:
    """The models ``refs`` (the first the reference) opened from ``record`` (headers only: no
    resolving, no config read, no check); None when the record is of other models, or a folder
    changed since (then ``open_models`` and ``problems`` again)."""
    refs = {role: str(ref) for role, ref in refs.items()}
    if record is None or refs != record.refs:
        return None
    if any(record.stamps[r] is None or folder_stamp(record.paths[r]) != record.stamps[r]
           for r in refs):
        return None
    return _model_set(refs, {r: Path(record.paths[r]) for r in refs},
                      {r: dict(record.configs[r]) for r in refs})


def problems(models: ModelSet, *, roles=None, exact: bool = False, tokenizers: bool = True,
             tokenizer_hint: str = "") -> list[str]:
    """Why the models cannot be used together (empty: they can), each against the reference.

    ``roles``: the roles whose tensors are read (default: all); each must have every tensor of
    ``models.names`` with the reference's shape (``exact``: and no other tensor, all the
    reference's included). Tokenizers (``tokenizers``) are compared only when nothing else is
    wrong; ``tokenizer_hint`` is appended to a tokenizer problem (what to do about it)."""
    ref = models.reference
    others = [role for role in models.refs if role != ref]
    quantized = quantized_problem(models)
    if quantized:
        return [quantized]
    out = _architecture_problems(models, others)
    if out:
        return out
    for role in others:
        v, v0 = (text_config(models.configs[r]).get("vocab_size") for r in (role, ref))
        if v != v0:
            out.append(f"different vocabulary sizes: {role} has {v}, {ref} has {v0}")
    names = models.readers[ref].names() if exact else models.names
    shapes = {n: models.readers[ref].shape(n) for n in names}  # every header parsed here
    for role in sorted(set(others if roles is None else roles) & set(others)):
        problem = _tensor_problem(models, role, shapes, exact)
        if problem:
            out.append(problem)
    if tokenizers and not out:
        for role in others:
            why = tokenizer_difference(models.paths[ref], models.paths[role], names=(ref, role))
            if why:
                out.append(f"the tokenizers of {role} and {ref}: {why}{tokenizer_hint}")
    return out


def quantized_problem(models: ModelSet) -> str | None:
    """The one-line refusal of quantized models among ``models`` (``quantized``: from config.json
    and the headers' names and dtypes), or None."""
    found = {}
    for role, reader in models.readers.items():
        why = quantization(models.configs[role], ((n, reader.dtype(n)) for n in reader.names()))
        if why:
            found[role] = why
    return quantization_problem(found)


def _architecture_problems(models: ModelSet, others: list[str]) -> list[str]:
    a0, ref = models.arch, models.reference
    out = []
    for role in others:
        a = get_architecture(models.configs[role])
        if (a.model_type, a.num_layers) != (a0.model_type, a0.num_layers):
            out.append(f"different architectures: {role} is {a.model_type} with {a.num_layers} "
                       f"layers, {ref} is {a0.model_type} with {a0.num_layers} layers")
    return out


def _tensor_problem(models: ModelSet, role: str, shapes: dict, exact: bool) -> str | None:
    """The first difference of ``role``'s tensors from the reference's, or None."""
    ref, reader = models.reference, models.readers[role]
    where, where0 = f"{role} ({models.paths[role]})", f"{ref} ({models.paths[ref]})"
    missing = [n for n in shapes if n not in reader]
    if missing:
        return f"{where} lacks {len(missing)} tensor(s) the {ref} has, e.g. {missing[0]!r}"
    extra = [n for n in reader.names() if n not in shapes] if exact else []
    if extra:
        more = f" ({len(extra)} such tensors)" if len(extra) > 1 else ""
        return f"tensor {extra[0]}: in the {where} but not in the {where0}{more}"
    for n, shape0 in shapes.items():
        if reader.shape(n) != shape0:
            return (f"tensor {n}: shape {list(reader.shape(n))} in the {where} but "
                    f"{list(shape0)} in the {where0}")
    return None


def compatibility(refs: dict[str, str]) -> list[str]:
    """Problems that keep the given models from being merged (empty list: compatible), checked
    against the task expert ("task" role; else the first): ``problems`` of ``open_models``."""
    order = sorted(refs, key=lambda role: role != "task")
    return problems(open_models({role: refs[role] for role in order}))
