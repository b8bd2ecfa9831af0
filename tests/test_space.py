"""The repository is a Hugging Face Space as it stands: the README's front matter makes it a
Gradio Space with "Sign in with Hugging Face" (push scope), requirements.txt installs the gradio
extras that sign-in and the MCP server need, and the app launches as on such a Space (OAuth
routes, the session cookie, the agent tools named after the Space: tests/test_space_launch.py)."""
from __future__ import annotations

import re
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
