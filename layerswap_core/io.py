"""Streaming tensor I/O: read one tensor at a time from (sharded) safetensors checkpoints.

Nothing here loads a whole model. ``CheckpointReader`` maps every tensor name to its shard from
the index (or the headers) and opens shards lazily; ``get`` copies a single tensor out.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

INDEX_NAME = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be read (missing, corrupt, inconsistent)."""


def weight_files(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("*.safetensors"))


class CheckpointReader:
    """Lazy, per-tensor reader of a Hugging Face safetensors folder (sharded or not)."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise CheckpointError(f"{self.folder}: not a folder")
        self._handles: dict[str, object] = {}
        self.reads = 0  # tensors read so far (tests use it to prove that nothing was read)
        index = self.folder / INDEX_NAME
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError) as e:
                raise CheckpointError(f"{index}: not a valid safetensors index ({e})") from e
            self._shard_of = dict(weight_map)
        else:
            files = weight_files(self.folder)
            if not files:
                raise CheckpointError(f"{self.folder}: no *.safetensors files")
            self._shard_of = {}
            for f in files:
                for name in self._open(f.name).keys():
                    self._shard_of[name] = f.name
        for shard in sorted(set(self._shard_of.values())):
            if not (self.folder / shard).exists():
                raise CheckpointError(f"{self.folder}: shard {shard} named in the index is missing")
        self._meta: dict[str, tuple[tuple[int, ...], str]] = {}

    def _open(self, shard: str):
        h = self._handles.get(shard)
        if h is None:
            try:
                h = safe_open(str(self.folder / shard), framework="pt", device="cpu")
            except (SafetensorError, OSError, Exception) as e:  # noqa: BLE001 - report any as corrupt
                raise CheckpointError(f"{self.folder / shard}: cannot read safetensors ({e})") from e
            self._handles[shard] = h
        return h

    # --- metadata (headers only, no tensor data) ---
    def names(self) -> list[str]:
        return list(self._shard_of)

    def __contains__(self, name: str) -> bool:
        return name in self._shard_of

    def __len__(self) -> int:
        return len(self._shard_of)

    def _info(self, name: str) -> tuple[tuple[int, ...], str]:
        info = self._meta.get(name)
        if info is None:
            if name not in self._shard_of:
                raise CheckpointError(f"{self.folder}: no tensor named {name!r}")
            sl = self._open(self._shard_of[name]).get_slice(name)
            info = (tuple(sl.get_shape()), sl.get_dtype())
            self._meta[name] = info
        return info

    def shape(self, name: str) -> tuple[int, ...]:
        return self._info(name)[0]

    def dtype(self, name: str) -> str:
        """safetensors dtype string, e.g. 'BF16', 'F32'."""
        return self._info(name)[1]

    def shard(self, name: str) -> str:
        return self._shard_of[name]

    def numel(self) -> int:
        total = 0
        for n in self._shard_of:
            k = 1
            for d in self.shape(n):
                k *= d
            total += k
        return total

    def nbytes(self) -> int:
        return sum((self.folder / s).stat().st_size for s in set(self._shard_of.values()))

    # --- data ---
    def get(self, name: str, device: str | torch.device = "cpu") -> torch.Tensor:
        if name not in self._shard_of:
            raise CheckpointError(f"{self.folder}: no tensor named {name!r}")
        try:
            t = self._open(self._shard_of[name]).get_tensor(name)
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001
            raise CheckpointError(f"{self.folder / self._shard_of[name]}: cannot read {name!r} ({e})") from e
        self.reads += 1
        return t if str(device) == "cpu" else t.to(device)

    def config(self) -> dict:
        p = self.folder / "config.json"
        return json.loads(p.read_text()) if p.exists() else {}

    def close(self):
        self._handles.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
