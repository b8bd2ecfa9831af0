"""A sweep's folder: ``sweep.yaml`` (the whole request) and ``results.jsonl`` (one line per
finished configuration, appended and flushed as it finishes).

Each result carries a key: a digest of the models' fingerprints, the configuration, the items
and the generation settings. Running the same sweep again skips every key already in the file,
so a sweep killed mid-way loses at most the configurations being scored, and none is scored
twice. A line cut short by a kill is dropped when the file is next opened.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

from ..checkpoints.reading import weight_files

REQUEST_FILE = "sweep.yaml"
RESULTS_FILE = "results.jsonl"
SAMPLE_BYTES = 1 << 20    # bytes read at each of three places of a weight file


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False,
                                     default=str).encode()).hexdigest()


def checkpoint_fingerprint(folder: str | os.PathLike) -> str:
    """A content fingerprint of a checkpoint folder, the same wherever it is copied: its
    config.json, and for every weight file its name, size, safetensors header and 1 MiB at the
    start, middle and end of its tensor data (a few MiB read, whatever the size)."""
    folder = Path(folder).resolve()
    stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in weight_files(folder))
    return _fingerprint(str(folder), stamp)


@functools.lru_cache(maxsize=64)
def _fingerprint(folder: str, stamp: tuple) -> str:
    h = hashlib.sha256()
    config = Path(folder) / "config.json"
    if config.is_file():
        h.update(config.read_bytes())
    for name, size, _ in stamp:
        h.update(f"{name}\0{size}\0".encode())
        with open(Path(folder) / name, "rb") as f:
            head_len = int.from_bytes(f.read(8), "little")
            h.update(f.read(min(head_len, 100 << 20)))
            data = 8 + head_len
            for at in (data, data + max(0, size - data - SAMPLE_BYTES) // 2,
                       max(data, size - SAMPLE_BYTES)):
                f.seek(at)
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()[:24]


def items_digest(items, exemplars) -> str:
    """What a score depends on in the data: the items and the exemplars, by content."""
    return _digest([[(i.id, i.question, i.answer, i.solution, i.prompt_question, i.prompt_answer)
                     for i in group] for group in (items, exemplars)])[:24]


def result_key(fingerprints: dict, config: dict, items: dict, settings: dict) -> str:
    """The key of one configuration's result (``fingerprints``: role -> checkpoint
    fingerprint; ``config``: the MergeConfig's fields without model references; ``items``:
    language -> ``items_digest``; ``settings``: the generation settings)."""
    return _digest({"models": fingerprints, "config": config, "items": items,
                    "settings": settings})[:32]


class SweepStore:
    """``DIR/sweep.yaml`` and ``DIR/results.jsonl`` (module docstring)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.results = self.folder / RESULTS_FILE
        self.request = self.folder / REQUEST_FILE

    def open(self) -> dict[str, dict]:
        """Create the folder if needed; drop a last line cut short; the results by key."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self.results.exists():
            return {}
        data = self.results.read_bytes()
        if data and not data.endswith(b"\n"):   # a kill in the middle of a line: drop it
            keep = data.rfind(b"\n") + 1
            with open(self.results, "r+b") as f:
                f.truncate(keep)
            data = data[:keep]
        done = {}
        for line in data.decode("utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "key" in rec:
                done[rec["key"]] = rec
        return done

    def write_request(self, request: dict) -> Path:
        """The request as YAML, written whole (a temporary file renamed over the old one)."""
        import yaml

        tmp = self.request.with_name(self.request.name + ".tmp")
        tmp.write_text(yaml.safe_dump(request, sort_keys=False, allow_unicode=True))
        tmp.replace(self.request)
        return self.request

    def append(self, record: dict) -> None:
        """One result as one line, written with one call and flushed to disk."""
        line = (json.dumps(record, ensure_ascii=False, sort_keys=False) + "\n").encode()
        fd = os.open(self.results, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
