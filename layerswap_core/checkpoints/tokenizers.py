"""Tokenizer identity: whether two model folders tokenize alike (same tokens, ids and merges).

Merging models is only meaningful when they share one vocabulary; ``tokenizer_difference`` says
why two folders' tokenizers differ (or None), whatever format each stores its tokenizer in.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import weakref
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")


# --------------------------------------------------------------------------- tokenizer identity
# The formats a tokenizer comes in, in the order they are compared. tokenizer.json and
# vocab.json + merges.txt are fingerprinted from the same normalised content (token -> id map
# including added tokens, and the BPE merges), so one tokenizer in both formats compares equal;
# tokenizer.model (sentencepiece) by its bytes.
TOKENIZER_FORMATS = ("tokenizer.json", "vocab.json+merges.txt", "tokenizer.model")


def _hash(obj) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _merge_pairs(merges) -> list:
    return [list(m.split(" ", 1)) if isinstance(m, str) else list(m) for m in merges or []]


def _json_or_none(p: Path):
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else None


def _fast_content(folder: Path) -> str:
    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    model = tok["model"]
    vocab = model.get("vocab") or {}
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...], the id is the position
        vocab = {piece[0]: i for i, piece in enumerate(vocab)}
    vocab = dict(vocab)
    vocab.update({a["content"]: a["id"] for a in tok.get("added_tokens") or []})
    return _hash({"vocab": vocab, "merges": _merge_pairs(model.get("merges"))})


def _slow_bpe_content(folder: Path) -> str:
    vocab = dict(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))
    vocab.update(_json_or_none(folder / "added_tokens.json") or {})
    decoder = (_json_or_none(folder / "tokenizer_config.json") or {}).get("added_tokens_decoder")
    vocab.update({a["content"]: int(i) for i, a in (decoder or {}).items()})
    lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    merges = [ln for ln in lines if ln.strip() and not ln.startswith("#version")]
    return _hash({"vocab": vocab, "merges": _merge_pairs(merges)})


def _format_fingerprint(folder: Path, fmt: str) -> str | None:
    """Fingerprint of one tokenizer format in ``folder`` (None: absent). A file that cannot be
    parsed is fingerprinted by its bytes (equal only to the very same file)."""
    files = [folder / f for f in fmt.split("+")]
    if not all(f.is_file() for f in files):
        return None
    try:
        if fmt == "tokenizer.json":
            return _fast_content(folder)
        if fmt == "vocab.json+merges.txt":
            return _slow_bpe_content(folder)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        pass
    return f"{fmt}:bytes:" + hashlib.sha1(b"".join(f.read_bytes() for f in files)).hexdigest()


def tokenizer_fingerprints(folder: str | os.PathLike) -> dict[str, str]:
    """{format: fingerprint} for every tokenizer format present in ``folder`` (see
    TOKENIZER_FORMATS); equal fingerprints mean the same tokens with the same ids and merges."""
    folder = Path(folder)
    stamp = tuple((f, (folder / f).stat().st_size, (folder / f).stat().st_mtime_ns)
                  for f in TOKENIZER_FILES if (folder / f).is_file())
    return dict(_cached_fingerprints(str(folder.resolve()), stamp))


@functools.lru_cache(maxsize=64)
def _cached_fingerprints(folder: str, stamp: tuple) -> tuple:
    found = ((fmt, _format_fingerprint(Path(folder), fmt)) for fmt in TOKENIZER_FORMATS)
    return tuple((fmt, fp) for fmt, fp in found if fp is not None)


def tokenizer_difference(a: str | os.PathLike, b: str | os.PathLike) -> str | None:
    """Why the tokenizers of model folders ``a`` and ``b`` cannot be taken as the same, or None.

    The first format both folders have decides; without a common format, tokenizer.json and
    vocab.json + merges.txt compare with each other; otherwise they cannot be compared, which is
    reported too. A folder with no tokenizer files at all is not a difference (nothing to compare).
    """
    fa, fb = tokenizer_fingerprints(a), tokenizer_fingerprints(b)
    if not fa or not fb:
        return None
    for fmt in TOKENIZER_FORMATS:
        if fmt in fa and fmt in fb:
            return None if fa[fmt] == fb[fmt] else f"their {fmt} differ (other tokens or merges)"
    ta = next((fmt for fmt in TOKENIZER_FORMATS[:2] if fmt in fa), None)
    tb = next((fmt for fmt in TOKENIZER_FORMATS[:2] if fmt in fb), None)
    if ta and tb:
        return None if fa[ta] == fb[tb] else f"their vocabularies differ ({ta} vs {tb})"
    return (f"cannot be compared: {Path(a).name} has {' and '.join(fa)}, {Path(b).name} has "
            f"{' and '.join(fb)}")


def vocab_fingerprint(folder: Path) -> str | None:
    """One fingerprint of a folder's tokenizer (None without tokenizer files): the token/merges
    content of tokenizer.json or vocab.json + merges.txt (equal for one tokenizer in either
    format), else tokenizer.model's bytes. Prefer ``tokenizer_difference`` to compare two."""
    return next(iter(tokenizer_fingerprints(folder).values()), None)


# --------------------------------------------------------------------------- prompt encoding
_ADDS_BOS = weakref.WeakKeyDictionary()   # tokenizer -> adds_bos


def adds_bos(tokenizer) -> bool:
    """Whether a loaded tokenizer puts its BOS in front of plain text by itself (Gemma's does;
    SmolLM2's and other GPT-2-style ones add nothing); asked once per tokenizer object."""
    if tokenizer not in _ADDS_BOS:
        bos = tokenizer.bos_token_id
        _ADDS_BOS[tokenizer] = bos is not None and tokenizer("a")["input_ids"][:1] == [bos]
    return _ADDS_BOS[tokenizer]


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of the text a model starts reading from: the text's own tokens, with the BOS
    in front where the tokenizer adds one itself and the text (a rendered chat template, say)
    does not already start with it. Text that follows a prompt is encoded with
    ``add_special_tokens=False`` and never gets one."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if adds_bos(tokenizer) and ids[:1] != [tokenizer.bos_token_id]:
        ids = [tokenizer.bos_token_id] + ids
    return ids


def encode_continuation(tokenizer, text: str) -> list[int]:
    """Token ids of text that follows a prompt (a response, a gold target): never a BOS."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]
