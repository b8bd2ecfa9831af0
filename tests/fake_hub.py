"""A fake Hugging Face Hub on loopback for the tests that read from the Hub (shared: one fake
Hub for the pre-flight's tests and the hostile repositories of issue 64).

``CountingHub`` (stdlib http.server in a thread on 127.0.0.1) answers model info with file sizes
and blob ids (``/api/models/<repo>``) and file resolves with HTTP ranges
(``/<repo>/resolve/<rev>/<file>``, ``Range: bytes=a-b`` answered 206), counting what it sends.
A repository is a folder (its files as they are) or ``{name: bytes}`` (a hostile one made in
memory: one bytes object may stand for several files). ``pointed_at`` points huggingface_hub
at it for the duration. ``redirects`` sends a repository's file resolves elsewhere (``{repo:
URL prefix}``: a 302 to ``<prefix>/<file>``, with the etag and size the Hub sends with its own
redirects), e.g. to another ``CountingHub`` on another port; ``shas`` lists another commit
id for a repository.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from huggingface_hub.utils.sha import git_hash

SHA = "0123456789abcdef0123456789abcdef01234567"


class CountingHub:
    """A fake Hub serving ``{repo: folder}``, counting the bytes it sends per repository."""

    def __init__(self, repos: dict[str, Path | dict[str, bytes]]):
        self.repos = {r: dict(f) if isinstance(f, dict) else
                      {p.name: p.read_bytes() for p in sorted(Path(f).iterdir()) if p.is_file()}
                      for r, f in repos.items()}
        self.sent: dict[str, int] = {}
        self.ranges: list[tuple[str, str, str | None]] = []   # repo, file, Range header
        self.auths: list[str | None] = []                      # every request's authorization
        self.redirects: dict[str, str] = {}                    # repo -> where its files are
        self.shas: dict[str, str] = {}                         # repo -> another commit id
        self.lock = threading.Lock()
        hub_ = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                hub_.handle(self)

            def do_HEAD(self):   # huggingface_hub's metadata request before a download
                hub_.handle(self, head=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def reset(self):
        self.sent.clear()
        self.ranges.clear()

    def handle(self, h, head: bool = False):
        path = h.path.split("?")[0]
        self.auths.append(h.headers.get("authorization"))
        if path.startswith("/api/models/"):
            repo = path[len("/api/models/"):].split("/revision/")[0]
            files = self.repos.get(repo)
            if files is None:
                return self.send(h, repo, 404, json.dumps({"error": "Repository not found"}).encode())
            listing = {"id": repo, "modelId": repo, "sha": self.shas.get(repo, SHA),
                       "private": False,
                       "gated": "manual" if repo == "fake/gated" else False,
                       "cardData": {"license": "apache-2.0"},
                       "siblings": [{"rfilename": n, "size": len(b),
                                     "blobId": git_hash(b)}
                                    for n, b in files.items()]}
            return self.send(h, repo, 200, json.dumps(listing).encode())
        repo, _, rest = path[1:].partition("/resolve/")
        name = rest.split("/", 1)[1] if "/" in rest else ""
        data = self.repos.get(repo, {}).get(name)
        if data is None:
            return self.send(h, repo, 404, json.dumps({"error": "Entry not found"}).encode())
        etag = {"etag": f'"{hashlib.sha256(data).hexdigest()}"'}
        if repo in self.redirects:
            return self.send(h, repo, 302, b"", {**etag, "x-linked-size": str(len(data)),
                                                 "location": f"{self.redirects[repo]}/{name}"},
                             head=head)
        if head:
            return self.send(h, repo, 200, data, etag, head=True)
        rng = h.headers.get("range")
        with self.lock:
            self.ranges.append((repo, name, rng))
        if rng:
            a, b = (int(x) for x in rng.removeprefix("bytes=").split("-"))
            return self.send(h, repo, 206, data[a:b + 1],
                             {"content-range": f"bytes {a}-{min(b, len(data) - 1)}/{len(data)}",
                              **etag})
        return self.send(h, repo, 200, data, etag)

    def send(self, h, repo: str, status: int, body: bytes, headers: dict | None = None,
             head: bool = False):
        h.send_response(status)
        h.send_header("content-length", str(len(body)))
        h.send_header("x-repo-commit", SHA)
        if status == 404:
            h.send_header("x-error-code", "RepoNotFound" if b"Repository" in body
                          else "EntryNotFound")
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.end_headers()
        if head:
            return
        try:
            h.wfile.write(body)
        except OSError:
            pass
        with self.lock:
            self.sent[repo] = self.sent.get(repo, 0) + len(body)


@contextlib.contextmanager
def pointed_at(fh: CountingHub):
    """huggingface_hub (and a child process started meanwhile: HF_ENDPOINT) pointed at ``fh``,
    online."""
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
