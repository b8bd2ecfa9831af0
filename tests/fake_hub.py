"""The one fake Hugging Face Hub on loopback, for every test (and bench script) that reads from or
pushes to the Hub: the pre-flight's, the served downloads', the push's, the hostile repositories
of issue 64 and the agents' gate.

``FakeHub`` (stdlib http.server in a thread on 127.0.0.1) answers the calls huggingface_hub makes
as the Hub does: model info (``/api/models/<repo>``: the files with their sizes, the sha256 of an
LFS file (``*.safetensors``) and the git blob id of any other, the commit, gated, the licence),
file resolves (``/<repo>/resolve/<rev>/<file>``: the commit, the etag (``X-Linked-*`` for an LFS
file), ``Range: bytes=a-b`` or ``bytes=a-`` answered 206), and, with ``push_token``, a push
(repo creation, preupload, commit; every call needs that token). It counts what it sends per
repository (``sent``), and keeps every request (``requests``: method, path, authorization) and
every file GET (``ranges``: repo, file, Range header or None).

A repository is a folder (its files as they are) or ``{name: bytes}`` (a hostile one made in
memory: one bytes object may stand for several files). What a repository does to its weights
(``model.safetensors``), by name: ``slow`` sends them slowly, ``corrupt`` with one byte changed,
``short`` without their last kilobyte, ``liar`` lists them a byte larger than it sends,
``flaky`` breaks the connection off while ``cuts`` says so (after half of what was asked; with
"nothing", before the first byte); ``huge`` lists its weights at 40 GiB and resolves no file;
``hang`` holds every request open, saying nothing. ``redirects`` sends a repository's file
resolves elsewhere (``{repo: URL prefix}``: a 302 to ``<prefix>/<file>``, with the etag and size
the Hub sends with its own redirects), e.g. to another ``FakeHub`` on another port; ``shas``
lists another commit id for a repository; ``fake/gated`` is listed as gated.

``pointed_at`` points huggingface_hub (and a child process started meanwhile) at it, online, for
the duration.
"""
from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from huggingface_hub.utils.sha import git_hash

SHA = "0123456789abcdef0123456789abcdef01234567"
WEIGHTS = "model.safetensors"   # the file the behaviours below change


def is_lfs(name: str) -> bool:
    return name.endswith(".safetensors")


