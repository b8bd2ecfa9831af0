"""The Models tab's pre-flight: before "Download and use", whether the picked models fit together,
from their metadata alone (``checkpoints.preflight``: the Hub's listing, configs, weight headers,
tokenizers; no weight is downloaded), and what using them would cost (download, memory).

Served, a Hub id is read with a visitor's rules (no server token, gated and private models
refused, the served cache's limits and its copies); any other reference is vetted first
(``served.vet_reference``), as the pick vets it.
"""
from __future__ import annotations

import os

from ..checkpoints import hub
from ..checkpoints.preflight import Preflight, preflight
from ..checkpoints.references import is_offline
from ..memory import memory_available
from ..progress import Progress
from .served import HUB_ID, LIMITS, LOCAL, Access, WorkbenchError, as_text, capped, \
    readable_error, vet_reference

LABELS = {"base": "base", "task": "task expert", "lang": "language expert"}


def preflight_models(base: str, task: str, lang: str, access: Access = LOCAL,
                     progress: Progress | None = None) -> Preflight:
    """The pre-flight of the trio (checked against the task expert, as ``check_models``).
    WorkbenchError when the task or language expert is missing; a reference this server refuses
    is a problem of the answer, as is every model that cannot be read."""
    names = {role: capped(f"{LABELS[role]} reference", ref, LIMITS.ref_chars).strip()
             for role, ref in (("task", task), ("lang", lang), ("base", base))}
    for role in ("task", "lang"):
        if not names[role]:
            raise WorkbenchError(f"give a {LABELS[role]} (an embedded: name, a folder or a Hub id)")
    refs, refused = {}, []
    for role, name in names.items():
        if not name:
            continue
        if not access.served or name in access.trusted or HUB_ID.fullmatch(name):
            refs[role] = name          # a Hub id is read from its metadata, not downloaded
            continue
        try:
            refs[role] = vet_reference(name, access, progress)
        except ValueError as e:
            refused.append(f"{role} {name}: {readable_error(e)}")
    if refused:
        return Preflight({}, refused)
    return preflight(refs, served=access.served, progress=progress)


def preflight_markdown(pf: Preflight, access: Access = LOCAL) -> str:
    """The pre-flight for the page: a verdict line, then one line per model and the totals."""
    head = ("**Compatible** (from their metadata: nothing downloaded yet)" if pf.ok
            else f"**Not compatible**: {pf.refusal}")
    lines = pf.lines()[:-1]
    free = memory_available() if access.served and pf.models else None
    if free is not None:
        lines.append(f"this server has {free / 10 ** 9:.1f} GB of memory available now")
    return "\n".join([as_text(head), *(f"- {as_text(line)}" for line in lines)])


def _here(repo_id: str, access: Access) -> bool:
    """Whether the Hub model ``repo_id`` is here already, or on its way: served, in the served
    cache or downloading there; else in the local Hugging Face cache."""
    if access.served:
        cache = hub.served_cache()
        job = cache.jobs.get(repo_id)
        return cache.cached(repo_id) is not None or (job is not None and job.running)
    from huggingface_hub import snapshot_download
    try:
        snapshot_download(repo_id, allow_patterns=["config.json"], local_files_only=True)
        return True
    except Exception:  # noqa: BLE001 - not in the local cache
        return False


def awaiting_download(refs, access: Access = LOCAL) -> list[str]:
    """The Hub ids among ``refs`` a pick would download first (not here yet, the Hub
    reachable: offline the check itself says what is missing). Locally a folder of that name
    is not a Hub id; served, ``owner/name`` is always one (``vet_reference``), whatever lies in
    the server's working directory: the answer says nothing of its files."""
    if is_offline():
        return []
    out = []
    for ref in refs:
        ref = (ref or "").strip()
        if (HUB_ID.fullmatch(ref) and ref not in access.trusted
                and (access.served or not os.path.exists(ref))
                and ref not in out and not _here(ref, access)):
            out.append(ref)
    return out


def preflight_gate(base: str, task: str, lang: str, access: Access = LOCAL,
                   progress: Progress | None = None) -> tuple[Preflight, list[str]] | None:
    """Before a pick that would download Hub models: their pre-flight and which they are (the
    page then offers "Download and use" when it is compatible). None: nothing to download, the
    pick goes on."""
    missing = awaiting_download((base, task, lang), access)
    if not missing:
        return None
    return preflight_models(base, task, lang, access, progress), missing


def download_gate(base: str, task: str, lang: str, access: Access = LOCAL,
                  progress: Progress | None = None) -> Preflight | None:
    """Before an explicit download ("Download and use", ``/download_models``, an agent's
    ``check_models(download=true)``): the pre-flight of a trio with Hub models to download when
    it refuses them (nothing may download then), else None. The same metadata reads as
    ``preflight_gate``: whoever calls the download step directly meets the same gate."""
    gate = preflight_gate(base, task, lang, access, progress)
    return gate[0] if gate is not None and not gate[0].ok else None


def download_line(pf: Preflight, missing: list[str]) -> str:
    """What "Download and use" would fetch, in one line."""
    return (f"Nothing large is downloaded yet. **Download and use** fetches {', '.join(missing)} "
            f"({pf.download_bytes / 10 ** 9:.2f} GB), then checks them again from their files.")
