"""Loading and describing models: the device picker, (model, tokenizer), header summaries, and an
adapter given by reference as a dense model folder (built once into the cache).

Everything here starts from a model reference (see ``references``) and reads exactly the
safetensors files that merge and analysis read.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..progress import Progress, say
from .adapters import AdapterError, apply_adapter, load_adapter
from .architectures import get_architecture, tied_embeddings
from .reading import INDEX_NAME, CheckpointError, CheckpointReader, weight_files
from .references import ModelLoadError, read_config_file, resolve
from .cache import build_once, cache_dir, cache_key


# Below this many parameters a CPU live model is float32 (``merge.live``): at most 2 GB, and the
# outputs equal the float32 evaluations published in the README.
SMALL_MODEL_PARAMS = 500_000_000


def runs_in_float32(num_params: int, device: str) -> bool:
    """Whether a live model of ``num_params`` runs in float32 on ``device`` whatever its
    checkpoint's dtype (a small model on the CPU), rather than in the checkpoint's own dtype:
    ``merge.live.live_dtype``'s rule, which the pre-flight's memory estimate reads too."""
    return str(device).startswith("cpu") and num_params < SMALL_MODEL_PARAMS


def default_dtype(device: str):
    import torch
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


# ZeroGPU Spaces set this: CUDA exists only inside @spaces.GPU calls (in a forked worker), so
# models stay on the CPU in the main process there.
ZERO_GPU = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true")


def cpu_has_bf16() -> bool | None:
    """Whether this CPU has bfloat16 instructions (AVX512-BF16 or AMX-BF16; read from
    /proc/cpuinfo), None where that cannot be read. Without them bf16 matrix products are
    emulated and run several times slower than float32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), None)
    except OSError:
        return None
    return None if flags is None else bool({"avx512_bf16", "amx_bf16"} & set(flags))


def pick_device(device: str | None = None) -> str:
    """The one device picker. None / "auto": $LAYERSWAP_DEVICE if set, else "cuda" when a GPU is
    here (not on a ZeroGPU Space's main process), else "cpu". An explicit "cuda" without a GPU
    is an error. "cpu" is returned without importing torch."""
    if device == "cpu":
        return device
    import torch
    if device in (None, "auto"):
        device = os.environ.get("LAYERSWAP_DEVICE") or (
            "cuda" if not ZERO_GPU and torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' asked for, but no CUDA GPU is available")
    return str(device)


def load_tokenizer(ref, *, trust_remote_code: bool = False):
    from transformers import AutoTokenizer
    path = resolve(ref)
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _weights_entry(path: Path) -> str:
    """The weights file that transformers must read to load what ``CheckpointReader`` (merge,
    analysis) reads: the safetensors index, else the one *.safetensors file."""
    if (path / INDEX_NAME).exists():
        return INDEX_NAME
    files = weight_files(path)
    if len(files) != 1:
        raise ModelLoadError(f"{path}: {len(files)} *.safetensors files but no {INDEX_NAME} "
                             "saying which hold the model; write the index, or keep one file")
    return files[0].name


def _check_weights(path: Path) -> None:
    """Every tensor's header entry is readable and lies within its file (headers only): a
    truncated or corrupt checkpoint is refused with the file's name before transformers sees it."""
    try:
        reader = CheckpointReader(path)
        for name in reader.names():
            reader.location(name)
    except CheckpointError as e:
        raise ModelLoadError(str(e)) from e


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def load_model(ref, *, device: str | None = "cpu", dtype=None, trust_remote_code: bool = False,
               allow_bin: bool | None = None, progress: Progress | None = None):
    """(model, tokenizer) for any reference; model in eval mode on ``device``.

    dtype defaults to float32 on CPU (faster than bf16 there) and bfloat16 on CUDA. The weights
    are read from exactly the safetensors files that merge and analysis read (never a .bin lying
    beside them; a .bin-only folder needs ``allow_bin`` and is converted once, see ``resolve``).
    """
    from safetensors import SafetensorError
    from transformers import AutoConfig, AutoModelForCausalLM

    path = resolve(ref, allow_bin=allow_bin, progress=progress)
    device = pick_device(device)
    dtype = dtype or default_dtype(device)
    entry = _weights_entry(path)
    _check_weights(path)
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        before = config.__dict__.get("transformers_weights")
        config.transformers_weights = entry  # transformers reads this file and nothing else
        model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype,
                                                     use_safetensors=True,
                                                     trust_remote_code=trust_remote_code)
    except (OSError, ValueError, SafetensorError) as e:
        if "trust_remote_code" in str(e):
            raise ModelLoadError(f"{path} needs custom code; pass trust_remote_code=True only if you "
                                 "trust its author") from e
        raise ModelLoadError(f"{path}: cannot load the model: {_one_line(e)}") from e
    if before is None:
        model.config.__dict__.pop("transformers_weights", None)
    else:
        model.config.transformers_weights = before
    model.to(device).eval()
    return model, load_tokenizer(path, trust_remote_code=trust_remote_code)


