"""The repository is a Hugging Face Space as it stands: the README's front matter makes it a
Gradio Space with "Sign in with Hugging Face" (push scope), requirements.txt installs the gradio
extras that sign-in and the MCP server need, and the app launches as on such a Space (OAuth
routes, the session cookie, the agent tools named after the Space)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def front_matter() -> dict:
    text = (ROOT / "README.md").read_text()
    match = re.match(r"---\n(.*?)\n---\n", text, re.S)
    assert match, "README.md does not start with a YAML front matter block"
    return yaml.safe_load(match.group(1))


def requirements() -> dict[str, Requirement]:
    reqs = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            reqs[req.name.lower()] = req
    return reqs


def test_the_front_matter_makes_a_gradio_space_with_sign_in():
    meta = front_matter()
    gradio = requirements()["gradio"]
    assert meta["sdk"] == "gradio"
    assert str(gradio.specifier) == f"=={meta['sdk_version']}" == f"=={metadata.version('gradio')}"
    assert (ROOT / meta["app_file"]).is_file()
    assert meta["hf_oauth"] is True
    assert "write-repos" in meta["hf_oauth_scopes"]     # a signed-in visitor may push


def test_the_gradio_extras_are_required_and_installed():
    reqs = requirements()
    assert {"mcp", "oauth"} <= reqs["gradio"].extras
    # every requirement of those extras, installed at a version gradio accepts
    for line in metadata.requires("gradio"):
        req = Requirement(line)
        extras = [e for e in ("mcp", "oauth") if req.marker and req.marker.evaluate({"extra": e})]
        if extras:
            assert metadata.version(req.name) in req.specifier, (line, metadata.version(req.name))
    for name in ("mcp", "pydantic", "authlib", "itsdangerous"):   # pinned, as installed
        assert str(reqs[name].specifier) == f"=={metadata.version(name)}", name
    # what gradio imports for each
    from authlib.integrations.starlette_client import OAuth  # noqa: F401
    from gradio.mcp import GradioMCPServer  # noqa: F401
    from starlette.middleware.sessions import SessionMiddleware  # noqa: F401


LAUNCH = """
import json, os, socket, urllib.request
import app
demo = app.build_demo()
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                    quiet=True, mcp_server=True)
schema = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/gradio_api/mcp/schema"))
print(json.dumps({
    "routes": [getattr(r, "path", "") for r in demo.app.routes],
    "middleware": [m.cls.__name__ for m in demo.app.user_middleware],
    "tools": sorted(t["name"] for t in schema if t["meta"]["mcp_type"] == "tool"),
    "mcp_error": demo.mcp_error}), flush=True)
demo.close()
os._exit(0)
"""


def test_the_app_launches_as_on_a_space_with_sign_in_and_mcp():
    # what a Space with hf_oauth: true sets (gradio reads it when it is imported)
    env = {**os.environ, "SYSTEM": "spaces", "SPACE_ID": "someone/layerswap",
           "OAUTH_CLIENT_ID": "id", "OAUTH_CLIENT_SECRET": "secret",
           "OAUTH_SCOPES": "openid profile write-repos",
           "OPENID_PROVIDER_URL": "https://huggingface.co", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", LAUNCH], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(next(line for line in run.stdout.splitlines() if line.startswith("{")))
    assert {"/login/huggingface", "/login/callback", "/logout"} <= set(out["routes"])
    assert "SessionMiddleware" in out["middleware"]          # gradio[oauth]: itsdangerous
    assert out["mcp_error"] is None
    assert out["tools"] == sorted(f"layerswap_{t}" for t in (
        "check_models", "delta_summary", "suggest_configuration", "layer_plan", "build_and_save",
        "quick_evaluate", "job_status", "cancel_job", "close_session"))
