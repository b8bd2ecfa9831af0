"""Pre-flight: whether models can be used together, from their metadata alone.

A served pick of a Hub id downloads the whole repository (``hub``): three 8B experts are about
48 GB before anyone learns that their vocabularies differ. ``preflight`` answers first, from the
Hub's file listing (sizes, licence, gated or private) and a few small reads: config.json, the
safetensors index, each weight file's header (two HTTP range reads: its 8-byte length, then its
JSON) and, only when nothing else is wrong, the tokenizer files (tokenizer identity needs them;
a file with the same blob as one already fetched is copied, not fetched again).

What it reads lands in a *skeleton* folder: config, index and tokenizer files as they are, each
weight file as its header followed by a hole up to its listed size (a sparse file: no tensor
data, next to no disk). To every reader that does not touch tensor data the skeleton is the model
folder, so the one compatibility check (``compatibility.open_models`` and ``problems``) and
``loading.describe`` run on it unchanged. Local folders and embedded models are read as they are.

The answer is plain data (``Preflight``): each model's architecture, depth, vocabulary, dtype,
size, licence and gated status, what a download would fetch, an estimate of the memory the trio
needs, and the problems, the first of which is the one-line refusal.
"""
from __future__ import annotations

import fnmatch
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..progress import Progress, say
from .adapters import is_adapter
from .compatibility import open_models, problems
from .embedded import EMBEDDED_PREFIX
from .hub import (PATTERNS, HubLimits, check_file_names, file_url, gb_text, hub_error_words,
                  same_host, served_cache, too_big)
from .loading import ModelInfo, describe, runs_in_float32
from .reading import INDEX_NAME, ModelLoadError
from .references import REPO_ID_PATTERN, resolve
from .tokenizers import TOKENIZER_FILES
from .tokenizer_panel import TokenizerPanel, tokenizer_panel

# a config, index or tokenizer file listed larger than this is not read for a pre-flight
MAX_SMALL_FILE = 64 * 2 ** 20
SMALL_FILE_CAPS = {"config.json": 4 << 20, INDEX_NAME: 16 << 20}   # tighter: no file needs more
# read_header's own bound on a safetensors header
MAX_HEADER = 100 << 20
# What a pre-flight reads of a model's weight files, sized from real repositories: Qwen3-30B-A3B
# (a mixture of experts: 48 layers of 128 experts) has 18,867 tensors in 16 files, whose headers
# come to 2.4 MB (126 bytes a tensor, 148 kB a file); DeepSeek-V3's 91,000 tensors in 163 files
# to about 12 MB; Llama-3.1-405B has 191 files. Past these a hostile repository would make each
# Check fetch and parse what no model needs (three 99 MiB headers took 2 GB and 74 s of CPU).
MAX_WEIGHT_FILES = 256              # weight files per model
HEADER_FILE_MAX = 8 << 20           # one file's header (about 65,000 tensors)
HEADER_TOTAL_MAX = 16 << 20         # all of one model's headers
# a file the index maps N tensors to: a header of at most HEADER_SLACK + N * HEADER_PER_TENSOR
HEADER_SLACK, HEADER_PER_TENSOR = 64 << 10, 1024
PREFLIGHT_SECONDS = 120.0           # one pre-flight, every read of every model together


@dataclass(frozen=True)
class ModelFacts:
    """One model as the pre-flight saw it (``info``: ``loading.describe`` of its headers)."""
    role: str
    ref: str
    info: ModelInfo
    download_bytes: int = 0          # what a download would fetch (0: the model is here)
    fetched_bytes: int = 0           # what this pre-flight fetched of it
    license: str | None = None
    gated: bool = False
    private: bool = False

    def line(self) -> str:
        i = self.info
        where = (f"{gb_text(self.download_bytes)} to download" if self.download_bytes
                 else "here, nothing to download")
        terms = [f"licence {self.license}" if self.license else "",
                 "gated" if self.gated else "", "private" if self.private else ""]
        return (f"{self.role}: {self.ref}: {i.architecture}, {i.num_layers} layers, "
                f"hidden {i.hidden_size}, vocab {i.vocab_size}, {i.dtype}, "
                f"{i.num_params / 1e6:.1f} M params, {gb_text(i.size_bytes)} of weights; {where}"
                + "".join(f", {t}" for t in terms if t))