class FakeHub:
    """A fake Hub serving ``{repo: folder or {name: bytes}}`` (module docstring)."""

    def __init__(self, repos: dict[str, Path | dict[str, bytes]], *, slow: Iterable[str] = (),
                 corrupt: Iterable[str] = (), short: Iterable[str] = (),
                 liar: Iterable[str] = (), flaky: Iterable[str] = (), huge: Iterable[str] = (),
                 hang: Iterable[str] = (), push_token: str | None = None):
        self.repos = {r: dict(f) if isinstance(f, dict) else
                      {p.name: p.read_bytes() for p in sorted(Path(f).iterdir()) if p.is_file()}
                      for r, f in repos.items()}
        self.slow, self.corrupt, self.short = set(slow), set(corrupt), set(short)
        self.liar, self.flaky, self.huge, self.hang = set(liar), set(flaky), set(huge), set(hang)
        self.push_token = push_token
        self.sent: dict[str, int] = {}
        self.requests: list[tuple[str, str, str | None]] = []   # method, path, authorization
        self.ranges: list[tuple[str, str, str | None]] = []     # a file GET: repo, file, Range
        self.pushed: dict[str, dict[str, bytes]] = {}           # repo -> {path: bytes}
        self.cuts: list[str] = []         # how the flaky repos' next GETs of the weights break off
        self.redirects: dict[str, str] = {}                     # repo -> where its files are
        self.shas: dict[str, str] = {}                          # repo -> another commit id
        self.stop = threading.Event()
        self.lock = threading.Lock()
        hub_ = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                hub_.handle(self, "GET")

            def do_HEAD(self):   # huggingface_hub's metadata request before a download
                hub_.handle(self, "HEAD")

            def do_POST(self):
                hub_.handle(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()

    def reset(self):
        self.sent.clear()
        self.ranges.clear()

    # ---- what the tests read
    @property
    def auths(self) -> list[str | None]:
        """Every request's authorization header."""
        return [a for _, _, a in self.requests]

    def resolves(self, repo: str) -> list[str]:
        """The paths of ``repo``'s file requests."""
        return [p for _, p, _ in self.requests if p.startswith(f"/{repo}/resolve/")]

    def weight_bytes_fetched(self) -> list[tuple[str, str, str | None]]:
        """File GETs of a weight file that reach past its header (any tensor byte)."""
        out = []
        for repo, name, rng in list(self.ranges):
            if not is_lfs(name):
                continue
            data = self.repos[repo][name]
            header_end = 8 + int.from_bytes(data[:8], "little")
            end = len(data) - 1
            if rng and not rng.endswith("-"):
                end = int(rng.removeprefix("bytes=").split("-")[1])
            if end >= header_end:
                out.append((repo, name, rng))
        return out

    # ---- the Hub's answers
    @staticmethod
    def etag(data: bytes, name: str) -> str:
        """A file's etag as the Hub gives it: the sha256 of an LFS file, else its git blob id."""
        return hashlib.sha256(data).hexdigest() if is_lfs(name) else git_hash(data)

    def listing(self, repo: str) -> dict:
        files = self.repos[repo]
        sizes = {n: len(b) for n, b in files.items()}
        if repo in self.huge:
            sizes = {"config.json": 700, WEIGHTS: 40 * 2 ** 30}
        if repo in self.liar and WEIGHTS in sizes:   # lists one byte more than it sends
            sizes[WEIGHTS] += 1

        def sibling(n: str, size: int) -> dict:
            data = files.get(n)
            if data is None:
                return {"rfilename": n, "size": size, "blobId": "0" * 40}
            if is_lfs(n):   # the blob is the LFS pointer; the listing says the file's sha256
                sha = self.etag(data, n)
                pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\n" \
                          f"size {size}\n".encode()
                return {"rfilename": n, "size": size, "blobId": git_hash(pointer),
                        "lfs": {"sha256": sha, "size": size, "pointerSize": len(pointer)}}
            return {"rfilename": n, "size": size, "blobId": self.etag(data, n)}

        return {"id": repo, "modelId": repo, "sha": self.shas.get(repo, SHA), "private": False,
                "gated": "manual" if repo == "fake/gated" else False,
                "cardData": {"license": "apache-2.0"},
                "siblings": [sibling(n, s) for n, s in sizes.items()]}

    def handle(self, h: BaseHTTPRequestHandler, method: str):
        path = h.path.split("?")[0]
        auth = h.headers.get("authorization")
        with self.lock:
            self.requests.append((method, path, auth))
        body = h.rfile.read(int(h.headers.get("content-length") or 0)) if method == "POST" else b""
        if any(f"/{repo}/" in path or path.endswith(f"/{repo}") for repo in self.hang):
            self.stop.wait(60)                    # holds the request open, says nothing
            return
        if method == "POST":
            return self.push(h, path, auth, body)
        if path.startswith("/api/models/"):
            repo = path[len("/api/models/"):].split("/revision/")[0]
            if repo not in self.repos:
                return self.send_json(h, repo, 404, {"error": "Repository not found"}, method)
            return self.send_json(h, repo, 200, self.listing(repo), method)
        repo, _, rest = path[1:].partition("/resolve/")
        name = rest.split("/", 1)[1] if "/" in rest else ""
        data = self.repos.get(repo, {}).get(name)
        if data is None or repo in self.huge:
            return self.send_json(h, repo, 404, {"error": "Entry not found"}, method)
        return self.send_file(h, method, repo, name, data)

    def send_json(self, h, repo: str, status: int, obj: dict, method: str = "GET"):
        data = json.dumps(obj).encode()
        headers = {"content-type": "application/json"}
        if status == 404:
            headers["x-error-code"] = ("RepoNotFound" if "Repository" in obj.get("error", "")
                                       else "EntryNotFound")
        self.send(h, repo, status, data, headers, head=method == "HEAD")

    def send(self, h, repo: str, status: int, body: bytes, headers: dict | None = None,
             head: bool = False):
        h.send_response(status)
        h.send_header("content-length", str(len(body)))
        h.send_header("x-repo-commit", SHA)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if head:
            return
        try:
            h.wfile.write(body)
        except OSError:
            return
        self.count(repo, len(body))

    def count(self, repo: str, n: int) -> None:
        with self.lock:
            self.sent[repo] = self.sent.get(repo, 0) + n

    def send_file(self, h, method: str, repo: str, name: str, data: bytes):
        """A file as the Hub's resolve answers it: its commit, etag (``X-Linked-*`` for an LFS
        file), size; a Range request answered 206; what its repository does to its weights."""
        etag = self.etag(data, name)
        headers = {"etag": f'"{etag}"', "accept-ranges": "bytes"}
        if is_lfs(name):
            headers.update({"x-linked-etag": f'"{etag}"', "x-linked-size": str(len(data))})
        if repo in self.redirects:
            return self.send(h, repo, 302, b"", {**headers,
                                                 "location": f"{self.redirects[repo]}/{name}"},
                             head=method == "HEAD")
        if method == "HEAD":
            return self.send(h, repo, 200, data, headers, head=True)
        rng = h.headers.get("range")
        with self.lock:
            self.ranges.append((repo, name, rng))
        start, end = 0, len(data) - 1
        if rng:
            a, _, b = rng.removeprefix("bytes=").partition("-")
            start, end = int(a), min(int(b), len(data) - 1) if b else len(data) - 1
        body = data[start:end + 1]
        if name == WEIGHTS and repo in self.corrupt and len(body) > 100:
            body = body[:100] + bytes([body[100] ^ 1]) + body[101:]
        if name == WEIGHTS and repo in self.short:
            body = body[:-1024]
        h.send_response(206 if rng else 200)
        h.send_header("content-length", str(len(body)))
        if rng:
            h.send_header("content-range", f"bytes {start}-{end}/{len(data)}")
        h.send_header("x-repo-commit", SHA)
        for k, v in headers.items():
            h.send_header(k, v)
        h.end_headers()
        cut = None
        if repo in self.flaky and name == WEIGHTS and self.cuts:
            cut = 0 if self.cuts.pop(0) == "nothing" else len(body) // 2
        slow = repo in self.slow and name == WEIGHTS
        step = 16384 if slow else max(1, len(body))
        try:
            if cut is not None:
                h.wfile.write(body[:cut])
                h.wfile.flush()
                self.count(repo, cut)
                h.close_connection = True
                h.connection.shutdown(socket.SHUT_RDWR)
                return
            for i in range(0, len(body), step):
                if self.stop.is_set():
                    return
                h.wfile.write(body[i:i + step])
                self.count(repo, len(body[i:i + step]))
                if slow:
                    time.sleep(0.02)
        except OSError:
            pass

    def push(self, h, path: str, auth: str | None, body: bytes):
        """A push: repo creation, the model card's front matter, preupload and commit, each
        refused without ``push_token``."""
        if self.push_token is None or auth != f"Bearer {self.push_token}":
            return self.send_json(h, "", 401, {"error": "Invalid credentials"})
        if path == "/api/validate-yaml":            # the model card's front matter
            return self.send_json(h, "", 200, {"errors": [], "warnings": []})
        if path == "/api/repos/create":
            spec = json.loads(body)
            repo = f"{spec.get('organization') or 'alice'}/{spec['name']}"
            self.pushed.setdefault(repo, {})
            return self.send_json(h, repo, 200, {"url": f"{self.url}/{repo}", "name": repo})
        if "/preupload/" in path:
            files = json.loads(body)["files"]
            return self.send_json(h, "", 200, {"files": [
                {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                for f in files]})
        if "/commit/" in path:
            repo = path[len("/api/models/"):].split("/commit/")[0]
            for line in body.decode().splitlines():
                op = json.loads(line)
                if op["key"] == "file":
                    self.pushed.setdefault(repo, {})[op["value"]["path"]] = \
                        base64.b64decode(op["value"]["content"])
            return self.send_json(h, repo, 200, {"commitUrl": f"{self.url}/{repo}/commit/{SHA}",
                                                 "commitOid": SHA, "success": True})
        return self.send_json(h, "", 404, {"error": "not here"})


@contextlib.contextmanager
def pointed_at(fh: FakeHub):
    """huggingface_hub (and a child process started meanwhile: HF_ENDPOINT) pointed at ``fh``,
    online; ``fh`` closed afterwards."""
    from huggingface_hub import constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "0")
        mp.setattr(constants, "HF_HUB_OFFLINE", False)
        mp.setattr(constants, "ENDPOINT", fh.url)
        # the resolve URLs' template is made from HF_ENDPOINT when huggingface_hub is
        # imported: pointed at the fake Hub too, as HF_ENDPOINT set before would have
        mp.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE",
                   fh.url + "/{repo_id}/resolve/{revision}/{filename}")
        mp.setenv("HF_ENDPOINT", fh.url)
        try:
            yield fh
        finally:
            fh.close()
