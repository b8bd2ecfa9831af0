"""Served mode's shared disk: whose saves are whose, how much each may keep, when they go, and
what a visitor's downloads leave in the temporary folder.

* **Who**: ``visitor_namespace`` is plain data, a folder name: ``hf-<user>`` for a visitor signed
  in with Hugging Face (their saves survive sessions), else ``session-<digest>`` of the page
  session (a keyed digest: the folder does not reveal the session id). ``Access.for_visitor``
  then confines their saves, the saves they may pick and the ones listed to
  ``<output root>/<namespace>``. Whose quota: ``person`` (a signed-in user, else the client's
  address as the Space's proxy reports it, ``client_address``): one anonymous person's tabs and
  agent sessions share one quota and one heavy job.
* **How much**: ``reserving`` refuses a save, before anything is written, when it would take the
  person past ``LAYERSWAP_MAX_SAVES_GB_PER_VISITOR`` (every namespace of theirs together) or
  everyone past ``LAYERSWAP_MAX_SAVES_GB`` (saves being written count too). At the total, an
  anonymous visitor's save is refused (it never evicts anyone's save); a signed-in user's evicts
  the oldest saves of anonymous visitors, never another signed-in user's.
* **How long**: saves older than ``LAYERSWAP_SAVES_HOURS`` are removed (``expire``, run before
  every served save); an anonymous visitor's saves go when their session ends (``end_visit``).
* **Temporary files**: ``temp_folder`` is a visitor's folder for one download, removed when the
  download has been handed over; ``remember`` notes a copy the web server made (its cached
  zip), removed with the rest by ``end_visit``.
Locally (one user) none of these limits apply: saves are the user's own folders.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import re
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..checkpoints import hub
from ..checkpoints.cache import evict_lru, folder_bytes
from ..checkpoints.writing import remove_stale
from ..settings import env_number
from .served import Access, WorkbenchError

GB = hub.GB
_SECRET = os.urandom(32)                         # per process: session folders cannot be guessed
_USER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}", re.ASCII)
TEMP_PREFIX = "layerswap-dl-"         # only these are swept (never a bench's folder)


# --------------------------------------------------------------------------- who
def visitor_namespace(user: str | None = None, session_id: str | None = None) -> str:
    """The visitor's folder name: ``hf-<user>`` when signed in, else ``session-<digest>``."""
    if user:
        if not _USER.fullmatch(user) or ".." in user:
            raise WorkbenchError("this Hugging Face user name cannot name a folder here")
        return f"hf-{user}"
    if not session_id:
        raise WorkbenchError("no visitor session: reload the page")
    digest = hmac.new(_SECRET, str(session_id).encode(), hashlib.sha256).hexdigest()[:24]
    return f"session-{digest}"


def person(user: str | None = None, address: str | None = None) -> str | None:
    """Whose quotas a visitor uses: ``hf-<user>`` when signed in (every tab of theirs), else
    ``client-<digest>`` of the client's address (every tab and agent session from it: a keyed
    digest, the address is not kept); None without either (then each namespace is its own)."""
    if user:
        return visitor_namespace(user)
    if not address:
        return None
    digest = hmac.new(_SECRET, b"client:" + str(address).encode(), hashlib.sha256).hexdigest()
    return f"client-{digest[:24]}"


# where a proxy in front of the server connects from: loopback (gradio's MCP loopback, a local
# proxy), the private ranges (RFC 1918, carrier-grade NAT, IPv6 unique local)
_PROXIES = tuple(ipaddress.ip_network(n) for n in (
    "127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
    "fc00::/7"))


def _proxy(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host.strip().strip("[]"))
    except ValueError:
        return False
    return any(ip.version == n.version and ip in n for n in _PROXIES)


def client_address(host: str | None, forwarded_for: str | None) -> str | None:
    """The client's address for ``person``: the first hop of ``X-Forwarded-For`` when the
    connection comes from a proxy (a loopback or private address, ``_PROXIES``: the Space's proxy, or
    gradio's own loopback for MCP calls, which passes the caller's headers on), else the
    connection's own address (a client reaching the server directly cannot name itself)."""
    host = (host or "").strip()
    first = (forwarded_for or "").split(",")[0].strip()[:64]
    if first and _proxy(host):
        return first
    return host or None


def signed_in(namespace: str | None) -> str | None:
    """The Hugging Face user of a signed-in visitor's namespace, else None."""
    return namespace[3:] if namespace and namespace.startswith("hf-") else None