@dataclass(frozen=True)
class Preflight:
    """The pre-flight of models used together (``models``: role -> facts, the reference first).

    ``memory_bytes`` estimates what the trio needs in memory: a live model holds one private copy
    of the reference model in its own dtype (the weights' bytes; small models on the CPU run in
    float32, twice that for bf16 weights) and maps the models' weight files, page cache that is
    shared and evictable (``mapped_bytes``)."""
    models: dict[str, ModelFacts]
    problems: list[str]
    notes: list[str] = field(default_factory=list)
    tokenizers: TokenizerPanel | None = None   # what differs in tokenizers and chat templates

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def refusal(self) -> str | None:
        """The one-line reason the models are refused, or None."""
        return "; ".join(self.problems) if self.problems else None

    @property
    def download_bytes(self) -> int:
        return sum(f.download_bytes for f in self.models.values())

    @property
    def fetched_bytes(self) -> int:
        return sum(f.fetched_bytes for f in self.models.values())

    @property
    def live_device(self) -> str:
        """Where the live model would run: $LAYERSWAP_DEVICE, else a GPU when torch (already
        imported: `layerswap check` does not import it) sees one, else the CPU."""
        device = os.environ.get("LAYERSWAP_DEVICE")
        if device:
            return device
        torch = sys.modules.get("torch")
        return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"

    @property
    def live_float32(self) -> bool:
        first = next(iter(self.models.values()), None)
        return first is not None and runs_in_float32(first.info.num_params, self.live_device)

    @property
    def memory_bytes(self) -> int:
        """The live model's own copy, in the dtype it runs in (float32 for a small model on the
        CPU: twice a bf16 checkpoint's bytes)."""
        first = next(iter(self.models.values()), None)
        if first is None:
            return 0
        return 4 * first.info.num_params if self.live_float32 else first.info.size_bytes

    @property
    def mapped_bytes(self) -> int:
        return sum(f.info.size_bytes for f in self.models.values())

    def lines(self) -> list[str]:
        """The summary, one line each: every model, the totals, then the verdict."""
        out = [f.line() for f in self.models.values()]
        if self.models:
            out.append(f"download: {gb_text(self.download_bytes)} in all; memory: about "
                       f"{gb_text(self.memory_bytes)} for the live model"
                       + (" (float32 on the CPU)" if self.live_float32 else "") + ", plus up to "
                       f"{gb_text(self.mapped_bytes)} of page cache for the weight files "
                       f"(pre-flight fetched {_small(self.fetched_bytes)})")
        out += [f"note: {n}" for n in self.notes]
        out += [f"warning: {f.role}: {f.info.warning()}" for f in self.models.values()
                if f.info.warning()]
        if self.tokenizers is not None and not self.tokenizers.identical:
            out += [line for line in self.tokenizers.lines() if not line.startswith("refused")]
            out += [f"  {d}" for d in self.tokenizers.details]
        out.append(f"refused: {self.refusal}" if self.problems else
                   "compatible: same architecture, depth, shapes, vocabulary and tokenizer")
        return out


def _small(nbytes: int) -> str:
    return gb_text(nbytes) if nbytes >= 10 ** 6 else f"{nbytes / 1000:.1f} kB"


def hub_id(ref: str, served: bool = False) -> bool:
    """Whether ``references.resolve`` takes ``ref`` for a Hub id (not a folder, not embedded).
    ``served``: whatever lies on the server's disk (a visitor's owner/name is never read as a
    relative path)."""
    s = str(ref).strip()
    return (bool(REPO_ID_PATTERN.match(s)) and not s.startswith((".", "~", EMBEDDED_PREFIX))
            and (served or not Path(s).expanduser().exists()))


# --------------------------------------------------------------------------- the Hub's side
@dataclass
class _HubModel:
    """What the pre-flight knows of one Hub repository so far."""
    repo_id: str
    folder: Path
    files: dict[str, int] = field(default_factory=dict)        # name -> listed size
    blobs: dict[str, str | None] = field(default_factory=dict)  # name -> blob id
    url: dict[str, str] = field(default_factory=dict)           # name -> resolve URL
    fetched: int = 0
    header_bytes: int = 0           # of the weight files' headers read so far
    tensors: int = 0                # entries of those headers
    license: str | None = None
    gated: bool = False
    private: bool = False


