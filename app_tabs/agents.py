"""The agent tools (``workbench.agents``) as API endpoints of the page, which
``launch(mcp_server=True)`` serves as MCP tools; the page's own endpoints left off that list."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import warnings

import anyio

import gradio as gr

from app_tabs.common import client_address
from layerswap_core.workbench import saves
from layerswap_core.workbench.agents import CLIENT, AgentTools
from layerswap_core.workbench.served import LIMITS, Access, readable_error

AGENT_TOOLS = tuple(tool.__name__ for tool in AgentTools().tools())
AGENT_STATUS = ("job_status", "cancel_job", "close_session")   # answered at once, never queued
# tools that do no model work (no tensor read, no download, no engine): answered at once, never
# queued behind the page's heavy slots (their inputs are capped and bounded before parsing)
AGENT_INSTANT = (*AGENT_STATUS, "layer_plan")


def add_agent_tools(demo: gr.Blocks, access: Access) -> AgentTools:
    """The agent tools as API endpoints: the instant ones outside the queue, the others in the
    page's heavy slots (``demo.agent_tools``: the ``AgentTools`` behind them)."""
    tools = demo.agent_tools = AgentTools(access)
    for tool in tools.tools():
        name = tool.__name__
        slots = ({"queue": False} if name in AGENT_INSTANT
                 else {"concurrency_id": "heavy", "concurrency_limit": LIMITS.jobs})
        gr.api(one_line_errors(tool), api_name=name, **slots)
    return tools


def agent_tools_only(demo: gr.Blocks) -> None:
    """Only the agent tools on the MCP tool list: the page's own endpoints take its session
    state, which an MCP call cannot carry (they stay in the API), and gradio's own (the sign-in
    button's) are no tools either."""
    for fn in demo.fns.values():
        if fn.api_name and fn.api_name not in AGENT_TOOLS and fn.fn is not None:
            getattr(fn.fn, "__func__", fn.fn)._mcp_type = "page"   # gradio lists only "tool"s
    # gradio warns of every endpoint with a gr.State input, listed or not: here, only the page's
    warnings.filterwarnings("ignore", "This MCP server includes a tool that has a gr.State")


def one_line_errors(fn):
    """``fn`` with its errors as one readable line for the API and MCP caller, run as its
    client (``agents.CLIENT``: the request's address, ``common.client_address``)."""
    sig = inspect.signature(fn)
    # gradio fills a positional parameter annotated gr.Request (and leaves it out of the API
    # and the MCP schema)
    sig = sig.replace(parameters=[
        *sig.parameters.values(),
        inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                          annotation=gr.Request)])

    @functools.wraps(fn)
    def tool(*args, **kw):
        given = sig.bind(*args, **kw).arguments
        token = CLIENT.set(saves.person(None, client_address(given.pop("request", None))))
        try:
            return fn(**given)
        except Exception as e:  # noqa: BLE001 - every error reaches the agent as one line
            raise gr.Error(readable_error(e), print_exception=False) from None
        finally:
            CLIENT.reset(token)
    tool.__signature__ = sig
    tool.__annotations__ = {**fn.__annotations__, "request": gr.Request}
    return tool


def cancel_on_disconnect(demo: gr.Blocks):
    """A lifespan for ``demo.launch(app_kwargs={"lifespan": ...})``: once gradio has made its MCP
    server, a tool call whose MCP request ends before its answer (the client disconnected or
    cancelled it) cancels its session's job (``AgentTools.cancel_job``: Cancel, the downloads).

    Gradio gives its tools no such signal: its ``call_tool`` (``gradio/mcp.py``) runs a queued
    tool through its own loopback client and waits for ``job.result`` in a thread, so the tool
    runs on whatever happens to the request. The ``mcp`` package does signal it: its stateless
    streamable-HTTP transport is terminated when the request ends
    (``StreamableHTTPSessionManager._handle_stateless_request``), as an SSE connection's end ends
    its ``Server.run``, and ``Server.run`` then cancels its in-flight handlers (a client's
    ``notifications/cancelled`` cancels the one request). This wraps the server's handler of
    ``tools/call`` to pass that cancellation on to the session the call named."""
    @contextlib.asynccontextmanager
    async def lifespan(app):
        server = getattr(demo, "mcp_server_obj", None)
        tools = getattr(demo, "agent_tools", None)
        if server is not None and tools is not None:
            watch_calls(server.mcp_server, tools, getattr(server, "tool_prefix", ""))
        yield
    return lifespan


def watch_calls(mcp_server, tools: AgentTools, prefix: str = "") -> None:
    """Wrap ``mcp_server``'s ``tools/call`` handler (``cancel_on_disconnect``); once only."""
    from mcp import types

    handler = mcp_server.request_handlers.get(types.CallToolRequest)
    if handler is None or getattr(handler, "_cancels_agent_jobs", False):
        return

    async def call_tool(req):
        # gradio waits for a queued tool's result in a worker thread (anyio's run_sync, which
        # defers a cancellation until the thread returns): the call runs as a task of its own,
        # so that the request's end reaches this wrapper at once
        call = asyncio.ensure_future(handler(req))
        call.add_done_callback(lambda t: t.cancelled() or t.exception())   # never unread
        try:
            return await asyncio.shield(call)
        except anyio.get_cancelled_exc_class():
            name = req.params.name.removeprefix(prefix)
            session = (req.params.arguments or {}).get("session")
            if name not in AGENT_INSTANT and isinstance(session, str) and session:
                with contextlib.suppress(Exception):   # an unknown or closed session: nothing
                    tools.cancel_job(session)
            call.cancel()
            raise
    call_tool._cancels_agent_jobs = True
    mcp_server.request_handlers[types.CallToolRequest] = call_tool
