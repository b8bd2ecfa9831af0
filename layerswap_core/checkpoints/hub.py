"""Hub downloads for a server with visitors: bounded, in the background, in a capped cache.

Locally, ``references.resolve`` downloads a Hub id with ``huggingface_hub`` into its own cache,
inside the call (one user, nothing in their way). Served, a visitor naming a Hub id gets
``served_fetch``: the model's folder when it is already here, else a background ``Download``
(one per repository, shared by every visitor asking for it) and a ``Pending`` error saying how
far it got. A download:

* lists the repository's files with their sizes (model info) and is refused, before any byte of
  a file is fetched, when the listed total exceeds ``LAYERSWAP_MAX_DOWNLOAD_GB`` (or a size is
  not listed, or the repository is gated or private: the server's token is never used for it);
* fetches each file with ``huggingface_hub.hf_hub_download`` at the listed commit (the endpoint
  passed to it, and ``token=False``): its retries resume a broken-off file with a Range
  request; its metadata and read timeouts are ``LAYERSWAP_HUB_TIMEOUT`` seconds, so a silent Hub
  is an error within a minute (one that goes silent mid-file is retried first: 6 tries, each
  waiting that long, and Cancel waits for them); the progress bar it is given (``_Watch``)
  counts the bytes and stops the file at Cancel (within ``CHUNK_BYTES``), past its listed
  size or past the download's deadline (``DOWNLOAD_MIN_RATE``: a Hub that dribbles);
* checks every file against the listing: its size, and its sha256 (LFS) or git blob id;
* writes into a partial folder renamed into place when complete (never half a model, never a
  file that does not match its checksum);
* makes room first in the served cache (``LAYERSWAP_MAX_HUB_CACHE_GB``), evicting the least
  recently used models that no visitor holds (``hold``/``release``: the models a live session
  picked).

Errors are sentences (``ModelLoadError``): never an internal URL or an exception class.
"""
from __future__ import annotations

import fnmatch
import re
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from ..progress import Progress, Rate, say
from ..settings import env_number
from .references import ModelLoadError, check_folder, check_free_space, is_offline
from .cache import cache_dir, evict_lru, folder_bytes
from .reading import CheckpointReader

GB = 10 ** 9
PATTERNS = ("*.json", "*.safetensors", "*.model", "*.txt", "*.jinja")
USED = ".last-used"          # beside a cached repository's snapshots; its mtime is its last use
CHUNK_BYTES = 256 << 10      # a download reads at most this much between two looks at Cancel
# A download's overall deadline: DOWNLOAD_SLACK_SECONDS plus its listed size at DOWNLOAD_MIN_RATE
# bytes a second (a 10 GB model: about 3 hours). Each read has its timeout, but a Hub that sends
# a byte every few seconds answers every read in time and would hold a download slot for ever.
DOWNLOAD_SLACK_SECONDS = 600.0
DOWNLOAD_MIN_RATE = 10 ** 6


class Pending(ModelLoadError):
    """The model is being downloaded in the background; the message says how far it got."""


def gb_text(nbytes: float) -> str:
    return f"{nbytes / GB:.2f} GB" if nbytes >= GB / 10 else f"{nbytes / 10 ** 6:.1f} MB"


def env_gb(name: str, default: float | None) -> int | None:
    """Bytes from a variable in GB (decimal, 10^9 bytes); unset or unreadable: ``default``;
    "off", "none" or "0": None (no limit): ``settings.env_number``."""
    value = env_number(name, default, off=True)
    return None if value is None else int(value * GB)


@dataclass(frozen=True)
class HubLimits:
    """Served defaults sized for a Space's 50 GB disk; locally every limit is off unless set."""
    max_download: int | None = 10 * GB     # LAYERSWAP_MAX_DOWNLOAD_GB: one repository
    cache_bytes: int | None = 20 * GB      # LAYERSWAP_MAX_HUB_CACHE_GB: every served download
    timeout: float = 20.0                  # LAYERSWAP_HUB_TIMEOUT: seconds to connect, per read
    jobs: int = 2                          # LAYERSWAP_MAX_DOWNLOADS: downloads at once

    @classmethod
    def from_env(cls, served: bool = True) -> HubLimits:
        d = cls() if served else cls(None, None, 20.0, 2)
        return cls(env_gb("LAYERSWAP_MAX_DOWNLOAD_GB", d.max_download and d.max_download / GB),
                   env_gb("LAYERSWAP_MAX_HUB_CACHE_GB", d.cache_bytes and d.cache_bytes / GB),
                   max(env_number("LAYERSWAP_HUB_TIMEOUT", d.timeout), 0.1),
                   max(1, env_number("LAYERSWAP_MAX_DOWNLOADS", d.jobs, int)))