class _Hub:
    """Listing and small reads on the Hub: no retries, the limits' timeout, ``token`` as
    huggingface_hub takes it (False: none, as a server must for its visitors)."""

    def __init__(self, endpoint: str | None, token, limits: HubLimits):
        from huggingface_hub import constants
        from huggingface_hub.utils import build_hf_headers, get_session

        self.endpoint = endpoint or constants.ENDPOINT
        self.token, self.limits = token, limits
        self.client = get_session()
        self.headers = build_hf_headers(token=token)
        self.fetched_blobs: dict[tuple[str, str], Path] = {}    # (name, blob) -> a copy here
        self.deadline = time.monotonic() + PREFLIGHT_SECONDS     # the whole pre-flight's

    def time_left(self) -> float:
        """Seconds left before the pre-flight's deadline; ModelLoadError past it (a Hub that
        answers each read within its timeout but dribbles would otherwise hold a slot)."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise ModelLoadError(f"the pre-flight ran past {PREFLIGHT_SECONDS:.0f} s (the Hub "
                                 "answers too slowly); try again later")
        return left

    def listing(self, model: _HubModel) -> None:
        with same_host(self.endpoint):
            self._listing(model)

    def _listing(self, model: _HubModel) -> None:
        from huggingface_hub import HfApi

        info = HfApi(endpoint=self.endpoint, token=self.token).model_info(
            model.repo_id, files_metadata=True, timeout=min(self.limits.timeout, self.time_left()))
        model.gated, model.private = bool(getattr(info, "gated", False)), bool(info.private)
        card = getattr(info, "card_data", None)
        model.license = (card.get("license") if card is not None else None) or next(
            (t.split(":", 1)[1] for t in info.tags or () if t.startswith("license:")), None)
        siblings = [s for s in info.siblings or ()
                    if any(fnmatch.fnmatch(s.rfilename, p) for p in PATTERNS)]
        check_file_names(s.rfilename for s in siblings)
        if any(s.size is None for s in siblings):
            raise ModelLoadError("the Hub does not list the size of every file")
        model.files = {s.rfilename: s.size for s in siblings}
        model.blobs = {s.rfilename: s.blob_id for s in siblings}
        model.url = {n: file_url(self.endpoint, model.repo_id, info.sha or "main", n)
                     for n in model.files}
        if not any(n.endswith(".safetensors") for n in model.files):
            raise ModelLoadError("the repository has no safetensors weights")

    def read(self, model: _HubModel, name: str, start: int = 0, length: int | None = None) -> bytes:
        """Bytes ``start`` to ``start + length`` of a file (the rest of it without ``length``):
        a range request; a Hub that ignores the range is read only as far as needed."""
        from huggingface_hub.utils import hf_raise_for_status

        headers = dict(self.headers)
        if length is not None:
            headers["Range"] = f"bytes={start}-{start + length - 1}"
        want = (length if length is not None else model.files[name] - start)
        out = bytearray()
        with same_host(self.endpoint), \
                self.client.stream("GET", model.url[name], headers=headers,
                                timeout=min(self.limits.timeout, self.time_left())) as r:
            if r.status_code >= 400:
                r.read()
                hf_raise_for_status(r)
            skip = start if r.status_code != 206 else 0
            for chunk in r.iter_bytes():
                model.fetched += len(chunk)
                if skip:
                    cut = min(skip, len(chunk))
                    chunk, skip = chunk[cut:], skip - cut
                out += chunk
                if len(out) >= want:
                    break
                self.time_left()
        if len(out) < want:
            raise ModelLoadError(f"the Hub sent less of {name} than it listed")
        return bytes(out[:want])

    def small_file(self, model: _HubModel, name: str) -> None:
        """A config, index or tokenizer file into the skeleton (a blob fetched before: copied)."""
        size = model.files[name]
        if size > SMALL_FILE_CAPS.get(name, MAX_SMALL_FILE):
            raise ModelLoadError(f"{name} is listed at {gb_text(size)}: too large for a pre-flight")
        dest = model.folder / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        key = (name, model.blobs.get(name) or "")
        if key[1] and key in self.fetched_blobs:
            shutil.copyfile(self.fetched_blobs[key], dest)
            return
        dest.write_bytes(self.read(model, name) if size else b"")
        if key[1]:
            self.fetched_blobs[key] = dest

    def header(self, model: _HubModel, name: str, allowed: int, max_tensors: int | None
               ) -> None:
        """A weight file into the skeleton: its header, then a hole up to its listed size.
        Refused from its 8-byte length past ``allowed`` or the model's HEADER_TOTAL_MAX, and
        after it past ``max_tensors`` tensors in the model's headers."""
        size = model.files[name]
        (n,) = struct.unpack("<Q", self.read(model, name, 0, 8))
        if n > min(size - 8, MAX_HEADER):
            raise ModelLoadError(f"{name} is not a safetensors file (bad header length)")
        if n > allowed:
            raise ModelLoadError(f"{name} has a safetensors header of {_small(n)}, more than "
                                 f"its tensors need (at most {_small(allowed)}): refused")
        if model.header_bytes + n > HEADER_TOTAL_MAX:
            raise ModelLoadError(f"the weight files' headers come to over "
                                 f"{_small(HEADER_TOTAL_MAX)}, more than any model's: refused")
        model.header_bytes += n
        raw = self.read(model, name, 8, n)
        model.tensors += raw.count(b'"data_offsets"')
        if max_tensors is not None and model.tensors > max_tensors:
            raise ModelLoadError(f"the weight files list over {max_tensors:,} tensors, more "
                                 "than its config.json has layers and experts for: refused")
        dest = model.folder / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as f:
            f.write(struct.pack("<Q", n) + raw)
            f.truncate(size)


