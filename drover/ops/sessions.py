"""sessions.*: list, status, wait and read -- the verbs that ask one host about its sessions (send: drover/ops/send.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from drover.errors import DroverError, ExitCode
from drover.fleet import LOCAL
from drover.ops import live_state, sightings
from drover.ops.core import Context, Request, Result, op
from drover.ops.hosts import call_host, fan_exit, fan_out
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


@op("sessions.list", ListRequest, "every session on every (or the chosen) host, with engine and state", "drover ls")
async def sessions_list(ctx: Context, req: ListRequest) -> Result:
    check_engine(ctx.fleet, req.engine)
    hosts = ctx.select(req.hosts, req.tags)
    rows = await live_state.list_each(ctx, hosts, req.state) if req.state else await fan_out(ctx, hosts, "list", {"state": False})
    sessions: list[dict[str, Any]] = []
    warnings: list[dict[str, Any]] = []
    events = live_state.terminal_events(ctx, warnings) if req.state else []
    for host, data, _err in rows:
        if data is None:
            continue
        found = [s for s in data.get("sessions", []) if not req.engine or s.get("engine") == req.engine]
        if req.state:
            sightings.note_live(ctx, host, found)
            found = live_state.fold_rows(ctx, host, found, events)
        sessions += [{"host": host, **s} for s in found]
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
    try:
        args: dict[str, Any] = {"target": req.id, "tail": req.tail}
        if live_state.own_record(req.host):
            args["lifecycle"] = True  # the host's own record's `done` about it, in the same request
        data = await call_host(ctx, req.host, "status", args)
    except DroverError as exc:
        # A worker drover spawned that is gone is `exited`, with when it was last seen; a typo is still an error.
        from drover.ops import gone

        row = await gone.exited_row(ctx, req.host, req.id, exc)  # live_state's answer, with the newest sighting
        if row is None:
            raise
        return Result({"session": row, "warnings": []})
    warnings: list[dict[str, Any]] = []
    sightings.note_live(ctx, req.host, [data["session"]])  # seen live now: a later "last seen" says so
    [session] = live_state.fold_rows(ctx, req.host, [data["session"]], live_state.terminal_events(ctx, warnings))
    said = [*data.get("warnings", []), *(w["message"] for w in warnings)]
    return Result({"session": {"host": req.host, **session}, "warnings": said})


@op(
    "sessions.wait",
    WaitRequest,
    "block until a session is idle or has exited, without polling where it can notify",
    "drover wait",
)
async def sessions_wait(ctx: Context, req: WaitRequest) -> Result:
    args = {"target": req.id, "until": req.until, "timeout_s": req.timeout_s}
    # The host does the waiting; the request only needs to outlive it.
    try:
        data = await call_host(ctx, req.host, "wait", args, timeout=req.timeout_s + ctx.timeout(req.host))
    except DroverError as exc:
        # A worker drover spawned that is gone is exited before the wait begins (as `status` says), not a typo.
        gone = await live_state.exited_status(ctx, req.host, req.id, exc)
        if gone is None:
            raise
        how = f"a session drover spawned ({gone.get('spawn_id')}), no longer live on its host"
        data = {"host": req.host, "until": req.until, "reached": req.until == "exited", "state": "exited"}
        data.update(how=how, waited_s=0.0, session=gone)
        if data["reached"]:
            return Result(data)
        message = f"{req.id} had exited before the wait began ({how}): it can no longer be {req.until}"
        return Result(data, [{"code": P.SESSION_EXITED, "message": message, "host": req.host}], ExitCode.TARGET)
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
    if req.host == "bot":  # no host to ask: a bot's replies are in the record (drover/ops/bots.py)
        from drover.ops.bots import read_bot

        return read_bot(ctx, req.id, req.last, req.roles, req.grep, args.get("since"))
    try:
        data = await call_host(ctx, req.host, "read", args)
    except DroverError as exc:
        from drover.ops import gone

        raise await gone.explain(ctx, req.host, req.id, exc, what="there is nothing live to read") from None
    return Result({"host": req.host, **data})
