"""A small MCP server for the tests, built on the official MCP Python SDK (`mcp`, pinned in
requirements.txt): Streamable HTTP on 127.0.0.1:PORT/mcp, or stdio. Every tool call it receives is
appended to the calls file (one JSON object per line: tool, arguments, the idempotency key the
client sent in `_meta`, the Authorization and X-Team headers it came with), so a test counts
effects from the server's side, not from the pipeline's.

    python server.py --port 8931 --calls /tmp/calls.jsonl
    python server.py --port-file /tmp/port --calls /tmp/calls.jsonl   # a free port, written there
    python server.py --stdio --calls /tmp/calls.jsonl
"""

import argparse
import asyncio
import json
import os

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, default=0)
# The server binds a free port itself and writes its number here once it listens: a port a test
# picked and released first could be taken by another test's server meanwhile.
parser.add_argument("--port-file")
parser.add_argument("--stdio", action="store_true")
parser.add_argument("--calls", required=True)
args = parser.parse_args()

server = MCPServer("aptix-test-tickets")


def record(tool: str, arguments: dict, ctx: Context) -> int:
    """Appends the call and returns how many calls of `tool` the server has received."""
    rc = ctx.request_context
    meta = dict(rc.meta or {})
    request = getattr(rc, "request", None)
    headers = getattr(request, "headers", None) or {}
    line = {
        "tool": tool,
        "arguments": arguments,
        "idempotency_key": meta.get("aptix/idempotency_key"),
        "authorization": headers.get("authorization"),
        "team": headers.get("x-team"),
    }
    with open(args.calls, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
        f.flush()
        os.fsync(f.fileno())
    with open(args.calls, encoding="utf-8") as f:
        return sum(1 for l in f if json.loads(l)["tool"] == tool)


@server.tool()
async def open_ticket(title: str, ctx: Context, delay_seconds: float = 0.0) -> str:
    """Opens a ticket (a side effect: each call opens one). Returns its number."""
    n = record("open_ticket", {"title": title, "delay_seconds": delay_seconds}, ctx)
    await asyncio.sleep(delay_seconds)
    return json.dumps({"ticket": n, "title": title})


@server.tool()
async def search_tickets(query: str, ctx: Context) -> str:
    """Finds tickets by words of their title (reads only)."""
    record("search_tickets", {"query": query}, ctx)
    return json.dumps({"matches": [f"ticket about {query}"]})


@server.tool()
async def environment(ctx: Context) -> str:
    """The names of the variables in this server's environment."""
    record("environment", {}, ctx)
    return json.dumps(sorted(os.environ))


@server.tool()
async def hang(ctx: Context) -> str:
    """Never answers."""
    record("hang", {}, ctx)
    await asyncio.sleep(3600)
    return "late"


@server.tool()
async def broken(ctx: Context) -> str:
    """Always fails."""
    record("broken", {}, ctx)
    raise ToolError("the ticket database is read-only today")


@server.tool()
async def huge(megabytes: int, ctx: Context) -> str:
    """Returns `megabytes` MB of text."""
    record("huge", {"megabytes": megabytes}, ctx)
    return "x" * (megabytes * 1024 * 1024)




def serve_on_a_free_port(port_file: str) -> None:
    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    # Written whole, then renamed: the reader never sees half a number.
    with open(port_file + ".tmp", "w") as f:
        f.write(str(sock.getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)
    app = server.streamable_http_app(host="127.0.0.1")
    config = uvicorn.Config(app, log_level="warning")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if args.stdio:
    server.run("stdio")
elif args.port_file:
    serve_on_a_free_port(args.port_file)
else:
    server.run("streamable-http", host="127.0.0.1", port=args.port)
