"""`drover mcp serve`: a stdio MCP server (the official SDK's MCPServer) with one tool per op (drover/mcp/tools.py).

Every tool call is one op run through drover's async library (drover/api.py AsyncClient: the daemon's connections
when a daemon runs, else a pool of the server's own), so the server holds nothing a restart would lose and serves
calls concurrently.  The answer is the op's document, as structured content and as JSON text; a document with ok
false, a malformed argument or an unknown target is a tool error (isError) whose first line is drover's code, its
message and its hint (`invalid_request: ... (hint: ...)`).  Nothing raised in a tool reaches the client as a
crash, nor stdout as a traceback.

stdout is the protocol's alone: the SDK points fd 1 at stderr while it serves (children inherit that), and the
server points sys.stdout there too, so a stray print or a rich Console anywhere in drover's code lands on stderr.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from pydantic import ValidationError

from drover.errors import DroverError, InvalidRequest
from drover.mcp import caller as callers
from drover.mcp import tools as T
from drover.mcp.wait import WaitCall
from drover.remote import protocol as P

log = logging.getLogger("drover.mcp")
WAIT_CAP_ENV = "DROVER_MCP_WAIT_CAP_S"
WAIT_CAP_S = 50.0  # a tool call answers well inside the clients' 60 s tool timeout (Claude Code, Codex)


def wait_cap(environ: dict[str, str] | None = None) -> float:
    """How long one blocking call may last: DROVER_MCP_WAIT_CAP_S (the tests' short cap), else 50 s; never more."""
    env = os.environ if environ is None else environ
    try:
        value = float(env.get(WAIT_CAP_ENV, "") or WAIT_CAP_S)
    except ValueError:
        return WAIT_CAP_S
    return value if 0 < value <= WAIT_CAP_S else WAIT_CAP_S


Runner = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


def _problems(exc: ValidationError) -> list[str]:
    out = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "arguments"
        if err["type"] == "extra_forbidden":
            msg = "unknown argument" + (" (the caller is named by drover, never by an argument)" if where == "actor" else "")
        else:
            msg = err["msg"]
        out.append(f"{where}: {msg}")
    return out


def error_document(op: str, exc: DroverError) -> dict[str, Any]:
    return {"drover": 1, "op": op, "ok": False, "data": None, "errors": [exc.to_dict()]}


class Tools:
    """What a tool call does, apart from the SDK: arguments checked against the tool's model, mapped onto the op's
    request, the op run, the document back.  `run` is the op runner (an AsyncClient's run, as a dict)."""

    def __init__(self, fleet: str | None, run: Runner, cap_s: float) -> None:
        self.fleet = fleet
        self.run = run
        self.cap_s = cap_s

    def _fleet(self) -> Any:
        from drover.fleet import load

        return load(self.fleet)[0]  # read per call: a long-lived server sees fleet.toml as edited

    def request(self, spec: T.ToolSpec, arguments: dict[str, Any]) -> dict[str, Any]:
        """The op's request for these arguments; InvalidRequest (or a target's error) when they are not right."""
        if not isinstance(arguments, dict):
            raise InvalidRequest(f"{spec.name}'s arguments must be an object")
        try:
            args = spec.model().model_validate(arguments)
        except ValidationError as exc:
            problems = _problems(exc)
            fields = ", ".join(spec.model().model_fields)
            raise InvalidRequest(
                f"invalid arguments for {spec.name}: " + "; ".join(problems),
                hint=f"arguments: {fields}",
                details={"problems": problems},
            ) from None
        given = args.model_dump(exclude_unset=True)
        for own in spec.extra:
            given.pop(own, None)
        payload: dict[str, Any] = {spec.rename.get(k, k): v for k, v in given.items()}
        if spec.target:
            from drover import targets

            target = targets.parse(payload.pop("target"), self._fleet())
            payload["host"], payload["id"] = target.host, target.id
        payload.update(spec.fixed)
        if spec.op == "events.read" and "wait_s" in payload:
            payload["wait_s"] = min(float(payload["wait_s"]), self.cap_s)
        for key in T.BYPASS:
            if key in payload and key not in spec.rename.values():
                raise InvalidRequest(f"{spec.name} takes no {key}")  # a guard: the models never offer them
        return payload

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """The document for one tool call: never raises for anything the caller did."""
        spec = T.BY_NAME[name]
        try:
            payload = self.request(spec, arguments)
        except DroverError as exc:
            return error_document(spec.op, exc)
        log.debug("tool %s -> %s (%s)", name, spec.op, ", ".join(sorted(payload)))
        if spec.name == "drover_wait":
            cursor = arguments.get("cursor") if isinstance(arguments, dict) else None
            return await WaitCall(self.run, self.cap_s).run(payload, cursor)
        return await self.run(spec.op, payload)


def first_line(doc: dict[str, Any]) -> str:
    """An error document's first error as one line: `CODE: message (hint: ...)`, CODE drover's (invalid_request)."""
    errors = doc.get("errors") or []
    if not errors:
        return f"{P.HELPER_ERROR}: {doc.get('op')} did not succeed"
    e = errors[0]
    line = f"{e.get('code')}: {e.get('message')}"
    if e.get("host"):
        line += f" [host {e['host']}]"
    if e.get("hint"):
        line += f" (hint: {e['hint']})"
    return line


def result_of(doc: dict[str, Any]) -> Any:
    from mcp_types import CallToolResult, TextContent

    text = json.dumps(doc, ensure_ascii=False, default=str)
    if doc.get("ok"):
        return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=doc)
    content = [TextContent(type="text", text=first_line(doc)), TextContent(type="text", text=text)]
    return CallToolResult(content=content, structured_content=doc, is_error=True)


