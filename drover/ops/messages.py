"""messages.*: queries over the truth file (no host is contacted)."""

from __future__ import annotations

import re
import time
from typing import Any

from pydantic import Field

from drover.errors import InvalidRequest, TargetError
from drover.ops.core import Context, Request, Result, op


class ListRequest(Request):
    target: str | None = Field(None, description="HOST:ID or ID as it was addressed")
    host: str | None = Field(None, description="only messages to this host")
    actor: str | None = Field(None, description="only messages from this actor")
    outcome: str | None = Field(None, description="delivered, queuedBehindTurn, held, refused, dropped, failed")
    since: str | None = Field(None, description="a duration (30s, 10m, 2h, 7d) or an ISO time")
    pending: bool = Field(False, description="only messages accepted with no outcome yet (a crash mid-send)")
    limit: int = Field(50, ge=1, le=100000, description="the newest N")
    text: bool = Field(False, description="include each message's full text")


class GetRequest(Request):
    id: str = Field(..., description="a message id (msg_...) or a unique prefix of one")


DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")


def since_ts(value: str) -> float:
    m = DURATION.match(value.strip())
    if m:
        return time.time() - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    from datetime import datetime

    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise InvalidRequest(f"since: {value!r} is neither a duration like 10m nor an ISO time") from None


@op("messages.list", ListRequest, "query the truth file: who sent what to whom, and what became of it", "drover log")
async def messages_list(ctx: Context, req: ListRequest) -> Result:
    host, target = req.host, req.target
    if target and ":" in target and host is None:
        head, rest = target.split(":", 1)
        if head in ctx.fleet.host_names():
            host, target = head, rest
    cutoff = since_ts(req.since) if req.since else None
    out: list[dict[str, Any]] = []
    for m in ctx.truth.messages():
        if host and m.host != host:
            continue
        if target and m.target != target:
            continue
        if req.actor and m.actor != req.actor:
            continue
        if req.outcome and m.outcome != req.outcome:
            continue
        if req.pending and not m.pending:
            continue
        if cutoff is not None and m.ts < cutoff:
            continue
        d = m.to_dict()
        if not req.text:
            d["text"] = m.text[:120]
        out.append(d)
    return Result({"messages": out[-req.limit :], "total": len(out), "truth_file": str(ctx.truth.path)})


@op("messages.get", GetRequest, "one message from the truth file, with its full text and outcome", "drover log show")
async def messages_get(ctx: Context, req: GetRequest) -> Result:
    hits = [m for m in ctx.truth.messages() if m.id == req.id or m.id.startswith(req.id)]
    exact = [m for m in hits if m.id == req.id]
    hits = exact or hits
    if not hits:
        raise TargetError(f"no message {req.id!r} in {ctx.truth.path}", code="message_not_found", hint="`drover log` lists them")
    if len(hits) > 1:
        raise TargetError(
            f"{req.id!r} is a prefix of {len(hits)} messages: " + ", ".join(m.id for m in hits[:5]),
            code="ambiguous_message",
        )
    return Result({"message": hits[0].to_dict()})
