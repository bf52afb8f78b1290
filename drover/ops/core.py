"""The ops registry: drover's core.  Every front -- the CLI, `drover op`, the Python API, MCP -- calls `run`.

An op is a pydantic request model, an async handler and a summary.  `run` validates the request, runs the
handler, and always answers one versioned document:

    {"drover": 1, "op": NAME, "ok": bool, "data": ..., "errors": [{"code", "message", "host"?}]}

Exceptions never escape `run` (but for bugs, which the CLI reports as internal errors).
"""

from __future__ import annotations

import getpass
import json
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from drover import interrupts
from drover.errors import BadJSON, DroverError, ExitCode, InvalidRequest, UnknownOp, UsageError
from drover.fleet import Fleet
from drover.fleet import load as load_fleet
from drover.route import Route
from drover.transport import Transport
from drover.truth import TruthFile

DOCUMENT_VERSION = 1


class Request(BaseModel):
    # Unknown fields are errors: a misspelt "txt" must not send an empty message.
    model_config = ConfigDict(extra="forbid")


@dataclass
class Result:
    data: Any = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    exit_code: int = ExitCode.OK

    @property
    def ok(self) -> bool:
        return self.exit_code == ExitCode.OK and not self.errors


@dataclass
class Document:
    op: str
    ok: bool
    data: Any
    errors: list[dict[str, Any]]
    exit_code: int

    def to_dict(self) -> dict[str, Any]:
        return {"drover": DOCUMENT_VERSION, "op": self.op, "ok": self.ok, "data": self.data, "errors": self.errors}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, ensure_ascii=False, default=str)


Handler = Callable[["Context", Any], Awaitable[Result]]


@dataclass(frozen=True)
class OpSpec:
    name: str
    summary: str
    request: type[Request]
    handler: Handler
    cli: str


REGISTRY: dict[str, OpSpec] = {}


H = TypeVar("H", bound=Handler)


def op(name: str, request: type[Request], summary: str, cli: str = "") -> Callable[[H], H]:
    def register(handler: H) -> H:
        REGISTRY[name] = OpSpec(name, summary, request, handler, cli)
        return handler

    return register


def default_actor() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry in some containers
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()}"


@dataclass
class Context:
    """What an op needs from the world; tests and library users can build their own."""

    fleet_path: str | None = None
    actor: str | None = None
    home: Path | None = None
    progress: Callable[[str, int, int], None] | None = None
    # The process ends when an op is interrupted (the CLI): a broadcast's later Ctrl-Cs are then ignored, so that
    # what it did is still printed.  A library's caller keeps its own SIGINT handling.
    exit_on_interrupt: bool = False
    # A command's --timeout: every host's connect and request timeout for this Context, whatever fleet.toml says.
    timeout_s: float | None = None
    _fleet: Fleet | None = None
    _fleet_file: Path | None = None
    _routes: dict[str, Route] = field(default_factory=dict)  # each host resolved once (drover/route.py)
    _transports: dict[str, Transport] = field(default_factory=dict)
    _connected: dict[str, float | None] = field(default_factory=dict)  # connect_seconds of released transports

    @property
    def fleet(self) -> Fleet:
        """The fleet, loaded once per Context (an invalid file raises FleetInvalid every time it is asked for)."""
        if self._fleet is None:
            self._fleet, self._fleet_file = load_fleet(self.fleet_path)
        return self._fleet

    @property
    def fleet_file(self) -> Path | None:
        """The file the fleet came from (None: the built-in fleet)."""
        _ = self.fleet
        return self._fleet_file

    def forget_fleet(self) -> None:
        """The fleet file was edited: load it again when next asked."""
        self._fleet, self._fleet_file = None, None
        self._routes.clear()

    @property
    def truth(self) -> TruthFile:
        return TruthFile(self.home)

    def who(self, explicit: str | None = None) -> str:
        """Say who you are: --actor, else $DROVER_ACTOR, else the fleet's default, else user@host."""
        actor = explicit or self.actor or os.environ.get("DROVER_ACTOR") or self.fleet.defaults.actor or default_actor()
        # A newline would forge a line of the log and of DROVER_ACTOR's readers: refused wherever it comes from.
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in actor):
            raise UsageError(f"the actor {actor!r} holds a control character", hint="give --actor as one plain line")
        return actor

    def route(self, host: str) -> Route:
        """The host resolved once for this Context (an unknown host raises UnknownHost, every time it is asked for):
        what the send, its handoff lookup, the transport and every request's timeout read."""
        route = self._routes.get(host)
        if route is None:
            route = self._routes[host] = Route.of(self.fleet, host, self.timeout_s)
        return route

    def select(self, hosts: list[str] | None = None, tags: list[str] | None = None) -> list[str]:
        """Fleet.select through this Context's routes: a fan-out checks the hosts it was given with the lookups its
        requests then read, one per host per command."""
        return self.fleet.select(hosts, tags, look_up=lambda host: self.route(host).config)

    def transport(self, host: str) -> Transport:
        if host not in self._transports:
            route = self.route(host)  # unknown host -> UnknownHost
            if route.local:
                from drover.transport.local import LocalTransport

                self._transports[host] = LocalTransport(host, dict(route.profiles))
            else:
                # Imported here so that `--help` and local work never pay for asyncssh.
                from drover.transport.openssh import transport_class

                route_cfg = route.ssh_config
                self._transports[host] = transport_class(route_cfg)(host, route_cfg, route.defaults, dict(route.profiles))
        return self._transports[host]

    def connect_seconds(self, host: str) -> float | None:
        """How long this invocation's connection to host took to open (None: local, or never connected)."""
        if host not in self._transports:
            return self._connected.get(host)
        return getattr(self._transports.get(host), "connect_seconds", None)

    async def release(self, host: str) -> None:
        """Close host's connection now, before the op ends: a fan-out over more hosts than its concurrency bound
        must not hold one socket per host until the last answers.  A later request to host connects again.
        A transport that a pool owns (persistent mode: `pooled` is true) stays open: the pool bounds it."""
        transport = self._transports.get(host)
        if transport is not None and not getattr(transport, "pooled", False):
            del self._transports[host]
            self._connected[host] = getattr(transport, "connect_seconds", None)
            await transport.close()

    def timeout(self, host: str) -> float:
        """How long one request to host may take (a persistent connection's request includes its connecting)."""
        return self.route(host).request_timeout

    async def close(self) -> None:
        for transport in self._transports.values():
            await transport.close()
        self._transports.clear()