def too_big(nbytes: int, limit: int | None) -> str | None:
    """The refusal of a download of ``nbytes`` over ``limit`` (the message names the limit)."""
    if limit is None or nbytes <= limit:
        return None
    return (f"{gb_text(nbytes)} to download; this server downloads at most "
            f"{gb_text(limit)} per model (LAYERSWAP_MAX_DOWNLOAD_GB)")


# --------------------------------------------------------------------------- one download
@dataclass
class Download:
    repo_id: str
    state: str = "listing"                 # listing, downloading, done, failed, cancelled
    done: int = 0
    total: int | None = None
    error: str | None = None
    path: Path | None = None
    waiting: set[str] = field(default_factory=set)   # visitors who asked for it
    cancel: threading.Event = field(default_factory=threading.Event)
    started: float = field(default_factory=time.monotonic)
    thread: threading.Thread | None = None
    rate: Rate = field(default_factory=Rate)   # the bytes' speed so far -> the time left
    deadline: float = float("inf")             # set from the listed size (DOWNLOAD_MIN_RATE)

    @property
    def running(self) -> bool:
        return self.state in ("listing", "downloading")

    def line(self) -> str:
        """Where the download stands, in words."""
        if self.state == "listing":
            return f"{self.repo_id}: asking the Hub for its files..."
        if self.state == "downloading":
            pct = 100 * self.done / self.total if self.total else 0
            left = self.rate.left(self.done / self.total) if self.total else ""
            return (f"{self.repo_id}: downloading in the background, {pct:.0f}% "
                    f"({gb_text(self.done)} of {gb_text(self.total or 0)}{', ' + left if left else ''})"
                    "; press Check again when it is done")
        if self.state == "done":
            return f"{self.repo_id}: downloaded; press Check to use it"
        if self.state == "cancelled":
            return f"{self.repo_id}: download cancelled"
        return f"{self.repo_id}: {self.error}"


def hub_error_words(exc: BaseException, timeout: float) -> str:
    """An exception of a Hub call as a sentence (no URL, no exception class)."""
    import httpx2
    from huggingface_hub import errors

    if isinstance(exc, ModelLoadError):
        return str(exc)
    if isinstance(exc, (ValueError, errors.LocalEntryNotFoundError)) and exc.__cause__:
        return hub_error_words(exc.__cause__, timeout)    # hf_hub_download's wrapping of a failed HEAD
    if isinstance(exc, httpx2.TimeoutException):
        return f"the Hub did not answer within {timeout:.0f} s; try again later"
    if isinstance(exc, (httpx2.ConnectError, httpx2.NetworkError)):
        return "cannot reach the Hub from this server; try again later"
    if isinstance(exc, httpx2.TransportError):
        return "the connection to the Hub broke off; try again later"
    if isinstance(exc, errors.GatedRepoError):
        return "this model is gated (its terms must be accepted): not downloaded on this server"
    if isinstance(exc, (errors.RepositoryNotFoundError, errors.RevisionNotFoundError,
                        errors.EntryNotFoundError)):
        return "no public model of that name on the Hub"
    if isinstance(exc, errors.OfflineModeIsEnabled):
        return "the Hub is switched off on this server (HF_HUB_OFFLINE=1)"
    if isinstance(exc, errors.HfHubHTTPError):
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403, 404):
            return "no public model of that name on the Hub"
        return f"the Hub answered with an error{f' (HTTP {status})' if status else ''}; " \
               "try again later"
    if isinstance(exc, OSError):
        return "the server could not write the download (disk full or not writable)"
    return "the download failed; try again later"


def file_url(endpoint: str, repo_id: str, sha: str, name: str) -> str:
    """The ``resolve`` URL of one file of a repository at a commit."""
    from urllib.parse import quote
    return f"{endpoint}/{repo_id}/resolve/{quote(sha, safe='')}/{quote(name)}"


# --------------------------------------------------------------------------- other hosts
_GUARD = threading.local()      # .endpoint: the Hub this thread's served reads may reach
OTHER_HOST = "the Hub sent this server to another host: refused"


def _hub_like(host: str) -> bool:
    return host in ("huggingface.co", "hf.co") or host.endswith((".huggingface.co", ".hf.co"))


