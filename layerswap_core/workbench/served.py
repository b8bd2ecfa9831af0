"""What a visitor may do on this server, and how a refusal reads.

``served_mode`` decides whether the app serves visitors; ``Access`` then says which model folders
they may name (``vet_reference``) and where saves go (``output_folder``; local: any folder;
served: embedded models, Hub ids, folders under the model roots, and named folders under the
output root). Every text the server parses is capped (``LIMITS``, ``capped``, ``bounded``)
before it is parsed. Errors meant for the page are ``WorkbenchError`` (or another ``ValueError``
subclass from the library) and ``readable_error`` turns any exception into one short line: the
page never shows a stack trace. Every other workbench module builds on this one.
"""
from __future__ import annotations

import html
import ipaddress
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from ..checkpoints.references import EMBEDDED_PREFIX, is_adapter
from ..progress import Cancelled, Progress  # noqa: F401  (Cancelled: re-exported)
from ..checkpoints import hub
from ..checkpoints.cache import cache_dir
from ..settings import env_number



# --------------------------------------------------------------------------- errors
class WorkbenchError(ValueError):
    """A problem to show on the page as one readable sentence."""


# --------------------------------------------------------------------------- server folders
# Folders of a server with visitors, and the words a visitor reads instead of them (a served
# ``Access.from_env`` registers its output root, the layerswap cache and the working directory;
# the served Hub cache is always hidden). Locally nothing is registered: real paths are shown.
_HIDDEN: dict[str, str] = {}


def hide_folder(folder, words: str) -> None:
    """From now on, ``hide_paths`` writes ``words`` for ``folder`` and any path under it."""
    for form in {str(Path(folder).expanduser()), os.path.realpath(Path(folder).expanduser())}:
        if form not in ("", os.sep):
            _HIDDEN.setdefault(form.rstrip(os.sep), words)


def hide_paths(text: str, names: dict | None = None) -> str:
    """``text`` without the server's folders: each folder of ``names`` (folder -> the model's
    name as the visitor gave it) and any path in it as that name; any path under a hidden
    folder (``hide_folder``, the served Hub cache) as its words ("the server's cache", "the
    output folder")."""
    text = str(text)
    cache = hub.served_cache_if_open()
    hidden = dict(_HIDDEN)
    if cache is not None:
        for form in (str(cache.root), os.path.realpath(cache.root)):
            hidden[form.rstrip(os.sep)] = "the server's cache"
    named = {}
    for folder, name in (names or {}).items():
        for form in (str(folder), os.path.realpath(folder)):
            named[form.rstrip(os.sep)] = str(name)
    for table in (named, hidden):
        for folder in sorted(table, key=len, reverse=True):
            if folder and folder in text:
                text = re.sub(re.escape(folder) + r"(?![\w-])(?:/[^\s'\"`,;:()\[\]]*)?",
                              lambda m, w=table[folder]: w, text)
    return text


def readable_error(exc: BaseException) -> str:
    """One line for the page: library errors as they are, anything else with its type; the
    server's folders in words (``hide_paths``)."""
    if isinstance(exc, Cancelled):
        return "Cancelled."
    if isinstance(exc, (ValueError, FileNotFoundError, FileExistsError, PermissionError)):
        msg = str(exc) or type(exc).__name__
    elif isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        msg = "out of memory: try fewer questions, shorter answers or a smaller model"
    else:
        msg = f"{type(exc).__name__}: {exc}"
    msg = " ".join(hide_paths(msg).split())
    return msg if len(msg) <= 600 else msg[:597] + "..."


def as_text(msg: str) -> str:
    """``msg`` for a Markdown or HTML line, shown as written: ``<lang>`` stays visible (not
    swallowed as a tag), ``&`` stays an ampersand."""
    return html.escape(msg, quote=False)