def header_allowance(index: dict | None, names) -> dict[str, int]:
    """The header bytes each weight file may have: HEADER_SLACK plus HEADER_PER_TENSOR for each
    tensor the index maps to it (at most HEADER_FILE_MAX); HEADER_FILE_MAX for a file the index
    does not name, or without an index."""
    counts: dict[str, int] = {}
    weight_map = (index or {}).get("weight_map")
    if isinstance(weight_map, dict):
        for file in weight_map.values():
            if isinstance(file, str):
                counts[file] = counts.get(file, 0) + 1
    return {n: min(HEADER_FILE_MAX, HEADER_SLACK + HEADER_PER_TENSOR * counts[n])
            if n in counts else HEADER_FILE_MAX for n in names}


def tensor_allowance(config: dict | None) -> int | None:
    """The most tensors a model of this config.json could have: 256, plus per layer 64 and 4 per
    expert (Qwen3-30B-A3B's 48 layers of 128 experts: 27,904 for its 18,867). None when the
    config does not say its depth."""
    if not isinstance(config, dict):
        return None
    parts = [config] + [v for v in config.values() if isinstance(v, dict)]   # text_config...
    depth = max((p.get(k) for p in parts for k in ("num_hidden_layers", "n_layer", "num_layers")
                 if isinstance(p.get(k), int)), default=None)
    if depth is None:
        return None
    experts = max((v for p in parts for k, v in p.items()
                   if "expert" in k and isinstance(v, int) and not isinstance(v, bool)),
                  default=0)
    return 256 + depth * (64 + 4 * max(experts, 0))


