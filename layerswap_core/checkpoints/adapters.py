"""PEFT LoRA adapters on disk: the one reader, the check against a base, the applier.

An adapter folder holds adapter_config.json and adapter_model.safetensors. ``load_adapter`` reads
it (linear and embedding LoRA, rsLoRA, fan_in_fan_out, per-module rank_pattern / alpha_pattern;
DoRA and saved modules are refused) and, given a base model *folder*, checks it fits;
``apply_adapter`` writes base + adapter as a dense model folder, one tensor at a time, bit-identical
to PEFT's merge_and_unload. Everything here takes folders: references are resolved above
(``references.resolve``); the cached dense form of an adapter given by reference is
``loading.dense_from_adapter``. The merge plans over adapters are ``merge.lora``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..progress import Progress, say
from .reading import ST_TO_DTYPE, TORCH_DTYPES, CheckpointReader, read_json_object
from .tokenizers import TOKENIZER_FILES
from .writing import ShardedWriter, atomic_output_dir

if TYPE_CHECKING:   # annotations only: torch is imported where it is used (start-up)
    import torch

ADAPTER_CONFIG = "adapter_config.json"   # a folder with it is a PEFT adapter, not a model

ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
PEFT_LORA_ALPHA = 8   # LoraConfig's default lora_alpha (peft 0.21), for a config that omits it
# A LoRA tensor's key: [base_model.model.]<module>.lora_{A,B,embedding_A,embedding_B}[.<adapter
# name>][.weight] (an embedding's A and B are parameters: no ".weight").
LORA_KEY = re.compile(r"^(?:base_model\.model\.)?(.+)\.lora_(A|B|embedding_A|embedding_B)"
                      r"(?:\.[^.]+)?(?:\.weight)?$")
# PEFT also saves the base weights of adapted embedding layers (save_embedding_layers="auto").
BASE_LAYER_KEY = re.compile(r"^(?:base_model\.model\.)?(.+)\.base_layer\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot be used (missing files, other base, unsupported features)."""


def is_adapter(path) -> bool:
    """Whether ``path`` (a reference or folder) is a PEFT adapter folder (has adapter_config.json).
    The one test of it, shared by the model resolver, the analysis and the merge."""
    p = Path(str(path)).expanduser()
    return p.is_dir() and (p / ADAPTER_CONFIG).is_file()


def read_adapter_config(path) -> dict:
    """An adapter folder's adapter_config.json as a dict; AdapterError naming the file if it is
    missing or not a JSON object."""
    p = Path(str(path)).expanduser() / ADAPTER_CONFIG
    if not p.is_file():
        raise AdapterError(f"{p.parent}: no {ADAPTER_CONFIG} (not a PEFT adapter folder)")
    return read_json_object(p, AdapterError, "an adapter config")


@dataclass
class LoraModule:
    A: torch.Tensor        # r x in (an embedding's lora_embedding_A: r x vocab)
    B: torch.Tensor        # out x r (an embedding's lora_embedding_B: dim x r)
    scale: float
    embedding: bool = False        # lora_embedding_A/B of an embedding layer
    fan_in_fan_out: bool = False   # the base weight is stored (in, out) (GPT-2's Conv1D)

    @property
    def transposed(self) -> bool:
        """Whether the base weight is (B @ A).T (PEFT's ``transpose(B @ A, ...)``)."""
        return self.embedding or self.fan_in_fan_out

    @property
    def rank(self) -> int:
        return self.A.shape[0]

    @property
    def shape(self) -> tuple[int, int]:
        """The shape of the base weight this module changes."""
        out_f, in_f = self.B.shape[0], self.A.shape[1]
        return (in_f, out_f) if self.transposed else (out_f, in_f)

    def delta(self) -> torch.Tensor:
        """The change of the base weight, in float32: ``scale * B @ A`` (transposed where the
        weight is), as PEFT's ``get_delta_weight`` computes it."""
        d = self.scale * (self.B.float() @ self.A.float())
        return d.T if self.transposed else d


@dataclass
class LoraAdapter:
    path: Path
    config: dict
    modules: dict[str, LoraModule]        # base module name (e.g. model.layers.0.self_attn.q_proj)
    saved: dict[str, torch.Tensor] = field(default_factory=dict)   # base weights PEFT saved along

    @property
    def base_ref(self) -> str | None:
        return self.config.get("base_model_name_or_path")

    @property
    def files(self) -> list[Path]:
        return [self.path / ADAPTER_CONFIG, self.path / ADAPTER_WEIGHTS]