def parse_payload(name: str, payload: str | dict[str, Any] | None) -> Request:
    spec = REGISTRY.get(name)
    if spec is None:
        known = ", ".join(sorted(REGISTRY))
        raise UnknownOp(f"unknown op {name!r}", hint=f"known ops: {known}; `drover op --list` shows their fields")
    if isinstance(payload, str):
        try:
            payload = json.loads(payload) if payload.strip() else {}
        except json.JSONDecodeError as exc:
            raise BadJSON(
                f"the request for {name} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
                hint='quote it in single quotes: drover op sessions.list \'{"host": "local"}\'',
            ) from None
        except RecursionError:
            raise BadJSON(f"the request for {name} is nested too deeply to be a request") from None
        except ValueError as exc:  # Python's own limit: an integer of more than 4300 digits
            raise BadJSON(f"the request for {name} is not a request drover can read: {exc}") from None
    if payload is None:
        payload = {}
    if not isinstance(payload, dict):
        raise InvalidRequest(f"the request for {name} must be a JSON object, not {type(payload).__name__}")
    where = _not_text(payload, "request")
    if where:
        # JSON's \ud800 escape decodes to a lone surrogate: no text, and it would be recorded before any host
        # could refuse it.  A usage error here, before anything is resolved or recorded.
        raise BadJSON(
            f"the request for {name} holds a lone surrogate (an unpaired \\ud800-\\udfff escape) at {where}: not text",
            hint="escape a character outside the BMP as its surrogate pair, or write it as UTF-8",
        )
    try:
        request = spec.request.model_validate(payload)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "request"
            msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
            problems.append(f"{where}: {msg}")
        fields = ", ".join(spec.request.model_fields)
        raise InvalidRequest(
            f"invalid request for {name}: " + "; ".join(problems),
            hint=f"fields: {fields}",
            details={"problems": problems},
        ) from None
    _check_id(name, request)
    return request


def _not_text(value: Any, path: str, depth: int = 0) -> str | None:
    """Where in a request a string (or a key) is not encodable as UTF-8, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if depth > 64:  # past any request's shape: model validation refuses it, with its own words
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        where = _not_text(key, f"a key of {path}", depth) if isinstance(key, str) else None
        where = where or _not_text(item, f"{path}.{key}" if isinstance(value, dict) else f"{path}[{key}]", depth + 1)
        if where:
            return where
    return None


def _check_id(name: str, request: Request) -> None:
    """An empty `id` names nothing: a usage error for every op that takes one, before anything is resolved or recorded.

    Here, once, rather than a validator on each request model: every op's `id` (a session, or for `messages.*`
    a message) gets the same rule.
    """
    value = getattr(request, "id", None) if "id" in type(request).model_fields else None
    if isinstance(value, str) and not value.strip():
        if name.startswith("messages."):
            what, hint = "the message id", "give a message id (msg_...) or a unique prefix; `drover log` lists them"
        else:
            what, hint = "the session", "name a session: a pane id (%3), session:window.pane, or a name; `drover ls` lists them"
        problem = f"id: {what} is empty"
        raise InvalidRequest(f"invalid request for {name}: {problem}", hint=hint, details={"problems": [problem]})


async def run_async(ctx: Context, name: str, payload: str | dict[str, Any] | None = None) -> Document:
    try:
        request = parse_payload(name, payload)
        result = await REGISTRY[name].handler(ctx, request)
    except DroverError as exc:
        return Document(name, False, None, [exc.to_dict()], int(exc.exit_code))
    data = result.data.model_dump(mode="json") if isinstance(result.data, BaseModel) else result.data
    return Document(name, result.ok, data, result.errors, int(result.exit_code))


def run(name: str, payload: str | dict[str, Any] | None = None, ctx: Context | None = None) -> Document:
    """Run one op to completion (the synchronous entry for the CLI and library users)."""
    ctx = ctx or Context()

    async def go() -> Document:
        try:
            return await run_async(ctx, name, payload)
        finally:
            await ctx.close()

    return interrupts.run(go())  # asyncio.run, whose op SIGTERM/SIGHUP cancel as Ctrl-C does


def describe() -> list[dict[str, Any]]:
    """Every op with its request fields, for `drover op --list` and MCP."""
    out = []
    for spec in sorted(REGISTRY.values(), key=lambda s: s.name):
        fields = []
        for fname, finfo in spec.request.model_fields.items():
            ann = finfo.annotation
            type_name = getattr(ann, "__name__", None) or str(ann).replace("typing.", "")
            fields.append(
                {
                    "name": fname,
                    "type": type_name,
                    "required": finfo.is_required(),
                    "default": None if finfo.is_required() else finfo.get_default(call_default_factory=True),
                    "description": finfo.description or "",
                }
            )
        out.append({"op": spec.name, "cli": spec.cli, "summary": spec.summary, "fields": fields})
    return out
