"""messages.*: queries over the truth file (no host is contacted)."""

from __future__ import annotations

import time
from typing import Any

from pydantic import Field

from drover.errors import InvalidRequest, TargetError
from drover.fleet import ENDPOINT_KINDS
from drover.ops.core import Context, Request, Result, op
from drover.paths import DURATION_FORMS, parse_duration


class ListRequest(Request):
    target: str | None = Field(
        None,
        description="HOST:ID or ID: a session by any spelling (name, id or 8+ hex prefix, pid, pane %3, identity)",
    )
    host: str | None = Field(None, description="only messages to this host")
    hosts: list[str] | None = Field(
        None, description="only messages to these hosts: names, lists, ranges (h1,h3 · node[01-40] · h[1-3],!h2)"
    )
    actor: str | None = Field(None, description="only messages from this actor")
    outcome: str | None = Field(None, description="delivered, queuedBehindTurn, held, refused, dropped, failed")
    since: str | None = Field(None, description="a duration (30s, 10m, 2h, 7d) or an ISO time")
    pending: bool = Field(False, description="only messages accepted with no outcome yet (a crash mid-send)")
    limit: int = Field(50, ge=1, le=100000, description="the newest N")
    text: bool = Field(False, description="include each message's full text")


class GetRequest(Request):
    id: str = Field(..., description="a message id (msg_...) or a unique prefix of one")


def since_ts(value: str) -> float:
    """The time `value` names: an ISO time, else that long ago, by drover's one duration grammar (drover/paths.py:
    1h30m as the fleet file writes it; 0s is now).  ISO first: a bare 20261201 is a date, as it always was."""
    from datetime import datetime

    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        pass
    try:
        return time.time() - parse_duration(value)
    except ValueError:
        raise InvalidRequest(
            f"since: {value!r} is neither a duration ({DURATION_FORMS}) nor an ISO time (2026-12-01T09:00)"
        ) from None


@op("messages.list", ListRequest, "query the truth file: who sent what to whom, and what became of it", "drover log")
async def messages_list(ctx: Context, req: ListRequest) -> Result:
    """The newest `limit` matching messages, oldest first, read from the end of the file backwards.

    `total` counts the matching messages found; `complete` says whether that is all of them (the scan reached
    the start of the file or of the --since window) or whether there are more than `limit` (total = limit + 1).
    `warnings` holds one entry when malformed lines were skipped, with their count."""
    host, target = req.host, req.target
    if target and ":" in target and host is None:
        head, rest = target.split(":", 1)
        if head in ctx.fleet.host_names() or head in ENDPOINT_KINDS:  # `bot:NAME` is the bot's messages
            host, target = head, rest
    cutoff = since_ts(req.since) if req.since else None
    host_in = None
    if req.hosts is not None:
        from drover.hostsets import is_expression, matcher

        if len(req.hosts) == 1 and not is_expression(req.hosts[0]) and host in (None, req.hosts[0]):
            host = req.hosts[0]  # one name: the file's bytes can rule lines out before they are parsed
        elif req.hosts:
            host_in = matcher(req.hosts)  # the record outlives hosts: a name the fleet dropped still matches
        else:
            raise InvalidRequest("hosts is empty: name at least one host, or leave it out for every host")
    truth = ctx.truth
    found = truth.query(
        req.limit, cutoff, host=host, target=target, actor=req.actor, outcome=req.outcome, pending=req.pending, host_in=host_in
    )
    out: list[dict[str, Any]] = []
    for m in found.messages:
        d = m.to_dict()
        if not req.text:
            d["text"] = m.text[:120]
        out.append(d)
    data: dict[str, Any] = {
        "messages": out,
        "total": found.total,
        "complete": found.complete,
        "truth_file": str(truth.path),
        "warnings": found.stats.warnings(),
    }
    to_bots = [m for m in found.messages if m.host == "bot"]
    if to_bots:  # the bots' replies to these messages, marked untrusted (a member only when there are some)
        from drover.bots.replies import answering

        chats = answering(truth, {m.id for m in to_bots}, min(m.ts for m in to_bots))
        if chats:
            data["chats"] = chats if req.text else [{**c, "text": c["text"][:120]} for c in chats]
    return Result(data)


@op("messages.get", GetRequest, "one message from the truth file, with its full text and outcome", "drover log show")
async def messages_get(ctx: Context, req: GetRequest) -> Result:
    truth = ctx.truth
    hits, count, stats = truth.find(req.id)
    warnings = stats.warnings()
    if not hits:
        raise TargetError(
            f"no message {req.id!r} in {truth.path}",
            code="message_not_found",
            hint="`drover log` lists them",
            details={"warnings": warnings} if warnings else None,
        )
    if count > 1:
        raise TargetError(
            f"{req.id!r} is a prefix of {count} messages: " + ", ".join(m.id for m in hits[:5]),
            code="ambiguous_message",
        )
    return Result({"message": hits[0].to_dict(), "warnings": warnings})
