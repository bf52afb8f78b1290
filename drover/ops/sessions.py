"""sessions.*: list, status and message -- the verbs that touch a host."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import Field

from drover.errors import DroverError, ExitCode
from drover.fleet import LOCAL
from drover.ops.core import Context, Request, Result, op
from drover.remote import protocol as P
from drover.targets import check_engine


class ListRequest(Request):
    hosts: list[str] | None = Field(None, description="hosts to ask (default: every host of the fleet)")
    tags: list[str] | None = Field(None, description="only hosts with one of these tags")
    engine: str | None = Field(None, description="only sessions running this engine")
    state: bool = Field(True, description="read each pane's screen to report its state")


class StatusRequest(Request):
    host: str = Field(LOCAL, description="the host the session is on")
    id: str = Field(..., description="pane id (%3), session:window.pane, or a unique name or prefix")
    tail: int = Field(8, ge=0, le=200, description="lines of the screen's tail to include")


class WaitRequest(Request):
    host: str = Field(LOCAL, description="the host the session is on")
    id: str = Field(..., description="the session")
    until: Literal["idle", "exited"] = Field("idle", description="the state to wait for")
    timeout_s: float = Field(600.0, gt=0, le=86400, description="give up after this many seconds")


class ReadRequest(Request):
    host: str = Field(LOCAL, description="the host the session is on")
    id: str = Field(..., description="the session (or a Codex rollout id)")
    last: int = Field(20, ge=1, le=10000, description="the last N matching events")
    roles: list[str] | None = Field(None, description="only these roles: user, assistant, peer, tool")
    grep: str | None = Field(None, description="only events whose text matches this regex (case-insensitive)")
    since: str | None = Field(None, description="a duration (30s, 10m, 2h) or an ISO time")
    raw: bool = Field(False, description="the raw transcript records instead of text")


def fd_bound(concurrency: int) -> int:
    """The fan-out's concurrency as configured, but never more connections than this process may have open: each
    takes a descriptor (two through a ProxyJump), and a few dozen are drover's own."""
    import resource

    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return concurrency
    return max(1, min(concurrency, (soft - 64) // 2))


async def fan_out_each(
    ctx: Context, hosts: list[str], work: Callable[[str], Awaitable[Any]]
) -> list[tuple[str, Any, DroverError | None]]:
    """Run `work(host)` for every host concurrently (bounded); a failing host is a row, never an exception.

    At most `concurrency` hosts are at work at once, and so at most that many connections are open: when the hosts
    outnumber the bound, each host's connection is closed as soon as its work is done (its slot is freed only
    then); when they fit under it, the connections stay open for the op's next request to the same hosts."""
    concurrency = fd_bound(ctx.fleet.defaults.concurrency)
    limit = asyncio.Semaphore(concurrency)
    keep = len(set(hosts)) <= concurrency
    done = 0

    async def one(host: str) -> tuple[str, Any, DroverError | None]:
        nonlocal done
        async with limit:
            try:
                result: tuple[str, Any, DroverError | None] = (host, await work(host), None)
            except DroverError as exc:
                exc.host = exc.host or host
                result = (host, None, exc)
            finally:
                if not keep:
                    await ctx.release(host)
        done += 1
        if ctx.progress:
            ctx.progress(host, done, len(hosts))
        return result

    return list(await asyncio.gather(*(one(h) for h in hosts)))


async def call_host(ctx: Context, host: str, helper_op: str, args: dict[str, Any], timeout: float | None = None) -> Any:
    """One helper request; what the transport noticed on the way (a noisy login shell) joins the data's warnings."""
    transport = ctx.transport(host)
    data = await transport.call(helper_op, args, timeout=timeout or ctx.timeout(host))
    noticed = getattr(transport, "warnings", None)
    if noticed and isinstance(data, dict):
        data["warnings"] = [*data.get("warnings", []), *noticed]
        noticed.clear()
    return data


async def fan_out(
    ctx: Context, hosts: list[str], helper_op: str, args: dict[str, Any]
) -> list[tuple[str, Any, DroverError | None]]:
    """The same helper request to every host."""

    async def call(host: str) -> Any:
        return await call_host(ctx, host, helper_op, args)

    return await fan_out_each(ctx, hosts, call)


def fan_exit(rows: list[tuple[str, Any, DroverError | None]]) -> int:
    """0 when every host answered, PARTIAL when some did, FAILED when none did."""
    failed = sum(1 for _h, _d, err in rows if err is not None)
    if not failed:
        return ExitCode.OK
    return ExitCode.PARTIAL if failed < len(rows) else ExitCode.FAILED


@op("sessions.list", ListRequest, "every session on every (or the chosen) host, with engine and state", "drover ls")
async def sessions_list(ctx: Context, req: ListRequest) -> Result:
    check_engine(ctx.fleet, req.engine)
    hosts = ctx.fleet.select(req.hosts, req.tags)
    rows = await fan_out(ctx, hosts, "list", {"state": req.state})
    sessions: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    for host, data, _err in rows:
        if data is None:
            continue
        for s in data.get("sessions", []):
            if req.engine and s.get("engine") != req.engine:
                continue
            sessions.append({"host": host, **s})
        warnings += [{"host": host, "message": w} for w in data.get("warnings", [])]
    errors = [err.to_dict() for _h, _d, err in rows if err is not None]
    hosts_out = [
        {"host": h, "ok": err is None, "sessions": len(d.get("sessions", [])) if d else 0}
        | ({"code": err.code, "error": err.message} if err is not None else {})  # why it failed, beside what was found
        for h, d, err in rows
    ]
    data = {"sessions": sessions, "hosts": hosts_out, "warnings": warnings} | ({"engine": req.engine} if req.engine else {})
    return Result(data, errors, fan_exit(rows))


@op("sessions.status", StatusRequest, "alive, and doing what? state with evidence: screen, last line, since", "drover status")
async def sessions_status(ctx: Context, req: StatusRequest) -> Result:
    data = await call_host(ctx, req.host, "status", {"target": req.id, "tail": req.tail})
    session = {"host": req.host, **data["session"]}
    return Result({"session": session, "warnings": data.get("warnings", [])})


@op(
    "sessions.wait",
    WaitRequest,
    "block until a session is idle or has exited, without polling where it can notify",
    "drover wait",
)
async def sessions_wait(ctx: Context, req: WaitRequest) -> Result:
    args = {"target": req.id, "until": req.until, "timeout_s": req.timeout_s}
    # The host does the waiting; the request only needs to outlive it.
    data = await call_host(ctx, req.host, "wait", args, timeout=req.timeout_s + ctx.timeout(req.host))
    data = {"host": req.host, "until": req.until, **data}
    if data.get("reached"):
        return Result(data)
    if data.get("state") == "exited":
        # It will never be idle now: say so at once, as a session that is gone.
        error = {"code": P.SESSION_EXITED, "message": f"{req.id} exited while waiting for it to be {req.until}", "host": req.host}
        return Result(data, [error], ExitCode.TARGET)
    error = {
        "code": P.WAIT_TIMEOUT,
        "message": f"{req.id} was still {data.get('state')} after {req.timeout_s:g}s",
        "host": req.host,
    }
    return Result(data, [error], ExitCode.TIMEOUT)


@op("sessions.read", ReadRequest, "a transcript, filtered on the host: last N events, roles, grep, since", "drover read")
async def sessions_read(ctx: Context, req: ReadRequest) -> Result:
    from drover.ops.messages import since_ts

    args: dict[str, Any] = {"target": req.id, "last": req.last, "roles": req.roles, "grep": req.grep, "raw": req.raw}
    if req.grep:
        import re

        try:
            re.compile(req.grep)
        except re.error as exc:
            from drover.errors import InvalidRequest

            raise InvalidRequest(f"grep: {req.grep!r} is not a valid regular expression: {exc}") from None
    if req.since:
        args["since"] = since_ts(req.since)
    data = await call_host(ctx, req.host, "read", args)
    return Result({"host": req.host, **data})