# --------------------------------------------------------------------------- how much, how long
@dataclass(frozen=True)
class Quotas:
    """Served defaults, sized for a free Space's 50 GB disk beside the 20 GB model cache."""
    per_visitor: int | None = 3 * GB       # LAYERSWAP_MAX_SAVES_GB_PER_VISITOR
    total: int | None = 15 * GB            # LAYERSWAP_MAX_SAVES_GB
    keep_seconds: float | None = 24 * 3600  # LAYERSWAP_SAVES_HOURS

    @classmethod
    def from_env(cls) -> Quotas:
        d = cls()
        hours = env_number("LAYERSWAP_SAVES_HOURS", d.keep_seconds / 3600, off=True)
        return cls(hub.env_gb("LAYERSWAP_MAX_SAVES_GB_PER_VISITOR", d.per_visitor / GB),
                   hub.env_gb("LAYERSWAP_MAX_SAVES_GB", d.total / GB),
                   None if hours is None else hours * 3600)


_LOCK = threading.Lock()
_WRITING: dict[Path, tuple[str, int]] = {}       # save folder being written -> (namespace, bytes)
_OWNER: dict[str, str] = {}      # namespace -> the person whose quota it uses (``Access.person``)


def _saves(root: Path) -> list[Path]:
    """Every save under the output root: <root>/<namespace>/<name>."""
    found = []
    for ns in _dirs(root):
        found += _dirs(ns)
    return found


