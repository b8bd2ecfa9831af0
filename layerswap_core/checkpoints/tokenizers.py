"""Tokenizer identity: whether two model folders tokenize alike (same tokens, ids and merges).

Merging models is only meaningful when they share one vocabulary; ``tokenizer_difference`` says
why two folders' tokenizers differ (or None), whatever format each stores its tokenizer in.
"""
from __future__ import annotations

import hashlib
import json
import os
import weakref
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json")


# --------------------------------------------------------------------------- tokenizer identity
# The formats a tokenizer comes in, in the order they are compared. Identical files are the same
# tokenizer: their bytes are hashed (streamed, cached by the file's stamp) and nothing is parsed,
# which is the common case (experts fine-tuned from one base). Only files whose bytes differ are
# parsed, and then what decides how text becomes ids is compared: the token -> id map (added
# tokens included), the BPE merges (or Unigram scores), the added tokens' specialness and the
# normalizer and pre-tokenizer. tokenizer.json and vocab.json + merges.txt compare with each other
# on the map and the merges (all the slow format has), so one tokenizer in both formats is the
# same; tokenizer.model (sentencepiece) by its bytes. The chat template is not compared: it
# changes no id, and the merge's tokenizer source decides which one the output carries.
TOKENIZER_FORMATS = ("tokenizer.json", "vocab.json+merges.txt", "tokenizer.model")

