"""fleet.check: per host, is it reachable, is its key right, does auth work, what does it run?"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import Field

from drover.errors import DroverError
from drover.ops.core import Context, Request, Result, op
from drover.ops.hosts import call_host, fan_exit, fan_out_each
from drover.remote import protocol as P

# The steps of reaching a host's helper, in order; an error code names the step that failed (the ones before it
# passed).  `shell` is the login shell running drover's command: a host can accept the connection and the login
# and still fail there (a broken rc file), which is not "unreachable".
STEPS = ["reachable", "host_key", "auth", "shell", "python"]
FAILED_STEP = {
    P.CONNECTION_REFUSED: "reachable",
    P.CONNECT_TIMEOUT: "reachable",
    P.DNS: "reachable",
    P.PROXY_JUMP_FAILED: "reachable",
    P.IDENTITY_MISSING: "auth",
    P.UNREACHABLE: "reachable",
    P.CONNECTION_LOST: "reachable",
    P.UNKNOWN_HOST_KEY: "host_key",
    P.HOST_KEY_CHANGED: "host_key",
    P.HOST_KEY: "host_key",
    P.AUTH_FAILED: "auth",
    P.SECOND_FACTOR: "auth",
    P.NO_MASTER: "auth",
    P.SSH_ERROR: "auth",
    P.SHELL_FAILED: "shell",
    P.PYTHON_MISSING: "python",
    P.PYTHON_TOO_OLD: "python",
}


class CheckRequest(Request):
    hosts: list[str] | None = Field(None, description="hosts to check (default: every host of the fleet)")
    tags: list[str] | None = Field(None, description="only hosts with one of these tags")


def _row(
    host: str, data: Any, err: DroverError | None, seconds: float, connect: float | None, master: Any = None
) -> dict[str, Any]:
    row: dict[str, Any] = {"host": host, "ok": err is None}
    failed = FAILED_STEP.get(err.code, "python") if err else None
    if err is not None and err.code == P.REQUEST_TIMEOUT and master == "not answering":
        failed = "reachable"  # every call rides a master that does not answer: no step past it was seen to work
    passed = True
    for step in STEPS:
        if step == failed:
            passed = False
        row[step] = passed if (passed or step == failed) else None
    if data:
        row.update(
            python=data.get("python"),
            tmux=data.get("tmux"),
            engines=data.get("engines", {}),
            mcp=data.get("mcp", {}),
            user=data.get("user"),
            stale_claude_sessions=data.get("stale_claude_sessions", []),
            forwarded=data.get("forwarded"),
            warnings=data.get("warnings", []),
        )
    row["rtt_ms"] = round((seconds - (connect or 0)) * 1000, 1) if err is None else None
    row["connect_ms"] = round(connect * 1000, 1) if connect is not None else None
    if err is not None:
        row["error"] = err.to_dict()
    return row


@op(
    "fleet.check",
    CheckRequest,
    "per host: reachable, host key, auth, login shell, python, tmux, engines, drover's MCP server registered, round-trip time",
    "drover fleet check",
)
async def fleet_check(ctx: Context, req: CheckRequest) -> Result:
    hosts = ctx.select(req.hosts, req.tags)
    timings: dict[str, float] = {}

    async def hello(host: str) -> Any:
        started = time.monotonic()
        try:
            # call_host: what the transport noticed (a login shell that printed something) joins the row's warnings
            return await call_host(ctx, host, "hello", {})
        finally:
            timings[host] = time.monotonic() - started

    # The masters are looked at while the hosts are called, not after: a stopped master holds both to their
    # bounds, and one after the other they took twice the bound --timeout states.
    rows, masters = await asyncio.gather(fan_out_each(ctx, hosts, hello), _masters(ctx, hosts))
    out = []
    for host, data, err in rows:
        connect = ctx.connect_seconds(host)
        master = masters.get(host, {})
        out.append({**_row(host, data, err, timings.get(host, 0.0), connect, master.get("master")), **master})
    errors = [err.to_dict() for _h, _d, err in rows if err is not None]
    return Result({"hosts": out}, errors, fan_exit(rows))


async def _masters(ctx: Context, hosts: list[str]) -> dict[str, dict[str, Any]]:
    """Per `transport = "openssh"` host: whether the user's master is up and the one command that opens it."""
    chosen = [h for h in hosts if ctx.route(h).config.transport == "openssh"]
    if not chosen:
        return {}
    from drover.transport.openssh_config import OpenSSHCommand
    from drover.transport.openssh_master import describe

    async def one(host: str) -> dict[str, Any]:
        cfg = ctx.route(host).config
        seconds = ctx.timeout_s or cfg.connect_timeout or ctx.fleet.defaults.connect_timeout
        try:
            return {"transport": "openssh", **await describe(OpenSSHCommand(host, cfg, seconds), seconds)}
        except DroverError as exc:
            return {"transport": "openssh", "master": None, "master_error": exc.message}

    found = await asyncio.gather(*(one(h) for h in chosen))
    return dict(zip(chosen, found, strict=True))