@dataclass
class ModelInfo:
    ref: str
    path: str
    model_type: str
    family: str
    num_layers: int
    hidden_size: int | None
    vocab_size: int | None
    dtype: str
    num_params: int
    size_bytes: int
    tied_embeddings: bool
    fallback_architecture: bool
    moe: str = ""                          # "MoE: N experts, K active", "" for a dense model
    unclassified: tuple[str, ...] = ()     # tensors no kind rule can address (kind "other")
    vision: int = 0                        # a multimodal wrapper's vision tensors (kind "vision")
    wrapper: str = ""                      # the wrapper's own model type (gemma3 of gemma3_text)
    run_time_kinds: bool = False           # kinds derived from transformers when first opened

    def vision_note(self) -> str | None:
        """What a merge does with a multimodal wrapper's vision tower and projector, or None."""
        if not self.vision:
            return None
        return (f"{self.wrapper or self.model_type} is a multimodal wrapper: its decoder layers are merged; its "
                f"vision tower and projector ({self.vision} tensors) are kept from the task "
                "expert by every method")

    def warning(self) -> str | None:
        """One line naming the tensors no kind rule can address, or None."""
        if not self.unclassified:
            return None
        n = len(self.unclassified)
        more = f" and {n - 3} more" if n > 3 else ""
        return (f"{n} tensor(s) of this {self.model_type} model have no kind layerswap knows "
                f"({', '.join(self.unclassified[:3])}{more}): rules that select kinds cannot "
                "address them (a rule with kinds over their layers is refused); layer selections "
                "and whole-layer swaps still take them")

    @property
    def architecture(self) -> str:
        """"gemma3_text (gemma2 family, dense)", "mixtral (mixtral family, MoE: 8 experts, 2
        active)": the family (whose name rules it follows) said as such, not as if it were the
        model's type, whether its kinds were derived from transformers when it was opened (a
        type the shipped table lacks), and whether it is a mixture of experts."""
        derived = ", kinds derived from transformers' modules at run time" \
            if self.run_time_kinds else ""
        return f"{self.model_type} ({self.family} family{derived}, {self.moe or 'dense'})"

    def summary(self) -> str:
        return (f"{self.architecture}, {self.num_layers} layers, hidden "
                f"{self.hidden_size}, vocab {self.vocab_size}, {self.num_params / 1e6:.1f} M params, "
                f"{self.dtype}, {self.size_bytes / 2**20:.0f} MiB"
                + (", tied embeddings" if self.tied_embeddings else "")
                + (" [unknown family: generic layer regex]" if self.fallback_architecture else ""))


def describe(ref, progress: Progress | None = None) -> ModelInfo:
    """Architecture, size and dtype of a model from its headers (no tensor data read)."""
    path = resolve(ref, progress=progress)
    cfg = read_config_file(path)
    arch = get_architecture(cfg)
    reader = CheckpointReader(path)
    dtypes = sorted({reader.dtype(n) for n in reader.names()})
    tc = cfg.get("text_config", cfg) if "num_hidden_layers" not in cfg else cfg
    return ModelInfo(str(ref), str(path), arch.model_type, arch.name, arch.num_layers,
                     tc.get("hidden_size"), tc.get("vocab_size"), "/".join(dtypes), reader.numel(),
                     reader.nbytes(), tied_embeddings(cfg), arch.is_fallback, arch.moe(),
                     tuple(arch.unclassified(reader.names())), len(arch.vision(reader.names())),
                     str(cfg.get("model_type") or ""), arch.family.run_time)



# --------------------------------------------------------------------------- adapters as models
def dense_from_adapter(adapter, base, progress: Progress | None = None) -> Path:
    """A PEFT adapter folder as a dense model folder: merged into its base (a reference) once
    (float32, so small deltas survive), cached in ``cache_dir()/adapters`` by the identity of
    both (``build_once``). Plain LoRA is applied streaming (``adapters.apply_adapter``); other
    kinds (DoRA, saved modules) by PEFT itself."""
    import torch

    folder = Path(str(adapter)).expanduser().resolve()
    if not base:
        raise AdapterError(f"{folder} is a PEFT adapter: give its base model too")
    base_path = resolve(base)
    key = cache_key(str(base_path), *[(f.name, f.stat().st_size, f.stat().st_mtime_ns)
                                      for f in sorted(folder.iterdir()) if f.is_file()])
    out = cache_dir() / "adapters" / f"{folder.name}-{key}"
    if (out / "config.json").exists():
        return out
    say(progress, 0.1, f"merging the adapter {folder.name} into its base (once)")
    try:
        load_adapter(folder, base_path)
    except AdapterError:   # PEFT knows more kinds (or says what is wrong)
        return build_once(out, lambda tmp: _peft_merge(folder, base_path, tmp))
    # bit-identical to PEFT's
    return build_once(out, lambda tmp: apply_adapter(base_path, folder, tmp, dtype=torch.float32))


def _peft_merge(folder: Path, base_path: Path, tmp: Path) -> None:
    """PEFT's merge_and_unload of the adapter over the base (float32), saved into ``tmp``."""
    import torch
    from peft import PeftModel   # slow to import (~2 s): only for adapters the reader refuses

    model, tok = load_model(base_path, device="cpu", dtype=torch.float32)
    try:
        merged = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    except Exception as e:  # noqa: BLE001 - peft raises many types for a bad adapter
        why = " ".join(str(e).split()) or type(e).__name__
        raise AdapterError(f"{folder}: cannot apply the adapter to {base_path}: "
                           f"{why if isinstance(e, ValueError) else f'{type(e).__name__}: {why}'}") from e
    merged.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