_CHUNK = 1 << 20
_DIGESTS: dict[tuple, str] = {}    # (resolved path, size, mtime_ns, inode) -> sha256 of the bytes


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, read in 1 MiB chunks; cached while its size, modification time
    and inode stay the same (a rewritten file is hashed again)."""
    path = Path(path).resolve()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    digest = _DIGESTS.get(key)
    if digest is None:
        h = hashlib.sha256()
        with open(path, "rb", buffering=0) as f:
            buf = bytearray(_CHUNK)
            view = memoryview(buf)
            while n := f.readinto(buf):
                h.update(view[:n])
        digest = _DIGESTS[key] = h.hexdigest()
        if len(_DIGESTS) > 4096:    # a long-lived app: forget the oldest stamps
            del _DIGESTS[next(iter(_DIGESTS))]
    return digest


def _formats(folder: Path) -> list[str]:
    return [fmt for fmt in TOKENIZER_FORMATS
            if all((folder / f).is_file() for f in fmt.split("+"))]


def _format_digest(folder: Path, fmt: str) -> str:
    return "+".join(file_digest(folder / f) for f in fmt.split("+"))


def _json_or_none(p: Path):
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else None


def _fast_content(folder: Path) -> dict:
    tok = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    model = tok["model"]
    vocab = model.get("vocab") or {}
    out = {"type": model.get("type") or ("BPE" if "merges" in model else "?")}
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...], the id is the position
        out["scores"] = [piece[1] for piece in vocab]
        vocab = {piece[0]: i for i, piece in enumerate(vocab)}
    else:
        out["merges"] = model.get("merges") or []
    added = {a["content"]: (a["id"], bool(a.get("special"))) for a in tok.get("added_tokens") or []}
    vocab = dict(vocab)
    vocab.update({content: i for content, (i, _) in added.items()})
    out.update(vocab=vocab, added=added, normalizer=tok.get("normalizer"),
               pre_tokenizer=tok.get("pre_tokenizer"))
    return out


def _slow_bpe_content(folder: Path) -> dict:
    vocab = dict(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))
    added = {content: (int(i), None)
             for content, i in (_json_or_none(folder / "added_tokens.json") or {}).items()}
    decoder = (_json_or_none(folder / "tokenizer_config.json") or {}).get("added_tokens_decoder")
    added.update({a["content"]: (int(i), bool(a.get("special")))
                  for i, a in (decoder or {}).items()})
    vocab.update({content: i for content, (i, _) in added.items()})
    lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines()
    merges = [ln for ln in lines if ln.strip() and not ln.startswith("#version")]
    return {"type": "BPE", "vocab": vocab, "merges": merges, "added": added}


def _content(folder: Path, fmt: str) -> dict | str:
    """The parsed content of one format in ``folder``, or why it cannot be read (a string)."""
    try:
        return _fast_content(folder) if fmt == "tokenizer.json" else _slow_bpe_content(folder)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as e:
        return f"cannot be read ({type(e).__name__})"


def _pair(merge) -> tuple:
    return tuple(merge.split(" ", 1)) if isinstance(merge, str) else tuple(merge)


def _canonical(component, slot: str):
    """A normalizer or pre-tokenizer (``slot``) as the installed tokenizers library writes it:
    files saved by different versions spell one component differently (Metaspace's
    ``add_prefix_space`` became ``prepend_scheme``; ByteLevel gained ``use_regex``)."""
    if component is None:
        return None
    try:
        from tokenizers import Tokenizer
        shell = {"version": "1.0", "normalizer": None, "pre_tokenizer": None, slot: component,
                 "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}
        return json.loads(Tokenizer.from_str(json.dumps(shell)).to_str())[slot]
    except Exception:  # noqa: BLE001 - not installed, or a component it does not know: as written
        return component


def _added_difference(added_a: dict, added_b: dict, ca: dict, cb: dict, na: str, nb: str):
    for x, y, vocab_y, nx, ny in ((added_a, added_b, cb["vocab"], na, nb),
                                  (added_b, added_a, ca["vocab"], nb, na)):
        for content, (i, _) in sorted(x.items(), key=lambda kv: kv[1][0]):
            if content not in y:
                there = (f" ({ny}'s vocabulary has it as id {vocab_y[content]})"
                         if content in vocab_y else "")
                return f"added token {content!r} (id {i}) only in {nx}'s{there}"
    for content, (i, special) in sorted(added_a.items(), key=lambda kv: kv[1][0]):
        j, special_b = added_b[content]
        if i != j:
            return f"added token {content!r} has id {i} in {na}'s, {j} in {nb}'s"
        if None not in (special, special_b) and special != special_b:
            return (f"added token {content!r} (id {i}) is special in "
                    f"{na if special else nb}'s, not in {nb if special else na}'s")
    return None


def _content_difference(ca: dict, cb: dict, na: str, nb: str) -> str | None:
    """The first difference that changes how text becomes ids, in words, or None."""
    if ca["type"] != cb["type"]:
        return f"a {ca['type']} model in {na}'s, a {cb['type']} model in {nb}'s"
    why = _added_difference(ca["added"], cb["added"], ca, cb, na, nb)
    if why:
        return why
    if ca["vocab"] != cb["vocab"]:
        return _vocab_difference(ca["vocab"], cb["vocab"], na, nb)
    for key, what in (("merges", "merge"), ("scores", "piece score")):
        ma, mb = ca.get(key), cb.get(key)
        if ma is None or mb is None or ma == mb:
            continue
        if key == "merges" and len({type(m) for m in ma[:1] + mb[:1]}) > 1:
            ma, mb = [_pair(m) for m in ma], [_pair(m) for m in mb]   # "a b" vs ["a", "b"]
            if ma == mb:
                continue
        if len(ma) != len(mb):
            return f"{len(ma)} {what}s in {na}'s, {len(mb)} in {nb}'s"
        k = next(k for k, (x, y) in enumerate(zip(ma, mb)) if x != y)
        show = (lambda m: " ".join(_pair(m))) if key == "merges" else (lambda m: m)  # noqa: E731
        return f"{what} {k + 1} is {show(ma[k])!r} in {na}'s, {show(mb[k])!r} in {nb}'s"
    for key, what in (("normalizer", "normalizer"), ("pre_tokenizer", "pre-tokenizer")):
        if key not in ca or key not in cb or ca[key] == cb[key]:
            continue
        xa, xb = _canonical(ca[key], key), _canonical(cb[key], key)
        if xa != xb:
            ta, tb = ((x or {}).get("type", "none") for x in (xa, xb))
            return (f"other {what}s ({ta} in {na}'s, {tb} in {nb}'s)" if ta != tb
                    else f"other {what} settings ({ta})")
    return None


def _vocab_difference(va: dict, vb: dict, na: str, nb: str) -> str:
    only_a = [t for t in va if t not in vb]
    only_b = [t for t in vb if t not in va]
    moved = [t for t in va if t in vb and va[t] != vb[t]]
    more = len(only_a) + len(only_b) + len(moved) - 1
    tail = f" (and {more} other difference{'s' * (more > 1)})" if more else ""
    if moved:
        t = min(moved, key=va.get)
        return f"token {t!r} has id {va[t]} in {na}'s, {vb[t]} in {nb}'s{tail}"
    t, x, v = (min(only_a, key=va.get), na, va) if only_a else (min(only_b, key=vb.get), nb, vb)
    return f"token {t!r} (id {v[t]}) only in {x}'s vocabulary{tail}"


# (format, digest, format, digest, name, name) -> the answer for files whose bytes differ: the
# parsed contents are not kept (a 128k tokenizer is tens of MB in Python objects), the answers are
_ANSWERS: dict[tuple, str | None] = {}


def _difference(a: Path, b: Path, fa: str, fb: str, na: str, nb: str) -> str | None:
    """Why format ``fa`` in ``a`` and ``fb`` in ``b`` are not the same tokenizer, or None."""
    da, db = _format_digest(a, fa), _format_digest(b, fb)
    if fa == fb and da == db:
        return None                                  # identical files: nothing to parse
    if "tokenizer.model" in (fa, fb):
        return "other bytes"
    key = (fa, da, fb, db, na, nb)
    if key not in _ANSWERS:
        _ANSWERS[key] = _parsed_difference(a, b, fa, fb, na, nb)
        if len(_ANSWERS) > 256:
            del _ANSWERS[next(iter(_ANSWERS))]
    return _ANSWERS[key]


def _parsed_difference(a: Path, b: Path, fa: str, fb: str, na: str, nb: str) -> str | None:
    ca, cb = _content(a, fa), _content(b, fb)
    for c, name in ((ca, na), (cb, nb)):
        if isinstance(c, str):
            return f"{name}'s {c}"
    if fa != fb:    # across the formats: the map (added tokens in it) and the merges only,
        # since the slow format may keep an added token in vocab.json alone
        ca, cb = ({"type": c["type"], "vocab": c["vocab"], "merges": c.get("merges"), "added": {}}
                  for c in (ca, cb))
    return _content_difference(ca, cb, na, nb)


def tokenizer_difference(a: str | os.PathLike, b: str | os.PathLike,
                         names: tuple[str, str] | None = None) -> str | None:
    """Why the tokenizers of model folders ``a`` and ``b`` cannot be taken as the same, or None;
    one line naming what differs (``names``: how the two are called in it; default the folders'
    names).

    The first format both folders have decides; without a common format, tokenizer.json and
    vocab.json + merges.txt compare with each other; otherwise they cannot be compared, which is
    reported too. A folder with no tokenizer files at all is not a difference (nothing to compare).
    """
    a, b = Path(a), Path(b)
    na, nb = names or (a.name, b.name)
    fa, fb = _formats(a), _formats(b)
    if not fa or not fb:
        return None
    for fmt in TOKENIZER_FORMATS:
        if fmt in fa and fmt in fb:
            why = _difference(a, b, fmt, fmt, na, nb)
            return None if why is None else f"their {fmt} differ: {why}"
    ta = next((fmt for fmt in TOKENIZER_FORMATS[:2] if fmt in fa), None)
    tb = next((fmt for fmt in TOKENIZER_FORMATS[:2] if fmt in fb), None)
    if ta and tb:
        why = _difference(a, b, ta, tb, na, nb)
        return None if why is None else f"their vocabularies differ ({ta} vs {tb}): {why}"
    return f"cannot be compared: {na} has {' and '.join(fa)}, {nb} has {' and '.join(fb)}"


def tokenizer_fingerprints(folder: str | os.PathLike) -> dict[str, str]:
    """{format: fingerprint} for every tokenizer format present in ``folder`` (see
    TOKENIZER_FORMATS): the token -> id map and the merges of tokenizer.json or vocab.json +
    merges.txt (equal for one tokenizer in either format), tokenizer.model's bytes. It parses
    the files (cached by their bytes); ``tokenizer_difference`` compares two folders without."""
    folder = Path(folder)
    out = {}
    for fmt in _formats(folder):
        content = _content(folder, fmt) if fmt != "tokenizer.model" else None
        if not isinstance(content, dict):    # sentencepiece, or unreadable: by the bytes
            out[fmt] = f"{fmt}:bytes:{_format_digest(folder, fmt)}"
            continue
        h = hashlib.sha256()
        for token, i in sorted(content["vocab"].items(), key=lambda kv: (kv[1], kv[0])):
            h.update(f"{i}\t{token}\n".encode())
        for m in content.get("merges") or []:
            h.update(("\t".join(_pair(m)) + "\n").encode())
        out[fmt] = h.hexdigest()
    return out


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