def _pattern_value(pattern: dict | None, module: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup for a module (PEFT's own ``get_pattern_key``:
    a key matches a module-name suffix)."""
    if not pattern:
        return default
    from peft.utils.other import get_pattern_key

    return pattern.get(get_pattern_key(pattern.keys(), module), default)


def _check_config(path: Path, cfg: dict) -> None:
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"{path}: a {cfg.get('peft_type')} adapter; only LoRA is supported")
    for feature in ("use_dora", "modules_to_save"):
        if cfg.get(feature):
            raise AdapterError(f"{path}: {feature} adapters are not supported (only plain LoRA: "
                               "their change is not B @ A)")


def _pairs(path: Path, tensors: dict[str, torch.Tensor], saved: dict) -> dict[str, dict]:
    """{module: {"A": .., "B": .., "embedding": ..}} from the adapter's tensors; the base weights
    saved along go into ``saved`` ({weight name: tensor})."""
    pairs: dict[str, dict] = {}
    for name, t in tensors.items():
        m = LORA_KEY.match(name)
        if not m and BASE_LAYER_KEY.match(name):
            saved[BASE_LAYER_KEY.match(name).group(1) + ".weight"] = t
            continue
        if not m:
            raise AdapterError(f"{path}: tensor {name!r} is not a LoRA A/B matrix (bias or "
                               "saved-module adapters are not supported)")
        which = m.group(2)
        pairs.setdefault(m.group(1), {})[which[-1]] = t
        pairs[m.group(1)]["embedding"] = which.startswith("embedding")
    return pairs


def load_adapter(path, base=None) -> LoraAdapter:
    """Read a PEFT LoRA adapter folder (the one reader: merge, analysis, the app); with ``base``
    (a model folder), check it fits. Linear and embedding LoRA, rsLoRA, fan_in_fan_out,
    per-module rank_pattern / alpha_pattern; DoRA and saved modules are refused."""
    from safetensors.torch import load_file

    path = Path(str(path)).expanduser()
    cfg = read_adapter_config(path)
    _check_config(path, cfg)
    weights = path / ADAPTER_WEIGHTS
    if not weights.exists():
        raise AdapterError(f"{path}: no {ADAPTER_WEIGHTS}")
    modules, saved = {}, {}
    for mod, ab in _pairs(path, load_file(str(weights)), saved).items():
        if not {"A", "B"} <= set(ab):
            raise AdapterError(f"{path}: module {mod} has lora_{'A' if 'A' in ab else 'B'} but "
                               "not both A and B")
        r = ab["A"].shape[0]
        alpha = _pattern_value(cfg.get("alpha_pattern"), mod,
                               cfg.get("lora_alpha", PEFT_LORA_ALPHA))
        scale = alpha / (r ** 0.5) if cfg.get("use_rslora") else alpha / r
        modules[mod] = LoraModule(ab["A"], ab["B"], float(scale), ab["embedding"],
                                  bool(cfg.get("fan_in_fan_out")) and not ab["embedding"])
    adapter = LoraAdapter(path, cfg, modules, saved)
    if base is not None:
        check_adapter_base(adapter, base)
    return adapter


def check_adapter_base(adapter: LoraAdapter, base) -> None:
    """Raise AdapterError unless every adapted module exists in ``base`` (a model folder) with
    matching shapes (and the base weights the adapter saved along, if any, are the base's)."""
    folder = Path(str(base)).expanduser()
    if not folder.is_dir():
        raise AdapterError(f"{base}: not a model folder (resolve a model reference first: "
                           "references.resolve)")
    reader = CheckpointReader(folder)
    names = set(reader.names())
    for mod, lm in adapter.modules.items():
        w = mod + ".weight"
        if w not in names:
            raise AdapterError(f"adapter {adapter.path} was not made for base {base}: it adapts "
                               f"{mod}, which the base does not have (adapter base: "
                               f"{adapter.base_ref})")
        if tuple(reader.shape(w)) != lm.shape:
            raise AdapterError(f"adapter {adapter.path} was not made for base {base}: {mod} is "
                               f"{'x'.join(map(str, reader.shape(w)))} in the base but "
                               f"{'x'.join(map(str, lm.shape))} in the adapter (adapter base: "
                               f"{adapter.base_ref})")
    for w, t in adapter.saved.items():   # saved base weights: used only when they are the base's
        if w not in names or not reader.read(w).equal(t):
            raise AdapterError(f"adapter {adapter.path} saves its own {w} (e.g. a resized "
                               "vocabulary), other than the base's; only plain LoRA is supported")


def write_dense(reader, base_path: Path, tmp: Path, modules: dict[str, LoraModule], dtype,
                 tag: str, progress: Progress | None) -> None:
    """Base + LoRA modules as a full model folder in ``tmp``, one tensor at a time: each adapted
    weight becomes ``W + (B @ A) * scale`` in float32 (as PEFT's merge_and_unload computes it),
    then ``dtype`` (None: the base's dtype). Config, tokenizer and generation config follow."""
    names = reader.names()
    writer = ShardedWriter(tmp, "2GB", metadata={"layerswap": tag})
    for n in names:
        writer.declare(n, reader.shape(n), dtype or ST_TO_DTYPE[reader.dtype(n)])
    try:
        for i, n in enumerate(names):
            t = reader.read(n)
            target = dtype or t.dtype
            lm = modules.get(n[:-len(".weight")]) if n.endswith(".weight") else None
            if lm is not None:
                t = t.float() + lm.delta()
            writer.write(n, t.to(target))
            say(progress, 0.1 + 0.85 * (i + 1) / len(names), n)
        writer.finish()
    finally:
        writer.close()
    cfg = reader.config()
    if dtype is not None:
        cfg["dtype"] = str(dtype).replace("torch.", "")
        cfg.pop("torch_dtype", None)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for f in TOKENIZER_FILES + ("generation_config.json",):
        if (base_path / f).exists():
            (tmp / f).write_bytes((base_path / f).read_bytes())


def apply_adapter(base, adapter, out, *, dtype="bfloat16", progress=None) -> Path:
    """Write base (a model folder) + adapter as a full model folder in ``dtype`` (a torch dtype
    or its name), one tensor at a time.

    Each adapted weight becomes ``W + (B @ A) * scale``, computed as PEFT's ``merge_and_unload``
    does over a float32 base (float32 throughout), then cast to ``dtype``; the result is
    bit-identical to PEFT's (tested) without building a model. ``out`` is replaced atomically.
    """
    t0 = time.time()
    dtype = TORCH_DTYPES[dtype] if isinstance(dtype, str) else dtype
    base_path = Path(str(base)).expanduser().resolve()
    lora = load_adapter(adapter, base_path)
    say(progress, 0.0, f"applying {adapter} to {base}")
    reader = CheckpointReader(base_path)
    with atomic_output_dir(out, overwrite=True, inputs=[base_path, lora.path]) as tmp:
        write_dense(reader, base_path, tmp, lora.modules, dtype, "lora-apply", progress)
    say(progress, 1.0, f"wrote {out} in {time.time() - t0:.1f} s")
    return Path(out).expanduser().resolve()


def scale_to_norms(adapter, reference, out) -> dict[str, float]:
    """Write ``adapter`` to ``out`` with each module's change scaled to the Frobenius norm of
    ``reference``'s change of the same module (its ``lora_B`` multiplied by the ratio): two
    experts of equal rank and steps then also change each weight by as much, and differ only
    in the direction the data gave them (the demo's control expert). Both adapters must adapt
    the same modules. Returns the ratio per module."""
    import torch
    from safetensors.torch import load_file, save_file

    src, ref = load_adapter(adapter), load_adapter(reference)
    if set(src.modules) != set(ref.modules):
        raise AdapterError(f"{src.path} and {ref.path} adapt different modules")
    ratios = {m: float(torch.linalg.matrix_norm(ref.modules[m].delta())
                       / torch.linalg.matrix_norm(src.modules[m].delta()))
              for m in src.modules}
    tensors = load_file(str(src.path / ADAPTER_WEIGHTS))
    for name, t in tensors.items():
        m = LORA_KEY.match(name)
        if m and m.group(2) in ("B", "embedding_B"):
            tensors[name] = (t.float() * ratios[m.group(1)]).to(t.dtype)
    with atomic_output_dir(out, overwrite=True, inputs=[src.path, ref.path]) as tmp:
        save_file(tensors, str(Path(tmp) / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        (Path(tmp) / ADAPTER_CONFIG).write_text((src.path / ADAPTER_CONFIG).read_text())
    return ratios