# --------------------------------------------------------------------------- limits
@dataclass(frozen=True)
class Limits:
    """Work allowed per request, so one visitor cannot exhaust a shared Space.

    Each can be raised with an environment variable LAYERSWAP_MAX_<NAME> (e.g. on a GPU Space).
    """
    eval_questions: int = 20
    shots: int = 8
    new_tokens: int = 256
    chat_chars: int = 2000           # one chat message
    chat_turns: int = 8
    history_chars: int = 24000       # a whole conversation sent back by the page
    request_seconds: int = 120       # one chat request (both answers) stops after this long
    sweep_cells: int = 25
    sweep_items: int = 8
    rules_chars: int = 2000          # custom partition rules
    values_chars: int = 200          # a sweep's x or y values
    ref_chars: int = 512             # a model reference, a local folder path, a Hub repo id
    name_chars: int = 100            # a folder name under the output root (served mode)
    jobs: int = 2                    # heavy jobs (analyze, build, save, evaluate, ...) at once
    plan_jobs: int = 4               # plan redraws and builds at once; chats: as many again
    queue: int = 16                  # jobs waiting for a live model at once (more are refused)
    session_seconds: int = 6 * 3600  # an open page keeps its models this long (closed: freed soon)
    agent_sessions: int = 32         # agent (MCP) sessions open at once (workbench.agents)
    agent_sessions_per_client: int = 4   # of them from one client address (or signed-in user)
    agent_idle_seconds: int = 900    # an agent session left idle this long is closed

    @classmethod
    def from_env(cls) -> Limits:
        return cls(**{f: env_number(f"LAYERSWAP_MAX_{f.upper()}", getattr(cls, f), int)
                      for f in cls.__dataclass_fields__})


LIMITS = Limits.from_env()
# Local mode (one user on their own machine) is theirs: the work a request may ask for is bounded
# by the data and the model (MGSM has 250 questions), not by a shared server's caps or budget.
LOCAL_LIMITS = replace(LIMITS, eval_questions=250, new_tokens=1024, sweep_cells=400,
                       sweep_items=250)


def limits_for(access) -> Limits:
    """The work limits of a page or session: the server's (``LIMITS``, from the environment)
    when it serves visitors, ``LOCAL_LIMITS`` on one's own machine."""
    return LIMITS if access.served else LOCAL_LIMITS


def capped(name: str, text, limit: int) -> str:
    """``text`` as a string, refused (before any parsing) when longer than ``limit`` characters."""
    text = "" if text is None else str(text)
    if len(text) > limit:
        raise WorkbenchError(f"{name}: at most {limit} characters on this server, got {len(text)}")
    return text


def bounded(name: str, value, lo: int, hi: int) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise WorkbenchError(f"{name}: expected a whole number, got {value!r}") from None
    if not lo <= v <= hi:
        raise WorkbenchError(f"{name} must be between {lo} and {hi} on this server, got {v}")
    return v


# --------------------------------------------------------------------------- served or local
def served_mode(host: str | None = None, share: bool = False) -> bool:
    """Whether the app serves visitors (who then reach only the folders ``Access`` allows).

    ``LAYERSWAP_SERVED=1`` / ``0`` decides; otherwise served on a Space (``SPACE_ID``), with a
    public share link, or when listening on an address that is not loopback."""
    forced = os.environ.get("LAYERSWAP_SERVED", "").strip().lower()
    if forced in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return forced in ("1", "true", "yes", "on")
    return bool(os.environ.get("SPACE_ID")) or share or not _loopback(host or "127.0.0.1")


def _loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:  # a host name: it may face the network
        return False


