"""MGSM from the Hugging Face Hub, downloaded once into layerswap's cache.

The Hub copy is ``juletxara/mgsm``, the dataset lm-eval's mgsm tasks load: the benchmark's own
``mgsm_<lang>.tsv`` files (question TAB answer) and ``exemplars.py`` (the 8 manually translated
few-shot exemplars per language, as Python literals). ``build_mgsm_folder`` turns such a snapshot
into the folder ``evaluation.data`` reads (the TSVs plus ``mgsm_exemplars.json``), reading
``exemplars.py`` with ``ast.literal_eval`` (never executing it); ``download_mgsm`` fetches the
snapshot (only the files needed) and builds the folder in the cache, atomically: a folder is
either complete or absent.
"""
from __future__ import annotations

import ast
import json
import os
import shutil
import tempfile
from pathlib import Path
from collections.abc import Callable

from ..checkpoints.cache import cache_dir

HUB_ID = "juletxara/mgsm"
LICENCE = "CC BY-SA 4.0"
LICENCE_NOTE = (f"MGSM (Shi et al. 2022), from the Hugging Face Hub dataset {HUB_ID}: "
                f"licence {LICENCE}; not redistributed by layerswap.")
EXEMPLARS_FILE = "mgsm_exemplars.json"
_PATTERNS = ["mgsm_*.tsv", "exemplars.py", "README.md", "LICENSE*"]


class MgsmDownloadError(ValueError):
    """The Hub copy could not be fetched or read; the message is one line."""


def cache_folder() -> Path:
    """Where the downloaded MGSM lives: ``<layerswap cache>/data/mgsm`` (not created)."""
    return cache_dir() / "data" / "mgsm"


def is_complete(folder: Path) -> bool:
    folder = Path(folder)
    return (folder / EXEMPLARS_FILE).is_file() and any(folder.glob("mgsm_*.tsv"))


def exemplars_from_py(text: str) -> dict:
    """The exemplars of MGSM's ``exemplars.py`` as ``mgsm_exemplars.json`` holds them.

    The file assigns ``EXEMPLAR_NUMBER_ANSWERS``, ``EXEMPLAR_EQUATION_SOLUTIONS`` and
    ``MGSM_EXEMPLARS = {lang: {"1": {"q": ..., "a": ...}, ...}}`` as literals."""
    try:
        tree = ast.parse(text)
    except SyntaxError as e:
        raise MgsmDownloadError(f"exemplars.py is not Python ({e.msg}, line {e.lineno})") from None
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue   # not a literal: not one of ours
    if "MGSM_EXEMPLARS" not in values or "EXEMPLAR_NUMBER_ANSWERS" not in values:
        raise MgsmDownloadError("exemplars.py has no MGSM_EXEMPLARS / EXEMPLAR_NUMBER_ANSWERS")
    per_lang = {}
    for lang, items in values["MGSM_EXEMPLARS"].items():
        if not isinstance(items, dict):
            raise MgsmDownloadError(f"exemplars.py: MGSM_EXEMPLARS[{lang!r}] is not a dict")
        per_lang[lang] = [{"q": items[k]["q"], "a": items[k]["a"]}
                          for k in sorted(items, key=lambda k: int(k))]
    return {"source": LICENCE_NOTE + " Converted from exemplars.py by layerswap.",
            "number_answers": list(values["EXEMPLAR_NUMBER_ANSWERS"]),
            "equation_solutions": list(values.get("EXEMPLAR_EQUATION_SOLUTIONS", [])),
            "exemplars": per_lang}


def build_mgsm_folder(snapshot: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Make ``dest`` an MGSM folder from a Hub snapshot (``mgsm_*.tsv`` and ``exemplars.py``).

    Written beside ``dest`` and renamed at the end: ``dest`` is complete or absent."""
    snapshot, dest = Path(snapshot), Path(dest)
    tsvs = sorted(snapshot.glob("mgsm_*.tsv"))
    if not tsvs:
        raise MgsmDownloadError(f"{snapshot} holds no mgsm_<lang>.tsv files")
    if (snapshot / EXEMPLARS_FILE).is_file():
        exemplars = json.loads((snapshot / EXEMPLARS_FILE).read_text(encoding="utf-8"))
    elif (snapshot / "exemplars.py").is_file():
        exemplars = exemplars_from_py((snapshot / "exemplars.py").read_text(encoding="utf-8"))
    else:
        raise MgsmDownloadError(f"{snapshot} holds no exemplars.py (MGSM's few-shot exemplars)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    try:
        for f in tsvs:
            shutil.copyfile(f, tmp / f.name)
        (tmp / EXEMPLARS_FILE).write_text(json.dumps(exemplars, ensure_ascii=False, indent=1),
                                          encoding="utf-8")
        (tmp / "LICENSE.txt").write_text(LICENCE_NOTE + "\n", encoding="utf-8")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _hub_snapshot() -> Path:
    from huggingface_hub import snapshot_download
    return Path(snapshot_download(HUB_ID, repo_type="dataset", allow_patterns=_PATTERNS))


def download_mgsm(dest: str | os.PathLike | None = None, *,
                  snapshot: Callable[[], str | os.PathLike] | None = None,
                  progress: Callable[[str], None] | None = None) -> Path:
    """Fetch MGSM from the Hub (or ``snapshot()``, a folder standing in) into ``dest``.

    ``dest`` defaults to ``cache_folder()``; an existing complete folder is returned as is."""
    dest = Path(dest) if dest is not None else cache_folder()
    if is_complete(dest):
        return dest
    if progress:
        progress(f"downloading MGSM from the Hub ({HUB_ID}, {LICENCE}), once")
    try:
        folder = Path(snapshot()) if snapshot is not None else _hub_snapshot()
    except MgsmDownloadError:
        raise
    except Exception as e:   # noqa: BLE001 - network, auth, disk: one line
        raise MgsmDownloadError(f"could not download MGSM from the Hub ({HUB_ID}): "
                                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    return build_mgsm_folder(folder, dest)
