"""The app launches as on a Hugging Face Space with "Sign in with Hugging Face" (hf_oauth: true
in the README's front matter, tests/test_space.py): gradio[oauth]'s login routes and session
cookie, and the MCP server with the agent tools named after the Space (in a child process:
gradio reads the Space's variables when it is imported)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