@dataclass(frozen=True)
class Access:
    """What the people using the page may touch on this machine.

    Local (one user on their own machine): any folder. Served (visitors over the network): models
    are ``embedded:`` names, Hub ids, folders under ``model_roots`` (``LAYERSWAP_MODEL_DIRS`` and
    the output root) or the references the server preselected (``trusted``); saves are named
    folders under ``output_root`` (``LAYERSWAP_OUTPUT_DIR``, default ``<cache>/outputs``)."""
    served: bool = False
    output_root: Path | None = None
    model_roots: tuple[Path, ...] = ()
    trusted: frozenset[str] = frozenset()
    namespace: str | None = None     # served: the visitor's own folder under output_root
    # served: whose quotas these are (``saves.person``): a signed-in user (``hf-<user>``) in every
    # tab, else the client's address (``client-<digest>``) in every tab and agent session
    person: str | None = None

    def for_visitor(self, namespace: str | None, person: str | None = None) -> Access:
        """The same access for one visitor (``saves.visitor_namespace``): served, their saves
        live in ``output_root/namespace`` and only they can list, pick or overwrite them;
        ``person`` (default: the namespace) is whose save quota and heavy job they use."""
        return replace(self, namespace=namespace, person=person or namespace)

    @property
    def saves_root(self) -> Path | None:
        """Where this visitor's saves go (served: their namespace; without one, the root)."""
        if self.output_root is None or not self.namespace:
            return self.output_root
        return self.output_root / self.namespace

    @classmethod
    def from_env(cls, served: bool, trusted=()) -> Access:
        out = Path(os.environ.get("LAYERSWAP_OUTPUT_DIR") or cache_dir() / "outputs").expanduser()
        dirs = os.environ.get("LAYERSWAP_MODEL_DIRS", "").split(os.pathsep)
        roots = [Path(d).expanduser() for d in dirs if d.strip()]
        if served:   # its lines and errors name these in words (hide_paths)
            hide_folder(out, "the output folder")
            hide_folder(cache_dir(), "the server's cache")
            hide_folder(os.getcwd(), "the server's folder")
        return cls(served, out, (*roots, out), frozenset(str(t) for t in trusted))

    def describe(self) -> str:
        """One line for the page."""
        if not self.served:
            return ("Local mode (one user): models may be any folder on this machine, saves any "
                    "absolute path (a bare name goes into the output folder) "
                    "(LAYERSWAP_SERVED=1 restricts them as for visitors).")
        roots = [r for r in self.model_roots if r != self.output_root]
        return ("Served mode: models are embedded, Hub ids or folders under "
                + ", ".join(f"`{r}`" for r in roots or self.model_roots)
                + "; saves are named folders in the server's output folder, each visitor's in "
                "their own folder that only they can see.")


LOCAL = Access()
# a Hub repo id: owner/name, dots only inside words (never '.', '..' or a leading dot)
HUB_ID = re.compile(r"[A-Za-z0-9][\w-]*(\.[\w-]+)*/[\w-]+(\.[\w-]+)*", re.ASCII)
REFUSED = ("not available on this server: use an embedded: model, a Hub id (owner/name) or a "
           "folder under the model folders named at the top of the page")


def _within(real: str, root: Path | str) -> bool:
    if not real or not str(root):
        return False
    top = os.path.realpath(root)
    return os.path.commonpath([real, top]) == top


def vet_reference(ref, access: Access = LOCAL, progress: Progress | None = None) -> str:
    """The reference to use for a model someone named. Local: as given. Served: an ``embedded:``
    name or a trusted reference as given, a Hub id as its downloaded folder (never read as a
    relative path), a plain name as the visitor's own save of that name, an absolute path as
    its real path (links resolved) when that lies under a model root; anything else is
    REFUSED, in the same words whatever exists on the server."""
    ref = capped("model reference", ref, LIMITS.ref_chars).strip()
    if not access.served or ref in access.trusted or ref.startswith(EMBEDDED_PREFIX):
        return ref
    if HUB_ID.fullmatch(ref):
        return str(hub.served_fetch(ref, access.namespace or ""))
    if access.namespace and _FOLDER_NAME.fullmatch(ref) and ".." not in ref:
        # one of the visitor's own saves, by its name (as Save and the agents' saved_to name it)
        real = os.path.realpath(access.saves_root / ref)
        if _within(real, access.saves_root) and os.path.isdir(real):
            return real
    if os.path.isabs(ref) and ref.isprintable():
        try:
            real = os.path.realpath(ref)
        except (OSError, ValueError):
            real = ""
        if real and _within(real, access.output_root or "") and access.namespace:
            # the shared output root: only the visitor's own saves
            ok = _within(real, access.saves_root)
        else:
            ok = any(_within(real, root) for root in access.model_roots)
        if real and ok:
            return real
    raise WorkbenchError(REFUSED)