def same_host_allowed(endpoint: str, url: str) -> bool:
    """Whether a served read of the Hub at ``endpoint`` may request ``url``: the endpoint's own
    scheme, host and port; from the Hugging Face Hub itself, its file hosts too (https, under
    huggingface.co or hf.co: its LFS and Xet downloads are redirected there)."""
    from urllib.parse import urlsplit

    def origin(u):
        port = u.port or (443 if u.scheme == "https" else 80)
        return u.scheme, (u.hostname or "").lower(), port
    e, u = urlsplit(endpoint), urlsplit(url)
    if origin(e) == origin(u):
        return True
    return _hub_like((e.hostname or "").lower()) and u.scheme == "https" \
        and _hub_like((u.hostname or "").lower())


def _guard_request(request) -> None:
    """huggingface_hub's client's request hook (every request, each redirect's too): in a
    ``same_host`` block, a request to another host is refused before it is sent."""
    endpoint = getattr(_GUARD, "endpoint", None)
    if endpoint is not None and not same_host_allowed(endpoint, str(request.url)):
        raise ModelLoadError(OTHER_HOST)


class same_host:
    """A block whose Hub requests (huggingface_hub's shared client, in this thread) reach only
    ``endpoint`` (``same_host_allowed``): a redirect elsewhere is refused in one line."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint

    def __enter__(self):
        from huggingface_hub.utils import get_session

        client = get_session()     # the hook is put on the client in use (a new one: again)
        hooks = client.event_hooks
        if _guard_request not in hooks.get("request", []):
            hooks["request"] = [*hooks.get("request", []), _guard_request]
            client.event_hooks = hooks
        self.before = getattr(_GUARD, "endpoint", None)
        _GUARD.endpoint = self.endpoint
        return self

    def __exit__(self, *exc):
        _GUARD.endpoint = self.before


_SAFE_NAME = re.compile(r"[\w.-]+(/[\w.-]+)*")


def check_file_names(names) -> None:
    for name in names:
        if not _SAFE_NAME.fullmatch(name) or any(p in ("", ".", "..") for p in name.split("/")):
            raise ModelLoadError("the Hub listed a file name that is not a plain path: refused")


# --------------------------------------------------------------------------- the served cache
class HubCache:
    """Served downloads in ``root`` (``<owner>--<name>/<commit>/`` per model), at most
    ``limits.cache_bytes`` in all, least recently used first out."""

    def __init__(self, root: Path, limits: HubLimits | None = None, endpoint: str | None = None,
                 hold_seconds: float = 6 * 3600):
        self.root = Path(root)
        self.limits = limits or HubLimits.from_env(served=True)
        self.endpoint = endpoint
        self.jobs: dict[str, Download] = {}
        # visitor -> {model folder their session uses: when}; a hold lapses after hold_seconds
        # (a session's longest life) even if the visitor never closed their page
        self.holds: dict[str, dict[Path, float]] = {}
        self.hold_seconds = hold_seconds
        self.lock = threading.RLock()

    # ---- folders
    def repo_dir(self, repo_id: str) -> Path:
        return self.root / repo_id.replace("/", "--")

    def cached(self, repo_id: str) -> Path | None:
        """The newest complete snapshot of ``repo_id`` here, or None."""
        d = self.repo_dir(repo_id)
        try:
            snaps = [p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")]
        except OSError:
            return None
        return max(snaps, key=lambda p: p.stat().st_mtime) if snaps else None

    def discard(self, repo_id: str, path) -> bool:
        """Remove a snapshot of ``repo_id`` that turned out unreadable (a check failed on it),
        so that the next pick downloads it again instead of failing on the same files."""
        path = Path(path)
        with self.lock:
            if not (path.parent == self.repo_dir(repo_id) and path.is_dir()):
                return False
            for held in self.holds.values():
                held.pop(path, None)
            shutil.rmtree(path, ignore_errors=True)
            return not path.exists()

    def used(self, repo_dir: Path) -> float:
        try:
            return (repo_dir / USED).stat().st_mtime
        except OSError:
            return 0.0

    def touch(self, repo_id: str) -> None:
        d = self.repo_dir(repo_id)
        (d / USED).touch()

    # ---- holds: models a live session uses are never evicted
    def hold(self, visitor: str, path) -> None:
        with self.lock:
            self.holds.setdefault(visitor, {})[Path(path)] = time.monotonic()

    def release(self, visitor: str) -> None:
        """The visitor's session ended: their models may be evicted, their downloads stop
        unless another visitor waits for them."""
        with self.lock:
            self.holds.pop(visitor, None)
            for job in self.jobs.values():
                job.waiting.discard(visitor)
                if job.running and not job.waiting:
                    job.cancel.set()

    def held(self, repo_dir: Path) -> bool:
        since = time.monotonic() - self.hold_seconds
        return any(p.is_relative_to(repo_dir) and t > since
                   for ps in self.holds.values() for p, t in ps.items())

    def make_room(self, nbytes: int, keep: str = "") -> None:
        """Evict least recently used models nobody holds until ``nbytes`` more fit under the cap;
        ModelLoadError when they cannot."""
        cap = self.limits.cache_bytes
        if cap is None:
            return
        with self.lock:
            try:
                repos = [p for p in self.root.iterdir() if p.is_dir() and "--" in p.name]
            except OSError:
                repos = []
            sizes = {p: folder_bytes(p) for p in repos}
            busy = {self.repo_dir(r) for r, j in self.jobs.items() if j.running}
            busy.add(self.repo_dir(keep))
            used = evict_lru(sizes, sum(sizes.values()), nbytes, cap, oldest_first=self.used,
                             keep=lambda repo: repo in busy or self.held(repo))
            if used + nbytes > cap:
                raise ModelLoadError(
                    f"the server's model cache ({gb_text(cap)}, LAYERSWAP_MAX_HUB_CACHE_GB) is full "
                    "of models in use; try again later")

    # ---- fetching
    def fetch(self, repo_id: str, visitor: str, wait: float = 2.0) -> Path:
        """The model's folder when it is here (held for ``visitor``); else the download starts
        (or goes on) in the background and ``Pending`` says how far it is. A download that ends
        within ``wait`` seconds (a small model, a refusal) is answered at once."""
        try:
            return self._fetch(repo_id, visitor)
        except Pending:
            if wait <= 0:
                raise
            job = self.wait(repo_id, wait)
            if job is not None and job.state == "cancelled":
                raise
            return self._fetch(repo_id, visitor)

    def _fetch(self, repo_id: str, visitor: str) -> Path:
        with self.lock:
            job = self.jobs.get(repo_id)
            if job is not None and not job.running:
                self.jobs.pop(repo_id)
                if job.state == "failed":
                    raise ModelLoadError(f"{repo_id}: {job.error}")
            path = self.cached(repo_id)
            if path is not None:
                self.touch(repo_id)
                self.hold(visitor, path)
                return path
            if job is not None and job.state == "cancelled":
                job = None
            if job is None:
                if is_offline():
                    raise ModelLoadError(
                        f"{repo_id!r} looks like a Hugging Face Hub id, but the Hub is offline "
                        "on this server (HF_HUB_OFFLINE=1) and the model is not here")
                running = sum(j.running for j in self.jobs.values())
                if running >= self.limits.jobs:
                    raise ModelLoadError(f"{running} downloads are running on this server; "
                                         "try again in a few minutes")
                job = self.start(repo_id)
            job.waiting.add(visitor)
            raise Pending(job.line())

    def start(self, repo_id: str) -> Download:
        job = self.jobs[repo_id] = Download(repo_id)
        job.thread = threading.Thread(target=self._run, args=(job,), daemon=True,
                                      name=f"layerswap-download-{repo_id}")
        job.thread.start()
        return job

    def status(self, visitor: str) -> list[Download]:
        with self.lock:
            return [j for j in self.jobs.values() if visitor in j.waiting]

    def cancel(self, visitor: str) -> list[str]:
        """Stop waiting for the visitor's downloads; a download nobody waits for stops at its
        next chunk (or its read timeout). Returns the repositories."""
        with self.lock:
            names = []
            for job in self.jobs.values():
                if visitor in job.waiting and job.running:
                    job.waiting.discard(visitor)
                    names.append(job.repo_id)
                    if not job.waiting:
                        job.cancel.set()
                        job.state = "cancelled"
            return names

    def wait(self, repo_id: str, seconds: float) -> Download | None:
        """The job after it ended or ``seconds`` passed (for scripts and tests)."""
        job = self.jobs.get(repo_id)
        if job is not None and job.thread is not None:
            job.thread.join(seconds)
        return job

    # ---- the download itself (in its thread)
    def _run(self, job: Download) -> None:
        from huggingface_hub import constants
        try:
            with same_host(self.endpoint or constants.ENDPOINT):
                job.path = self._download(job)
            job.state = "done"
        except _Stop:
            job.state = "cancelled"
        except Exception as e:  # noqa: BLE001 - every failure becomes a sentence
            job.error, job.state = hub_error_words(e, self.limits.timeout), "failed"

    def _download(self, job: Download) -> Path:
        from huggingface_hub import HfApi, constants

        endpoint = self.endpoint or constants.ENDPOINT
        timeout = self.limits.timeout
        # token=False: never the server's token (it could read the owner's private models)
        info = HfApi(endpoint=endpoint, token=False).model_info(
            job.repo_id, files_metadata=True, timeout=timeout)
        if getattr(info, "gated", False) or getattr(info, "private", False):
            raise ModelLoadError("this model is gated or private: not downloaded on this server")
        files = {s.rfilename: s for s in info.siblings or ()
                 if any(fnmatch.fnmatch(s.rfilename, p) for p in PATTERNS)}
        if not any(n.endswith(".safetensors") for n in files):
            raise ModelLoadError("the repository has no safetensors weights")
        check_file_names(files)
        if any(s.size is None for s in files.values()):
            raise ModelLoadError("the Hub does not list the size of every file: not downloaded")
        if any(_checksum(s) is None for s in files.values()):
            raise ModelLoadError("the Hub does not list the checksum of every file: not downloaded")
        total = sum(s.size for s in files.values())
        refusal = too_big(total, self.limits.max_download)
        if refusal:
            raise ModelLoadError(refusal)
        self.root.mkdir(parents=True, exist_ok=True)
        check_free_space(self.root, total, f"downloading {job.repo_id}",
                         shown="the server's cache")
        self.make_room(total, keep=job.repo_id)
        job.total, job.state = total, "downloading"
        job.deadline = time.monotonic() + DOWNLOAD_SLACK_SECONDS + total / DOWNLOAD_MIN_RATE
        # huggingface_hub reads these two per call: a silent Hub within the timeout, Cancel
        # within a chunk (its default, 10 MB, is a long wait on a slow link)
        constants.HF_HUB_DOWNLOAD_TIMEOUT = timeout
        constants.DOWNLOAD_CHUNK_SIZE = min(constants.DOWNLOAD_CHUNK_SIZE, CHUNK_BYTES)
        sha = info.sha or ""
        if not _COMMIT.fullmatch(sha):   # it names a folder here: never '..' or a path
            raise ModelLoadError("the Hub listed a commit id that is not one: refused")
        partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=self.root))
        stop = threading.Event()     # a file failed: the checksums still running stop too
        try:
            # each file's checksum is computed while the next one downloads
            with ThreadPoolExecutor(1, thread_name_prefix="layerswap-checksum") as pool:
                try:
                    checks = []
                    for sibling in files.values():
                        if job.cancel.is_set():
                            raise _Stop()
                        path = self._fetch_file(job, endpoint, sha, sibling, partial)
                        for check in checks:            # a mismatch stops at once
                            if check.done():
                                check.result()
                        checks.append(pool.submit(_verify, path, sibling, job.cancel, stop))
                    for check in checks:
                        check.result()
                except BaseException:
                    stop.set()
                    raise
            shutil.rmtree(partial / ".cache", ignore_errors=True)   # huggingface_hub's notes
            _readable(partial)    # files that match their checksums may still be no model
            final = self.repo_dir(job.repo_id) / sha
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                partial.rename(final)
            except OSError:
                if not final.is_dir():
                    raise
            self.touch(job.repo_id)
            return final
        finally:
            shutil.rmtree(partial, ignore_errors=True)

    def _fetch_file(self, job: Download, endpoint: str, revision: str, sibling,
                    folder: Path) -> Path:
        """One file through ``hf_hub_download`` (its retries resume with a Range request) into
        ``folder``, counted into the job and stopped at Cancel or past its listed size by the
        progress bar it is given (``_Watch``); its size checked against the listing."""
        from huggingface_hub import hf_hub_download

        size, before = sibling.size, job.done
        try:
            path = Path(hf_hub_download(
                job.repo_id, sibling.rfilename, revision=revision, local_dir=folder,
                endpoint=endpoint, token=False, etag_timeout=self.limits.timeout,
                force_download=True, tqdm_class=_Watch.of(job, size)))
        except OSError as e:
            if "Consistency check failed" in str(e):    # huggingface_hub: a short body
                raise ModelLoadError("the Hub sent less than the size it listed: stopped") from e
            raise
        job.done = before + size
        if path.stat().st_size != size:
            raise ModelLoadError("the Hub sent another size than it listed: stopped")
        return path


_COMMIT = re.compile(r"[0-9a-f]{40}")    # a git commit id, as the Hub lists it


def _readable(folder: Path) -> None:
    """ModelLoadError (in words, no path) unless ``folder`` reads as a model: its config, every
    weight file's header, an index naming only files of the folder (``CheckpointReader``)."""
    try:
        check_folder(folder)
        CheckpointReader(folder).close()
    except Exception as e:  # noqa: BLE001 - whatever it is, the download is not kept
        why = " ".join(str(e).replace(str(folder), "").split()).lstrip("/: ")
        raise ModelLoadError(f"the downloaded files cannot be read as a model ({why[:200]}): "
                             "not kept") from e