def _json_file(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None     # the compatibility check says what is wrong with it
    return value if isinstance(value, dict) else None


def _skeleton(hub: _Hub, model: _HubModel) -> None:
    """The listing, config.json, the index and every weight file's header; a model over the
    download limit, or with more weight files than MAX_WEIGHT_FILES, is refused from its
    listing, before any file is read; a header past what its tensors need (``header_allowance``,
    HEADER_TOTAL_MAX) from its length, before it is read."""
    hub.listing(model)
    refusal = too_big(sum(model.files.values()), hub.limits.max_download)
    if refusal:
        raise ModelLoadError(refusal)
    weights = [n for n in model.files
               if n.endswith(".safetensors") and "/" not in n]   # what the readers read
    if len(weights) > MAX_WEIGHT_FILES:
        raise ModelLoadError(f"{len(weights):,} weight files: a pre-flight reads at most "
                             f"{MAX_WEIGHT_FILES} per model (no model needs more): refused")
    model.folder.mkdir(parents=True, exist_ok=True)
    for name in ("config.json", INDEX_NAME):
        if name in model.files:
            hub.small_file(model, name)
    allowed = header_allowance(_json_file(model.folder / INDEX_NAME), weights)
    max_tensors = tensor_allowance(_json_file(model.folder / "config.json"))
    for name in weights:
        hub.header(model, name, allowed[name], max_tensors)


# --------------------------------------------------------------------------- the pre-flight
def preflight(refs: dict[str, str], *, served: bool = False, token=None,
              endpoint: str | None = None, limits: HubLimits | None = None,
              progress: Progress | None = None) -> Preflight:
    """The pre-flight of the models ``{role: reference}`` (the first role is the reference the
    others are checked against; empty references are left out). Hub ids are read from their
    metadata (``served``: the served cache's copy when it has one, the visitor's rules: no token,
    gated and private models refused); anything else is resolved as it is. Never raises for a
    model that cannot be read: that is a problem of the answer."""
    refs = {role: str(ref).strip() for role, ref in refs.items() if str(ref or "").strip()}
    limits = limits or (served_cache().limits if served else HubLimits.from_env(served=False))
    if served:
        token = False
    found: list[str] = []
    notes: list[str] = []
    facts: dict[str, ModelFacts] = {}
    with tempfile.TemporaryDirectory(prefix="layerswap-preflight-") as tmp:
        hub = None
        paths: dict[str, Path] = {}
        remote: dict[str, _HubModel] = {}
        for i, (role, ref) in enumerate(refs.items()):
            on_hub = hub_id(ref, served)
            say(progress, i / (len(refs) + 2), f"reading what the Hub lists of {ref}"
                if on_hub else f"reading {ref}")
            try:
                cached = served_cache().cached(ref) if served and on_hub else None
                if on_hub and cached is None:
                    hub = hub or _Hub(endpoint, token, limits)
                    model = remote[role] = _HubModel(ref, Path(tmp) / role)
                    try:
                        _skeleton(hub, model)
                    except Exception as e:  # noqa: BLE001 - every failure becomes a sentence
                        raise ModelLoadError(hub_error_words(e, limits.timeout)) from e
                    if served and (model.gated or model.private):
                        raise ModelLoadError("this model is gated or private: not downloaded "
                                             "on this server")
                    paths[role] = model.folder
                elif on_hub:
                    paths[role] = cached
                elif not ref.startswith(EMBEDDED_PREFIX) and Path(ref).expanduser().is_dir() \
                        and is_adapter(Path(ref).expanduser()):
                    notes.append(f"{role}: {ref} is an adapter: checked when the models are "
                                 "picked")
                else:
                    paths[role] = resolve(ref)
            except (ModelLoadError, ValueError, OSError) as e:
                found.append(f"{role} {ref}: {e}")
        for role, path in list(paths.items()):
            model = remote.get(role)
            try:
                info = replace(describe(path), ref=refs[role], path="" if model else str(path))
            except (ModelLoadError, ValueError, OSError) as e:
                found.append(f"{role} {refs[role]}: {e}")
                continue
            download = sum(model.files.values()) if model else 0
            facts[role] = ModelFacts(role, refs[role], info, download, 0,
                                     *((model.license, model.gated, model.private) if model
                                       else (None, False, False)))
            refusal = too_big(download, limits.max_download)
            if refusal:   # said, and the rest is still checked: both are worth knowing
                found.append(f"{role} {refs[role]}: {refusal}")
        said = next((f.info.vision_note() for f in facts.values() if f.info.vision), None)
        if said:
            notes.append(said)
        panel = None
        if len(facts) == len(paths) > 1:
            found += _compatibility(hub, paths, remote, found, limits, progress,
                                    len(refs) / (len(refs) + 2))
            if not found:   # the tokenizer files are here (fetched when nothing else differed)
                try:
                    panel = tokenizer_panel(paths)
                except (ModelLoadError, ValueError, OSError) as e:   # an unreadable file
                    found.append(str(e))
        facts = {role: replace(f, fetched_bytes=remote[role].fetched if role in remote else 0)
                 for role, f in facts.items()}
        return Preflight(facts, [_named(p, paths, refs) for p in found], notes, panel)


def _compatibility(hub: _Hub | None, paths: dict[str, Path], remote: dict[str, _HubModel],
                   found: list[str], limits: HubLimits, progress: Progress | None,
                   at: float) -> list[str]:
    """The one compatibility check on the folders: architecture, depth, vocabulary size and
    shapes from the headers; the tokenizers (fetched now) only when nothing else is wrong."""
    say(progress, at, "checking architecture, shapes and vocabulary")
    try:
        models = open_models(paths)
    except (ModelLoadError, ValueError, OSError) as e:
        return [str(e)]
    out = problems(models, tokenizers=False)
    if out or found:
        return out
    say(progress, (1 + at) / 2, "comparing the tokenizers")
    for model in remote.values():
        try:
            for name in TOKENIZER_FILES:
                if name in model.files:
                    hub.small_file(model, name)
        except Exception as e:  # noqa: BLE001 - every failure becomes a sentence
            return [f"{model.folder.name} {model.repo_id}: {hub_error_words(e, limits.timeout)}"]
    return problems(models)


def _named(problem: str, paths: dict[str, Path], refs: dict[str, str]) -> str:
    """A problem with each skeleton folder named by its reference."""
    for role, path in paths.items():
        for p in {str(path), str(path.resolve())}:
            problem = problem.replace(p, refs[role])
    return problem


def check(base: str | None, task: str, lang: str, **kwargs) -> Preflight:
    """``preflight`` of a trio, against the task expert (as ``compatibility.compatibility``)."""
    return preflight({"task": task, "lang": lang, "base": base or ""}, **kwargs)