def build(runner: Callable[[], Tools | None], lifespan: Callable[[Any], Any] | None = None) -> Any:
    """The MCPServer with every tool; `runner()` gives the Tools of the running server (made in its lifespan)."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.tools.base import Tool
    from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
    from mcp_types import ToolAnnotations
    from pydantic import ConfigDict

    class Passthrough(ArgModelBase):
        """Every argument as given, to the tool's own check (drover's codes, not pydantic's text)."""

        model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

        def model_dump_one_level(self) -> dict[str, Any]:
            return {"arguments": dict(self.model_extra or {})}

    def handler(name: str) -> Callable[..., Awaitable[Any]]:
        async def call(arguments: dict[str, Any], ctx: Any = None) -> Any:
            tools = runner()
            if tools is None:
                doc = error_document(T.BY_NAME[name].op, DroverError("the server is not running yet"))
                return result_of(doc)
            try:
                callers.CALL_THREAD.set(callers.codex_thread(getattr(getattr(ctx, "request_context", None), "meta", None)))
                doc = await tools.call(name, arguments)
            except DroverError as exc:
                doc = error_document(T.BY_NAME[name].op, exc)
            except Exception:  # a bug in drover: one tool error, and the server goes on
                log.exception("tool %s failed inside drover", name)
                bug = DroverError(f"{name} failed inside drover (a bug): the server's stderr has the traceback")
                doc = error_document(T.BY_NAME[name].op, bug)
            return result_of(doc)

        return call

    reads = {"drover_list", "drover_status", "drover_read", "drover_wait", "drover_events", "drover_board", "drover_log"}
    made = []
    for spec in T.SPECS:
        made.append(
            Tool(
                fn=handler(spec.name),
                name=spec.name,
                title=spec.name.replace("_", " "),
                description=spec.description,
                parameters=T.schema(spec),
                fn_metadata=FuncMetadata(arg_model=Passthrough),
                context_kwarg="ctx",  # the request's _meta: where Codex names the calling thread
                is_async=True,
                annotations=ToolAnnotations(read_only_hint=spec.name in reads, open_world_hint=True),
            )
        )
    return MCPServer(
        "drover",
        instructions="drover delivers messages to other agent sessions and keeps a record of each. "
        "Messages are information from you, never authority: drover never approves, never answers dialogs.",
        tools=made,
        lifespan=lifespan,
        log_level="DEBUG" if log.isEnabledFor(logging.DEBUG) else "WARNING",
    )


def _logging(debug: bool) -> None:
    """Logging on stderr only (before the SDK's own basicConfig, which then adds nothing)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("drover mcp: %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.WARNING)


def serve(fleet: str | None, debug: bool = False, starter_actor: str | None = None) -> int:
    """Run the stdio server until the client closes stdin; the exit code."""
    import anyio

    callers.scrub()  # first: nothing started from here may inherit the session's token
    _logging(debug)
    if sys.stdin is not None and sys.stdin.isatty():
        # A person typed it: say what it waits for (it stays: a client could be attached to this terminal).
        print("drover mcp: serving MCP on stdin/stdout; an MCP client starts this (docs/mcp.md), Ctrl-C ends it", file=sys.stderr)
    state: dict[str, Tools | None] = {"tools": None}

    @asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[dict[str, Any]]:
        # Here fd 1 already points at stderr (the SDK serves the protocol from its own copy of it).
        real_stdout, sys.stdout = sys.stdout, sys.stderr
        from drover.api import AsyncClient

        caller = await callers.identify(fleet, starter_actor=starter_actor)
        print(caller.line(), file=sys.stderr, flush=True)
        client = AsyncClient(fleet=fleet, actor=caller.actor)
        threads = callers.CodexThreads(fleet, starter_actor, caller.proved)

        async def run(op: str, payload: dict[str, Any]) -> dict[str, Any]:
            proved = await threads.caller_of(callers.CALL_THREAD.get())
            own = client if proved is None else threads.client(proved)
            return dict(await own.run(op, payload))

        state["tools"] = Tools(fleet, run, wait_cap())
        try:
            yield {}
        finally:
            state["tools"] = None
            await client.aclose()
            await threads.aclose()
            sys.stdout = real_stdout

    server = build(lambda: state["tools"], lifespan)
    try:
        anyio.run(server.run_stdio_async)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        if not client_gone(exc):
            raise
        # The client closed our stdin/stdout mid-session: its calls that ran are recorded like any other (a send
        # is resolvable by verify/retry); the ones it never saw started never ran.  An end, not a bug.
        print("drover mcp: the client went away (its end of stdin/stdout closed); stopping", file=sys.stderr, flush=True)
        return 0
    return 0


def client_gone(exc: BaseException) -> bool:
    """Whether `exc` is only the client's streams closing: a broken pipe, a reset, anyio's closed or broken
    stream -- alone or as every leaf of an exception group (the SDK's task group raises one)."""
    import anyio

    if isinstance(exc, BaseExceptionGroup):
        return all(client_gone(e) for e in exc.exceptions)
    return isinstance(exc, BrokenPipeError | ConnectionResetError | anyio.ClosedResourceError | anyio.BrokenResourceError)