def _checksum(sibling) -> str | None:
    """What the listing says a file hashes to: the sha256 of an LFS file, else its git blob id."""
    lfs = getattr(sibling, "lfs", None)
    if lfs:
        return lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)
    return getattr(sibling, "blob_id", None)


def _verify(path: Path, sibling, *stops: threading.Event) -> None:
    """ModelLoadError unless ``path`` hashes to what the listing says (``_checksum``: sha256,
    or git's ``blob <size>\\0`` sha1); ``_Stop`` once one of ``stops`` is set."""
    import hashlib

    if getattr(sibling, "lfs", None):
        h = hashlib.sha256()
    else:
        h = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            if any(e.is_set() for e in stops):
                raise _Stop()
            h.update(block)
    if h.hexdigest() != _checksum(sibling):
        raise ModelLoadError(
            f"{sibling.rfilename} does not match the checksum the Hub listed: refused")


class _Watch:
    """The progress bar ``hf_hub_download`` is given: counts the bytes into the job; stops the
    download at Cancel or once past the file's listed size (huggingface_hub removes its
    partial file on the way out)."""

    job: Download
    size: int

    @classmethod
    def of(cls, job: Download, size: int) -> type[_Watch]:
        """The class for one file (a class: huggingface_hub looks for ``update_transfer`` on
        it, and then gives one bar both the bytes written and those received)."""
        return type("Watch", (cls,), {"job": job, "size": size})

    def __init__(self, total: int | None = None, **_):
        self.total, self.n = total, 0
        if total is not None and total > self.size:
            raise ModelLoadError("the Hub announced more than the size it listed: stopped")

    def update(self, n: int | float | None = 1) -> None:
        n = int(n or 0)
        self.n += n
        self.job.done += n
        self.update_transfer()
        if self.n > self.size:
            raise ModelLoadError("the Hub sent more than the size it listed: stopped")

    def update_transfer(self, n: int | float | None = 1) -> None:
        if self.job.cancel.is_set():
            raise _Stop()
        if time.monotonic() > self.job.deadline:
            raise ModelLoadError(
                f"the download ran past {self.job.deadline - self.job.started:.0f} s (the Hub "
                f"sent under {DOWNLOAD_MIN_RATE / 10 ** 6:g} MB/s on average): stopped")

    def __enter__(self) -> _Watch:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __getattr__(self, name: str):
        return lambda *a, **k: None        # set_postfix_str, close, refresh...


class _Stop(Exception):
    """Cancelled between two chunks."""


# --------------------------------------------------------------------------- the served cache
_SERVED: dict[str, HubCache] = {}


def served_cache() -> HubCache:
    """The process's served cache (``<layerswap cache>/hub``, limits from the environment)."""
    if "cache" not in _SERVED:
        _SERVED["cache"] = HubCache(cache_dir() / "hub", HubLimits.from_env(served=True))
    return _SERVED["cache"]


def served_cache_if_open() -> HubCache | None:
    """The process's served cache if one was opened (nothing is created): what a message about
    it must hide (``workbench.served.hide_paths``)."""
    return _SERVED.get("cache")


def set_served_cache(cache: HubCache | None) -> HubCache | None:
    """Replace the process's served cache (a server with its own limits; tests); returns the
    previous one."""
    before = _SERVED.pop("cache", None)
    if cache is not None:
        _SERVED["cache"] = cache
    return before


def served_fetch(repo_id: str, visitor: str, progress: Progress | None = None) -> Path:
    """``HubCache.fetch`` on the served cache."""
    path = served_cache().fetch(repo_id, visitor)
    say(progress, 1.0, f"{repo_id} is here")
    return path