def recipe_name(name: str, ref, access: Access = LOCAL) -> str:
    """How a recipe (layerswap.yaml, the model card, mergekit.yaml) names the model a visitor
    named ``name`` and ``vet_reference`` made ``ref``. Local: ``ref`` (the reference used).
    Served, never a server folder: a Hub id as ``owner/name@commit`` (its folder in the served
    cache is named by the commit), an ``embedded:`` or trusted reference as given, a folder
    under a model root by its path under that root, a visitor's own save by its name."""
    name, ref = str(name).strip(), str(ref)
    if not access.served or name in access.trusted or name.startswith(EMBEDDED_PREFIX):
        return ref if not access.served else name
    if HUB_ID.fullmatch(name):
        return f"{name}@{Path(ref).name}"
    real = os.path.realpath(ref)
    roots = [r for r in (access.saves_root, *access.model_roots)
             if r is not None and r != access.output_root]
    for root in roots:
        if _within(real, root):
            return os.path.relpath(real, os.path.realpath(root))
    return hide_paths(name)


def offered_models(access: Access, limit: int = 50) -> list[str]:
    """Model and adapter folders directly under the model roots (the served page lists them);
    of the output root, only the visitor's own saves (none without a namespace)."""
    found = []
    roots = [r for r in access.model_roots if r != access.output_root] if access.served else []
    if access.served and access.namespace and access.saves_root is not None:
        roots.append(access.saves_root)
    for root in roots:
        try:
            subs = sorted(p for p in Path(root).iterdir() if p.is_dir())
        except OSError:
            continue
        found += [str(p) for p in subs
                  if (p / "config.json").exists() or is_adapter(p)]
    return found[:limit]


# --------------------------------------------------------------------------- where saves go
_FOLDER_NAME = re.compile(r"\w[\w.-]*")


def output_folder(access: Access, folder) -> Path:
    """Where a save goes. Served: a plain name (no '/', '\\', '..', leading '.') for a folder
    directly under the output root, never a link out of it. Local: an absolute (or ~) path as
    given; a name or relative path under the output root, never the current directory."""
    limit = LIMITS.name_chars if access.served else LIMITS.ref_chars
    text = capped("output folder", folder, limit).strip()
    if not text:
        raise WorkbenchError("give a name for the output folder" if access.served
                             else "give an output folder")
    if not access.served:
        path = Path(text).expanduser()
        if path.is_absolute():
            return path
        root = access.output_root or Access.from_env(False).output_root
        root.mkdir(parents=True, exist_ok=True)
        return root / path
    if not _FOLDER_NAME.fullmatch(text) or ".." in text:
        raise WorkbenchError(f"output folder {text!r}: give a name (letters, digits, '-', '_', "
                             "'.'), not a path; it is saved in this server's output folder")
    root = access.saves_root
    root.mkdir(parents=True, exist_ok=True)
    if root.is_symlink() or not _within(os.path.realpath(root), access.output_root):
        raise WorkbenchError("this visitor's save folder is a link: not writing there")
    out = root / text
    if out.is_symlink() or os.path.realpath(out) != os.path.join(os.path.realpath(root), text):
        raise WorkbenchError(f"output folder {text!r} is a link out of the output folder: "
                             "not writing there")
    return out


def check_replace(out: Path, overwrite: bool) -> None:
    """An existing folder is replaced only with overwrite, and only when it is a layerswap
    output (it has its layerswap.yaml): never a model, a cache or anything else. The messages
    name the folder by its name (served, the server's paths are not the visitor's business)."""
    target = Path(out).expanduser()
    if not (target.exists() or target.is_symlink()):
        return
    if not overwrite:
        raise WorkbenchError(f"{target.name} already exists: tick Overwrite to replace it")
    if not target.is_dir() or not (target / "layerswap.yaml").is_file():
        raise WorkbenchError(f"{target.name} is not a layerswap output (no layerswap.yaml): "
                             "not replacing it")
