"""What drover does with a bot's replies (drover/bots/): `drover read bot:NAME` lists them, and `bots.pass_on`
(`drover bot pass-on CHAT HOST:ID`) passes one on to a session wrapped as data (drover/bots/untrusted.py), as an
ordinary recorded message.  A reply is never sent on as it came: it is a bot's words, not the sender's."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field

from drover.bots import replies, untrusted
from drover.errors import InvalidRequest, TargetError, UsageError
from drover.fleet import LOCAL
from drover.ops import endpoints
from drover.ops.core import Context, Request, Result, op
from drover.remote import protocol as P


def read_bot(ctx: Context, name: str, last: int, roles: list[str] | None, grep: str | None, since: float | None) -> Result:
    """`sessions.read` of `bot:NAME`: its replies from the record, each marked untrusted, as transcript events."""
    endpoints.check(ctx.fleet, "bot", name)
    if roles and "bot" not in roles:
        raise InvalidRequest(f"bot:{name} has only replies, role bot: leave --role out or give --role bot")
    pattern = re.compile(grep, re.IGNORECASE) if grep else None
    found, more = replies.of_bot(ctx.truth, name, last, since, (lambda t: bool(pattern.search(t))) if pattern else None)
    events = [
        {
            "role": "bot",
            "from": f"bot:{name}, untrusted",
            "time": r["time"],
            "text": r["text"],
            **{k: r[k] for k in ("id", "in_reply_to", "untrusted")},
        }
        for r in found
    ]
    data: dict[str, Any] = {
        "host": "bot",
        "target": name,
        "events": events,
        "matched": len(events) + (1 if more else 0),
        "complete": not more,
        "path": str(ctx.truth.path),
        "untrusted": True,
    }
    return Result(data)


class PassOnRequest(Request):
    chat: str = Field(..., description="the reply's id (chat_..., as `drover read bot:NAME` and `drover log` show it)")
    host: str = Field(LOCAL, description="the host of the session to pass it on to")
    id: str = Field(..., description="the session to pass it on to")
    note: str | None = Field(None, description="a line of your own before the wrapped reply")
    actor: str | None = Field(None, description="who is sending (default: $DROVER_ACTOR, else user@host)")


@op(
    "bots.pass_on",
    PassOnRequest,
    "pass a bot's reply on to a session, wrapped as data that is not instructions (a recorded message)",
    "drover bot pass-on",
)
async def bots_pass_on(ctx: Context, req: PassOnRequest) -> Result:
    from drover.ops.send import MessageRequest, sessions_message

    if req.host in endpoints.KINDS:
        raise UsageError(f"pass a reply on to a session, not to {req.host}:{req.id}", hint="name it as HOST:ID")
    chat = replies.one(ctx.truth, req.chat)
    if chat is None:
        raise TargetError(
            f"no bot reply {req.chat!r} in {ctx.truth.path}", code=P.MESSAGE_NOT_FOUND, hint="`drover read bot:NAME` lists them"
        )
    wrapped = untrusted.wrap(chat["text"], f"bot:{chat['bot']} (reply {chat['id']} to {chat['in_reply_to']})")
    # The note is the operator's, outside the wrapper, but disarmed as the reply is: it cannot close or forge it.
    note = untrusted.disarm(req.note.strip()) if req.note else ""
    text = f"{note}\n\n{wrapped}" if note else wrapped
    message = MessageRequest(host=req.host, id=req.id, text=text, actor=req.actor)
    result = await sessions_message(ctx, message, {"passes_on": chat["id"]})
    if isinstance(result.data, dict):
        result.data["passed_on"] = chat["id"]
    return result
