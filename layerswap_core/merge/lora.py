"""LoRA experts in the merge engine: layer swapping of PEFT adapters over one base.

Each adapted linear module ``m`` of an expert carries ``dW = s * B @ A`` (A: r x in, B: out x r,
s = alpha / r, or alpha / sqrt(r) with rsLoRA). The merge plan (``plan.build_plan``) says, per
base weight ``m.weight``, where it comes from; for adapters that means:

    copy task / copy lang   the task / language adapter's A and B for m (none if it has none)
    copy base               no adapter for m (the base weight)
    blend (w_t, w_l)        ranks concatenated:  A = [A_t; A_l],  B = [c_t s_t B_t, c_l s_l B_l]
                            with c = w / (w_t + w_l), so B @ A = c_t dW_t + c_l dW_l exactly
    task arithmetic         the same concatenation with c = lambda_task, lambda_lang

The result is written either as a PEFT adapter folder (per-module ranks in ``rank_pattern``,
``alpha_pattern`` = rank so every scaling is 1 and the scales live in B) or as a dense model
(base + delta). Methods that are not linear in the deltas (TIES, magnitude weights) are refused.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..checkpoints.references import ADAPTER_CONFIG, read_json_object
from ..progress import Progress, say
from .methods import get_method as get_tensor_method
from .registry import concrete, linear_methods

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
    (reference or folder), check it fits. Linear and embedding LoRA, rsLoRA, fan_in_fan_out,
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
    """Raise AdapterError unless every adapted module exists in ``base`` with matching shapes
    (and the base weights the adapter saved along, if any, are the base's)."""
    from ..checkpoints.reading import CheckpointReader
    from ..checkpoints.references import resolve

    reader = CheckpointReader(resolve(base))
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
        if w not in names or not torch.equal(reader.read(w), t):
            raise AdapterError(f"adapter {adapter.path} saves its own {w} (e.g. a resized "
                               "vocabulary), other than the base's; only plain LoRA is supported")


# --------------------------------------------------------------------------- combining
def _coefficients(source, config) -> dict[str, float]:
    """{model: coefficient of its delta} for one plan source (``methods.Method.coefficients``)."""
    coefficients = get_tensor_method(source.method).coefficients
    if source.method != "copy" and source.weights is None:
        raise AdapterError("magnitude-adjusted weights are not supported for LoRA experts")
    if coefficients is not None:
        return coefficients(source)
    raise AdapterError(f"merge method {config.method} is not linear in the deltas; LoRA experts "
                       f"support {', '.join(linear_methods())}")


def combine_adapters(config, adapters: dict[str, LoraAdapter], arch) -> dict[str, LoraModule]:
    """The merged adapter's modules (scale 1: the coefficients and scales are folded into B)."""
    from .plan import build_plan

    if config.method not in linear_methods() or config.uses_magnitude:
        raise AdapterError(f"merge method {config.method}"
                           f"{' with magnitude weights' if config.uses_magnitude else ''} is not "
                           f"linear in the deltas; LoRA experts support {', '.join(linear_methods())}")
    modules = sorted(set().union(*(a.modules for a in adapters.values())))
    plan = build_plan(config, [m + ".weight" for m in modules], arch)
    out = {}
    for m in modules:
        A_parts, B_parts, kinds = [], [], set()
        for model, coef in _coefficients(plan.sources[m + ".weight"], config).items():
            lm = adapters[model].modules.get(m)
            if lm is None or coef == 0:
                continue
            A_parts.append(lm.A.float())
            B_parts.append(lm.B.float() * (coef * lm.scale))
            kinds.add((lm.embedding, lm.fan_in_fan_out))
        if len(kinds) > 1:
            raise AdapterError(f"{m}: the adapters store it differently (fan_in_fan_out)")
        if A_parts:
            out[m] = LoraModule(torch.cat(A_parts, 0), torch.cat(B_parts, 1), 1.0, *kinds.pop())
    return out


def _adapter_config(modules: dict[str, LoraModule], base_ref: str, template: dict) -> dict:
    ranks = {m: lm.rank for m, lm in modules.items()}
    r = max(ranks.values()) if ranks else 1
    return {
        "peft_type": "LORA", "task_type": template.get("task_type", "CAUSAL_LM"),
        "base_model_name_or_path": base_ref, "r": r, "lora_alpha": r, "use_rslora": False,
        "lora_dropout": 0.0, "bias": "none", "init_lora_weights": True,
        "fan_in_fan_out": bool(template.get("fan_in_fan_out", False)),
        "target_modules": sorted(modules), "modules_to_save": None,
        "rank_pattern": {re.escape(m): k for m, k in ranks.items() if k != r},
        "alpha_pattern": {re.escape(m): k for m, k in ranks.items() if k != r},
        "inference_mode": True, "layers_to_transform": None, "layers_pattern": None,
    }


def _peft_tensors(module: str, lm: LoraModule, dtype) -> dict:
    """A merged module's A and B under PEFT's keys (an embedding's without ".weight")."""
    a, b = ("lora_embedding_A", "lora_embedding_B") if lm.embedding else \
        ("lora_A.weight", "lora_B.weight")
    return {f"{PEFT_PREFIX}{module}.{a}": lm.A.to(dtype).contiguous(),
            f"{PEFT_PREFIX}{module}.{b}": lm.B.to(dtype).contiguous()}


def _write_dense(reader, base_path: Path, tmp: Path, modules: dict[str, LoraModule], dtype,
                 tag: str, progress: Progress | None) -> None:
    """Base + LoRA modules as a full model folder in ``tmp``, one tensor at a time: each adapted
    weight becomes ``W + (B @ A) * scale`` in float32 (as PEFT's merge_and_unload computes it),
    then ``dtype`` (None: the base's dtype). Config, tokenizer and generation config follow."""
    from ..checkpoints.reading import ST_TO_DTYPE
    from ..checkpoints.writing import ShardedWriter
    from ..checkpoints.tokenizers import TOKENIZER_FILES

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


def merge_adapters(config, task, lang, base, out, *, dense: bool = False, dtype=None,
                   overwrite: bool = False, force: bool = False,
                   progress: Progress | None = None) -> Path:
    """Layer-swap (or soup / task-arithmetic) two LoRA adapters over ``base`` into ``out``.

    ``dense=False``: a PEFT adapter folder (load with PeftModel.from_pretrained over the base).
    ``dense=True``: a full model folder, base + merged delta, in the base's dtype (or ``dtype``).
    """
    from safetensors.torch import save_file

    from ..checkpoints.architectures import get_architecture
    from ..checkpoints.reading import CheckpointReader
    from ..checkpoints.writing import atomic_output_dir
    from ..checkpoints.references import resolve

    t0 = time.time()
    base_path = resolve(base)
    say(progress, 0.0, "reading the adapters")
    adapters = {"task": load_adapter(task, base_path), "lang": load_adapter(lang, base_path)}
    reader = CheckpointReader(base_path)
    arch = get_architecture(reader.config())
    config = replace(config, task=str(task), lang=str(lang), base=str(base))
    config.validate(arch.num_layers)
    config = concrete(config, arch.num_layers)
    merged = combine_adapters(config, adapters, arch)
    with atomic_output_dir(out, overwrite=overwrite, force=force,
                           inputs=[base_path, adapters["task"].path, adapters["lang"].path]) as tmp:
        if not dense:
            save_dtype = dtype or adapters["task"].modules[next(iter(adapters["task"].modules))].A.dtype
            tensors = {}
            for m, lm in merged.items():
                tensors.update(_peft_tensors(m, lm, save_dtype))
            save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
            acfg = _adapter_config(merged, str(base), adapters["task"].config)
            (tmp / ADAPTER_CONFIG).write_text(json.dumps(acfg, indent=2) + "\n")
        else:
            _write_dense(reader, base_path, tmp, merged, dtype, "lora-merge", progress)
        (tmp / "layerswap.yaml").write_text(config.to_yaml())
    say(progress, 1.0, f"merged adapters into {out} in {time.time() - t0:.1f} s")
    return Path(out).expanduser().resolve()


def apply_adapter(base, adapter, out, *, dtype=torch.bfloat16, progress=None) -> Path:
    """Write base + adapter as a full model folder in ``dtype``, one tensor at a time.

    Each adapted weight becomes ``W + (B @ A) * scale``, computed as PEFT's ``merge_and_unload``
    does over a float32 base (float32 throughout), then cast to ``dtype``; the result is
    bit-identical to PEFT's (tested) without building a model. ``out`` is replaced atomically.
    """
    from ..checkpoints.reading import CheckpointReader
    from ..checkpoints.writing import atomic_output_dir
    from ..checkpoints.references import resolve

    t0 = time.time()
    base_path = resolve(base)
    lora = load_adapter(adapter, base_path)
    say(progress, 0.0, f"applying {adapter} to {base}")
    reader = CheckpointReader(base_path)
    with atomic_output_dir(out, overwrite=True, inputs=[base_path, lora.path]) as tmp:
        _write_dense(reader, base_path, tmp, lora.modules, dtype, "lora-apply", progress)
    say(progress, 1.0, f"wrote {out} in {time.time() - t0:.1f} s")
    return Path(out).expanduser().resolve()


def dense_from_adapter(adapter, base, progress: Progress | None = None) -> Path:
    """A PEFT adapter folder as a dense model folder: merged into its base once (float32, so
    small deltas survive), cached in ``cache_dir()/adapters`` by the identity of both. Plain LoRA
    is applied streaming (``apply_adapter``); other kinds (DoRA, saved modules) by PEFT itself."""
    import hashlib

    from ..checkpoints.references import resolve
    from ..checkpoints.writing import cache_dir

    folder = Path(str(adapter)).expanduser().resolve()
    if not base:
        raise AdapterError(f"{folder} is a PEFT adapter: give its base model too")
    base_path = resolve(base)
    ident = [str(base_path), *[(f.name, f.stat().st_size, f.stat().st_mtime_ns)
                               for f in sorted(folder.iterdir()) if f.is_file()]]
    key = hashlib.sha1(json.dumps(ident).encode()).hexdigest()[:16]
    out = cache_dir() / "adapters" / f"{folder.name}-{key}"
    if (out / "config.json").exists():
        return out
    say(progress, 0.1, f"merging the adapter {folder.name} into its base (once)")
    try:
        load_adapter(folder, base_path)
    except AdapterError:
        return _peft_merge(folder, base_path, out)  # PEFT knows more kinds (or says what is wrong)
    return apply_adapter(base_path, folder, out, dtype=torch.float32)  # bit-identical to PEFT's


def _peft_merge(folder: Path, base_path: Path, out: Path) -> Path:
    """PEFT's merge_and_unload of the adapter over the base (float32), saved as ``out``."""
    import shutil
    import tempfile

    from peft import PeftModel

    from ..checkpoints.loading import load_model

    model, tok = load_model(base_path, device="cpu", dtype=torch.float32)
    try:
        merged = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    except Exception as e:  # noqa: BLE001 - peft raises many types for a bad adapter
        why = " ".join(str(e).split()) or type(e).__name__
        raise AdapterError(f"{folder}: cannot apply the adapter to {base_path}: "
                           f"{why if isinstance(e, ValueError) else f'{type(e).__name__}: {why}'}") from e
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=out.parent))
    try:
        merged.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def extract_adapter(base, tuned, out, *, rank: int = 16, dtype=torch.bfloat16,
                    overwrite: bool = False, force: bool = False,
                    progress: Progress | None = None) -> dict:
    """A fully fine-tuned model as a PEFT LoRA adapter over ``base``: each attention / MLP
    projection's change ``dW = W_tuned - W_base`` (float32) is cut to its best rank-``rank``
    approximation (truncated SVD, ``B = U_r sqrt(S_r)``, ``A = sqrt(S_r) V_r^T``, scaling 1).

    Other tensors (embeddings, norms) are not carried: the adapter changes projections only.
    Returns {"out", "modules", "kept"}: ``kept`` is the share of the projections' total
    squared change (Frobenius) the rank keeps, over all modules.
    """
    from safetensors.torch import save_file

    from ..checkpoints.architectures import PROJECTION_KINDS, get_architecture
    from ..checkpoints.reading import CheckpointReader
    from ..checkpoints.references import resolve
    from ..checkpoints.writing import atomic_output_dir

    if int(rank) < 1:
        raise AdapterError(f"rank must be at least 1, got {rank}")
    base_path, tuned_path = resolve(base), resolve(tuned)
    b_reader, t_reader = CheckpointReader(base_path), CheckpointReader(tuned_path)
    arch = get_architecture(t_reader.config())
    names = [n for n in t_reader.names() if n.endswith(".weight")
             and arch.classify(n).kind in PROJECTION_KINDS and len(t_reader.shape(n)) == 2]
    if not names:
        raise AdapterError(f"{tuned}: no attention or MLP projection to extract")
    for n in names:
        if n not in b_reader or tuple(b_reader.shape(n)) != tuple(t_reader.shape(n)):
            raise AdapterError(f"{tuned} does not fit {base}: {n} differs in shape or is missing")
    modules, total, kept = {}, 0.0, 0.0
    for i, n in enumerate(names):
        delta = t_reader.read(n).float() - b_reader.read(n).float()
        U, S, Vh = torch.linalg.svd(delta, full_matrices=False)
        r = min(int(rank), S.numel())
        root = S[:r].sqrt()
        modules[n[:-len(".weight")]] = LoraModule(root[:, None] * Vh[:r], U[:, :r] * root, 1.0)
        total += float((S ** 2).sum())
        kept += float((S[:r] ** 2).sum())
        say(progress, 0.9 * (i + 1) / len(names), f"rank {r}: {n}")
    with atomic_output_dir(out, overwrite=overwrite, force=force,
                           inputs=[base_path, tuned_path]) as tmp:
        tensors = {}
        for m, lm in modules.items():
            tensors.update(_peft_tensors(m, lm, dtype))
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        acfg = _adapter_config(modules, str(base), {})
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(acfg, indent=2) + "\n")
    share = kept / total if total else 1.0
    say(progress, 1.0, f"rank-{rank} adapter of {len(modules)} projections written to {out}: "
                       f"it keeps {share:.1%} of their squared change")
    return {"out": Path(out).expanduser().resolve(), "modules": len(modules), "kept": share}
