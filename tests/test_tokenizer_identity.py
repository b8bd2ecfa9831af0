"""Tokenizer identity without parsing identical files (checkpoints.tokenizers): the bytes are
hashed and cached by the file's stamp; only files whose bytes differ are parsed, and then the
difference is named in one line. The embedded SmolLM2's tokenizer.json is the real file here."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from layerswap_core.checkpoints import tokenizers
from layerswap_core.checkpoints.compatibility import compatibility


def _folder(root: Path, name: str, tokenizer_json: bytes) -> Path:
    d = root / name
    d.mkdir()
    (d / "tokenizer.json").write_bytes(tokenizer_json)
    return d


@pytest.fixture
def parses(monkeypatch):
    """Every parse of a tokenizer format (``tokenizers._content``) from here on, as
    (folder, format)."""
    seen = []
    parse = tokenizers._content

    def counted(folder, fmt):
        seen.append((Path(folder).name, fmt))
        return parse(folder, fmt)

    monkeypatch.setattr(tokenizers, "_content", counted)
    return seen


def test_identical_tokenizer_files_are_not_parsed(tmp_path, embedded_base, parses):
    real = (embedded_base / "tokenizer.json").read_bytes()
    a, b = _folder(tmp_path, "a", real), _folder(tmp_path, "b", real)
    assert tokenizers.tokenizer_difference(a, b) is None
    assert parses == []
    # identical bytes that no parser could read are the same tokenizer too: only a parse fails
    junk = b'{"model": ' + real[:4096]
    c, d = _folder(tmp_path, "c", junk), _folder(tmp_path, "d", junk)
    assert tokenizers.tokenizer_difference(c, d) is None
    assert parses == []
    # the control: differing unreadable bytes are parsed, and said to be unreadable
    e = _folder(tmp_path, "e", junk + b" ")
    why = tokenizers.tokenizer_difference(c, e, names=("task", "lang"))
    assert why == "their tokenizer.json differ: task's cannot be read (JSONDecodeError)"
    assert ("c", "tokenizer.json") in parses


def test_one_added_token_is_named_with_its_id(tmp_path, tiny):
    task = Path(shutil.copytree(tiny["task"], tmp_path / "task"))
    lang = Path(shutil.copytree(tiny["lang"], tmp_path / "lang"))
    tok = json.loads((lang / "tokenizer.json").read_text())
    new_id = max(tok["model"]["vocab"].values()) + 1
    tok["added_tokens"].append({"id": new_id, "content": "<x>", "single_word": False,
                                "lstrip": False, "rstrip": False, "normalized": False,
                                "special": True})
    (lang / "tokenizer.json").write_text(json.dumps(tok))
    problems = compatibility({"task": task, "lang": lang})
    assert problems == [f"the tokenizers of lang and task: their tokenizer.json differ: added "
                        f"token '<x>' (id {new_id}) only in lang's"]
    # the same file re-serialised (other bytes, same content) is the same tokenizer
    (task / "tokenizer.json").write_text(json.dumps(tok, indent=1))
    assert compatibility({"task": task, "lang": lang}) == []


def test_a_rewritten_file_is_hashed_again(tmp_path, embedded_base, parses):
    real = (embedded_base / "tokenizer.json").read_bytes()
    a, b = _folder(tmp_path, "a", real), _folder(tmp_path, "b", real)
    assert tokenizers.tokenizer_difference(a, b) is None
    # the same size, one token renamed, written in place (same inode)
    old, new = b'"<|endoftext|>"', b'"<|endoftexu|>"'
    assert real.count(old) >= 1
    changed = real.replace(old, new)
    path = b / "tokenizer.json"
    before = path.stat()
    with open(path, "r+b") as f:
        f.write(changed)
    # while its stamp (size, modification time, inode) is the one cached, the cached hash is used:
    # proof that a check reads no byte of a file it has seen
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert tokenizers.tokenizer_difference(a, b) is None and parses == []
    # a new modification time: hashed again, parsed, and the difference named
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))
    why = tokenizers.tokenizer_difference(a, b)
    assert why.startswith(
        "their tokenizer.json differ: added token '<|endoftext|>' (id 0) only in a's")
    assert len(parses) == 2


def test_pre_tokenizers_compare_as_the_library_reads_them(tmp_path, embedded_base):
    """One Metaspace in two library versions' spellings is the same; another pre-tokenizer is
    named."""
    tok = json.loads((embedded_base / "tokenizer.json").read_text())
    spellings = {"old": {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True},
                 "new": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                         "split": True}}
    folders = {}
    for name, pre in spellings.items():
        folders[name] = _folder(tmp_path, name, json.dumps({**tok, "pre_tokenizer": pre}).encode())
    assert tokenizers.tokenizer_difference(folders["old"], folders["new"]) is None
    byte_level = _folder(tmp_path, "bytes", (embedded_base / "tokenizer.json").read_bytes())
    assert tokenizers.tokenizer_difference(folders["new"], byte_level, names=("task", "lang")) == (
        "their tokenizer.json differ: other pre-tokenizers (Metaspace in task's, ByteLevel in "
        "lang's)")