def _dirs(folder: Path) -> list[Path]:
    try:
        return [p for p in Path(folder).iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []


def _age(folder: Path) -> float:
    try:
        return time.time() - folder.stat().st_mtime
    except OSError:
        return 0.0


def expire(access: Access, quotas: Quotas | None = None) -> list[Path]:
    """Remove served saves older than the keep time (none locally); returns them."""
    quotas = quotas or Quotas.from_env()
    if not access.served or quotas.keep_seconds is None or access.output_root is None:
        return []
    gone = [p for p in _saves(access.output_root)
            if p not in _WRITING and _age(p) > quotas.keep_seconds]
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return gone


@contextmanager
def reserving(access: Access, out: Path, nbytes: int, quotas: Quotas | None = None):
    """Hold ``nbytes`` for a save into ``out`` while the block writes it; refused first when it
    would pass the visitor's or the total quota (served only; a folder being replaced counts
    as freed). At the total, expired saves and then the oldest saves of other visitors go."""
    if not access.served or access.output_root is None:
        yield
        return
    quotas = quotas or Quotas.from_env()
    out = Path(out)
    with _LOCK:
        expire(access, quotas)
        replaced = folder_bytes(out)
        ns = access.namespace or ""
        who = access.person or ns
        _OWNER[ns] = who
        theirs = {n for n, p in _OWNER.items() if p == who} | {ns}
        mine = (sum(folder_bytes(access.output_root / n) for n in theirs if n)
                + sum(b for n, b in _WRITING.values() if n in theirs) - replaced)
        if quotas.per_visitor is not None and mine + nbytes > quotas.per_visitor:
            where = ("" if len(theirs) == 1 else
                     f" (in your {len(theirs)} tabs and agent sessions together)")
            raise WorkbenchError(
                f"this save needs {hub.gb_text(nbytes)}; your saves use {hub.gb_text(mine)}{where} of "
                f"the {hub.gb_text(quotas.per_visitor)} each visitor may keep on this server "
                "(LAYERSWAP_MAX_SAVES_GB_PER_VISITOR): overwrite one of them instead")
        if quotas.total is not None:
            _make_room(access, out, nbytes, replaced, quotas.total)
        _WRITING[out] = (ns, nbytes)
    try:
        yield
    finally:
        with _LOCK:
            _WRITING.pop(out, None)


def _make_room(access: Access, out: Path, nbytes: int, replaced: int, total: int) -> None:
    """Room for ``nbytes`` under the total: a signed-in user's save evicts the oldest saves of
    anonymous visitors (expired ones are gone already); an anonymous visitor's evicts nothing
    (refused: it would take unexpired saves of others for its own)."""
    saves = {p: folder_bytes(p) for p in _saves(access.output_root)}
    used = sum(saves.values()) + sum(b for _, b in _WRITING.values()) - replaced
    if nbytes > total:
        raise WorkbenchError(f"this save needs {hub.gb_text(nbytes)}, more than the "
                             f"{hub.gb_text(total)} this server keeps for all saves "
                             "(LAYERSWAP_MAX_SAVES_GB)")
    if used + nbytes > total and not signed_in(access.namespace):
        raise WorkbenchError(
            f"this save needs {hub.gb_text(nbytes)}; the saves on this server already use "
            f"{hub.gb_text(used)} of {hub.gb_text(total)} (LAYERSWAP_MAX_SAVES_GB), and other "
            "visitors' saves are kept until they expire: overwrite one of yours, or try again "
            "later")
    mine = access.saves_root
    used = evict_lru(saves, used, nbytes, total, oldest_first=lambda p: -_age(p),
                     keep=lambda p: (p == out or p in _WRITING or bool(signed_in(p.parent.name))
                                     or (mine is not None and p.parent == mine)))
    if used + nbytes > total:
        raise WorkbenchError(
            f"this save needs {hub.gb_text(nbytes)}; the saves on this server already use "
            f"{hub.gb_text(used)} of {hub.gb_text(total)} (LAYERSWAP_MAX_SAVES_GB): overwrite one of "
            "yours or try again later")


def push_target(repo_id: str, token: str | None, user: str | None) -> str:
    """Served: where a visitor's push goes (``user/name`` in their own namespace, with their
    own token); refused without sign-in or to another namespace."""
    if not token or not user:
        raise WorkbenchError("sign in with Hugging Face (the button at the top of the page) to "
                             "push to your own account; this server never pushes with its "
                             "own token")
    owner, _, name = repo_id.rpartition("/")
    if owner and owner != user:
        raise WorkbenchError(f"you can push only to your own namespace: {user}/{name}")
    return f"{user}/{name}"


def own_saves(access: Access) -> list[str]:
    """The visitor's saves (served), newest first: the only saves they may list and pick."""
    if not access.served or not access.namespace or access.saves_root is None:
        return []
    mine = [p for p in _dirs(access.saves_root) if (p / "layerswap.yaml").is_file()]
    return [str(p) for p in sorted(mine, key=_age)]


# --------------------------------------------------------------------------- temporary files
_TEMP: dict[str, set[Path]] = {}                 # namespace -> files and folders to remove


def temp_root() -> Path:
    return Path(tempfile.gettempdir())


@contextmanager
def temp_folder(namespace: str):
    """A fresh ``layerswap-dl-*`` folder in the system temporary folder for one download of the
    visitor's, removed when the block ends (the download was handed over) and, should the
    process be stopped in between, by ``end_visit`` or ``sweep_temp``."""
    sweep_temp()
    path = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    with _LOCK:
        _TEMP.setdefault(namespace, set()).add(path)
    try:
        yield path
    finally:
        _remove(path)
        with _LOCK:
            _TEMP.get(namespace, set()).discard(path)


def remember(namespace: str, path) -> None:
    """A file made for the visitor elsewhere (the web server's copy of a zip), removed at the
    end of their visit."""
    with _LOCK:
        _TEMP.setdefault(namespace, set()).add(Path(path))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        path.unlink()
        path.parent.rmdir()          # the web server's per-file folder, when now empty
    except OSError:
        pass


def sweep_temp(max_age: float = 6 * 3600) -> list[Path]:
    """Remove ``layerswap-dl-*`` folders of the system temporary folder older than ``max_age``
    (what a stopped process left)."""
    return remove_stale(temp_root(),
                        lambda p: p.name.startswith(TEMP_PREFIX) and _age(p) > max_age)


def downloads(access: Access) -> list:
    """The visitor's Hub downloads (``hub.Download``: ``line()``, ``running``, ``error``)."""
    return hub.served_cache().status(access.namespace or "") if access.served else []


def cancel_downloads(access: Access) -> list[str]:
    """Stop the visitor's Hub downloads (one another visitor waits for goes on for them)."""
    return hub.served_cache().cancel(access.namespace or "") if access.served else []


def end_visit(namespace: str | None, access: Access | None = None) -> None:
    """The visitor's session ended: their temporary files go, their models may leave the Hub
    cache, and an anonymous visitor's saves (nobody can reach them now) are removed."""
    if not namespace:
        return
    with _LOCK:
        paths = _TEMP.pop(namespace, set())
    for p in paths:
        _remove(p)
    hub.served_cache().release(namespace)
    if access is not None and access.served and access.output_root is not None \
            and not signed_in(namespace):
        mine = access.output_root / namespace
        if mine.is_dir() and not mine.is_symlink() and not any(
                p.parent == mine for p in _WRITING):
            shutil.rmtree(mine, ignore_errors=True)
        with _LOCK:
            if not mine.exists():
                _OWNER.pop(namespace, None)
