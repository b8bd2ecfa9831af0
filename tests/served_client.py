"""Shared by the served-mode tests: launch a built page on a free loopback port, and drive it
as one visitor (one gradio_client session) would."""
from __future__ import annotations

import itertools
import socket


def launch(demo) -> str:
    """Start ``demo`` on a free 127.0.0.1 port (in this process); its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                        quiet=True)
    return f"http://127.0.0.1:{port}/"


_ADDRESSES = itertools.count(1)


def visitor(served, address: str | None = None):
    """A new visitor (a new page session) of the served app, from its own client address
    (``address``, else a new one: sent as X-Forwarded-For, as the Space's proxy does, so that
    each scripted visitor is a person of their own)."""
    from gradio_client import Client
    n = next(_ADDRESSES)
    address = address or f"198.18.{n // 250}.{n % 250 + 1}"
    return Client(served.url, verbose=False, headers={"x-forwarded-for": address})


def pick(client, base, task, lang) -> dict:
    """The Models tab's pick, its outputs by name."""
    import app

    names = [n for n in app.OUTPUTS["pick_models"] if n not in app.NOT_IN_API]
    return dict(zip(names, client.predict(base, task, lang, api_name="/pick_models")))


def download(client, base, task, lang) -> dict:
    """The Models tab's "Download and use" (the pick, its Hub models downloaded)."""
    import app

    names = [n for n in app.OUTPUTS["pick_models"] if n not in app.NOT_IN_API]
    return dict(zip(names, client.predict(base, task, lang, api_name="/download_models")))
