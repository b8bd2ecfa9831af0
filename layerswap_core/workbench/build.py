"""The Build tab: the merge built in memory on the session's engine (``build``), saved to a
folder on the server (``save``), pushed to the Hub (``push_to_hub``) or zipped as a recipe
(``export_zip``)."""
from __future__ import annotations

import functools
import os
import tempfile
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

from ..checkpoints.references import check_free_space, is_offline
from ..merge import mergekit_yaml
from ..merge.executor import merge_to_folder, model_card
from .configure import merge_plan
from .saves import push_target, reserving
from .served import (HUB_ID, LIMITS, Access, Progress, WorkbenchError, capped, check_replace,
                     hide_paths, output_folder)
from .session import Session, dispatcher


@dataclass
class BuildResult:
    seconds: float
    changed: int            # tensors written into the merged model
    total: int
    summary: str

    def markdown(self) -> str:
        return (f"**Built in memory** in {self.seconds:.2f} s ({self.changed} of {self.total} "
                f"tensors recomputed).\n\n```\n{self.summary}\n```")


def build(session: Session, config, progress: Progress | None = None) -> BuildResult:
    """Merge in memory: an engine over the session's models is made the merge of ``config``
    (rewriting only the parameters whose source changed since it last showed something; a
    non-finite merge is refused there), and the session remembers ``config`` as its build."""
    res = dispatcher().run(session.job("show", config.to_dict()), progress)
    session.built_config = config
    return BuildResult(res["seconds"], res["rewritten"], res["total"], res["summary"])


def save(session: Session, config, folder: str, overwrite: bool = False,
         progress: Progress | None = None, *, access: Access | None = None) -> Path:
    """Stream the merge to a folder on the server (sharded safetensors, config, card): a name
    in the visitor's folder under the output root when serving visitors (``access``: theirs,
    ``Access.for_visitor``), within the save quotas (``saves.reserving``); any folder locally
    (``output_folder``)."""
    access = access or session.access
    out = output_folder(access, folder)
    check_replace(out, bool(overwrite))
    need = session.save_bytes[config.dtype]
    with reserving(access, out, need):
        return _merge_into(session, config, out, bool(overwrite), progress, need)


def _merge_into(session: Session, config, out: Path, overwrite: bool,
                progress: Progress | None, need: int) -> Path:
    """The merge streamed to ``out`` (at most ``need`` bytes), from the models as the Models
    tab checked them."""
    check_replace(out, overwrite)
    served = session.access.served
    check_free_space(Path(out).parent, need,
                     f"saving the merge to {Path(out).name if served else out}",
                     shown="the output folder" if served else None)
    if served and progress is not None:   # its lines without the server's folders
        progress = functools.partial(_hidden, progress)
    with dispatcher().hold(session.job("save"), progress) as guard:
        return merge_to_folder(config, session.refs["task"], session.refs["lang"],
                               session.refs.get("base"), out, overwrite=overwrite, progress=guard,
                               checked=session.checked,
                               names=session.recipe if served else None)


def _hidden(progress: Progress, fraction: float, message: str):
    return progress(fraction, hide_paths(message))


def hub_token() -> str | None:
    """A Hugging Face token from the environment, when the Hub may be used at all."""
    if is_offline():
        return None
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")


def push_to_hub(session: Session, config, repo_id: str, private: bool = True,
                progress: Progress | None = None, *, visitor_token: str | None = None,
                visitor: str | None = None) -> str:
    """Merge into a temporary folder and upload it to a Hub model repo; returns its URL.
    Served: only with the signed-in visitor's own token (``visitor_token``, user ``visitor``)
    into their own namespace (``saves.push_target``), never the server's token."""
    repo_id = capped("repo id", repo_id, LIMITS.ref_chars).strip()
    if session.access.served:
        repo_id = push_target(repo_id, visitor_token, visitor)
        token = None if is_offline() else visitor_token
    else:
        token = hub_token()
    if token is None:
        raise WorkbenchError("pushing needs the network and a token: set HF_TOKEN and unset "
                             "HF_HUB_OFFLINE")
    if not HUB_ID.fullmatch(repo_id):
        raise WorkbenchError(f"repo id {repo_id!r}: expected owner/name")
    from huggingface_hub import HfApi

    guard = progress or (lambda f, m: None)
    with tempfile.TemporaryDirectory(prefix="layerswap-push-") as tmp:
        out = _merge_into(session, config, Path(tmp) / "merged", False,
                          lambda f, m: guard(0.8 * f, m), session.save_bytes[config.dtype])
        guard(0.8, f"uploading to {repo_id}")
        api = HfApi(token=token)
        api.create_repo(repo_id, private=bool(private), exist_ok=True)
        api.upload_folder(folder_path=str(out), repo_id=repo_id,
                          commit_message="layerswap merge")
    return f"https://huggingface.co/{repo_id}"


def export_zip(session: Session, config, out_dir: str | None = None) -> Path:
    """A zip with the merge config (layerswap.yaml) and a model card (README.md), from the
    session's models as the Models tab checked them (no model file is read again)."""
    refs = {role: session.recipe[role] for role in ("task", "lang", "base") if role in session.refs}
    config = replace(config, **{role: refs.get(role) for role in ("task", "lang", "base")})
    card = model_card(config, merge_plan(session, config), refs, 0.0)
    card = card.replace("\nMerged in 0.0 s.\n", "\n")  # not merged yet: a recipe
    out_dir = Path(out_dir or tempfile.mkdtemp(prefix="layerswap-"))
    path = out_dir / "layerswap-merge.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("layerswap.yaml", config.to_yaml())
        z.writestr("README.md", card)
        z.writestr(*mergekit_yaml.mergekit_file(  # or why not; served: names, not folders
            config, session.opened, folders=not session.access.served))
    return path
