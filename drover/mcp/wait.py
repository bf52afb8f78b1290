"""drover_wait: sessions.wait_many cut into calls that each answer within the cap (50 s), resumed by a cursor.

MCP clients time a tool call out at 60 s, and a session may work for an hour.  So one call waits at most the cap;
when the wait is not over it answers `reached: false` with a `cursor` -- the record's events cursor
(drover/lifecycle.py, as `drover events` prints it) -- and the next call, given that cursor, first reads the record
from it: what happened to the sessions while nobody was waiting (a `done`, an exit, a message delivered) is in the
answer, and a `done` or an exit there settles the wait as wait_many itself would.  The server keeps no state between
the calls: the cursor is all of it, so a restarted server resumes the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from drover.remote import protocol as P

Runner = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
PAGE = 500
GRACE_S = 8.0  # past the cap, for resolving the targets and reading the record: 50 + 8 stays inside 60
MAX_PAGES = 20  # at most this many pages of the record per call; `more` says when there was more


def _spellings(rows: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per host, every spelling of the waited sessions (identity, id, name, the target as given)."""
    out: dict[str, set[str]] = {}
    for r in rows:
        names = out.setdefault(str(r.get("host")), set())
        names |= {str(r[k]) for k in ("identity", "id", "name", "target") if r.get(k) not in (None, "")}
    return out


def _names_in(value: Any, names: set[str]) -> bool:
    if isinstance(value, dict):
        return any(str(v) in names for v in value.values() if isinstance(v, str | int))
    return isinstance(value, str) and value in names


def _about(ev: dict[str, Any], spellings: dict[str, set[str]], messages: set[str]) -> bool:
    """Is this record event about one of the waited sessions: a lifecycle event of it, a message to it (its
    `accepted` names the session; its `outcome`, only the message id, so `messages` collects the ids)?"""
    if ev.get("event") == "outcome":
        return str(ev.get("id")) in messages
    names = spellings.get(str(ev.get("host")))
    if not names:
        return False
    options = ev.get("options")
    session = options.get("session") if isinstance(options, dict) else None
    hit = any(_names_in(ev.get(k), names) for k in ("session", "target")) or _names_in(session, names)
    if hit and ev.get("event") == "accepted":
        messages.add(str(ev.get("id")))
    return hit


def about(events: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events (as events.read gives them: {"cursor", "event"}) about the waited sessions, in order."""
    wanted, messages = _spellings(rows), set[str]()
    return [e for e in events if _about(e["event"], wanted, messages)]


class WaitCall:
    def __init__(self, run: Runner, cap_s: float) -> None:
        self.op = run
        self.cap_s = cap_s

    async def _events(self, since: str) -> tuple[list[dict[str, Any]], str, bool, dict[str, Any] | None]:
        """The record's events after `since`, the cursor after them, whether more remain, or an error document."""
        events: list[dict[str, Any]] = []
        cursor, more = since, False
        for _ in range(MAX_PAGES):
            doc = await self.op("events.read", {"since": cursor, "limit": PAGE})
            if not doc.get("ok"):
                return [], cursor, False, doc
            data = doc["data"]
            events += data["events"]
            cursor, more = data["cursor"], bool(data.get("more"))
            if not more:
                break
        return events, cursor, more, None

    async def run(self, payload: dict[str, Any], cursor: str | None) -> dict[str, Any]:
        # Where the record stands before the wait (or where the last call left it): read from there afterwards.
        # A cursor given is checked now (one of this record's), not after the wait.
        _, now, _, bad = await self._events(cursor or "end")
        if bad is not None:
            return bad
        start_cursor = cursor or now
        try:
            # The op's own bound is the cap, from when its waiting starts; resolving the targets comes first (a slow
            # host's connect), so the call as a whole is bounded too: inside the client's 60 s whatever a host does.
            doc = await asyncio.wait_for(
                self.op("sessions.wait_many", {**payload, "timeout_s": self.cap_s}), self.cap_s + GRACE_S
            )
        except TimeoutError:
            doc = {
                "drover": 1,
                "op": "sessions.wait_many",
                "ok": False,
                "data": {"until": payload.get("until", "idle"), "reached": False, "sessions": []},
                "errors": [{"code": P.WAIT_TIMEOUT, "message": "the hosts took the whole call to answer"}],
            }
        data = doc.get("data")
        if not isinstance(data, dict):
            return doc  # refused before any waiting (a bad target, a bad argument): the op's own error
        events, end_cursor, more, bad = await self._events(start_cursor)
        if bad is not None:
            return bad
        data = {**data, "cursor": end_cursor, "events": about(events, data.get("sessions") or [])}
        if more:
            data["events_more"] = True  # past this call's pages of the record: drover_events reads on from the cursor
        timed_out = [e for e in doc.get("errors") or [] if e.get("code") == P.WAIT_TIMEOUT]
        if timed_out and not data.get("reached"):
            # The cap, not a failure: the wait goes on in the next call, from this cursor.
            data["again"] = (
                f"not yet {data.get('until')} after {self.cap_s:g}s ({timed_out[0].get('message')}): "
                "call drover_wait again with the same targets and this cursor"
            )
            rest = [e for e in doc["errors"] if e.get("code") != P.WAIT_TIMEOUT]
            return {**doc, "ok": not rest, "data": data, "errors": rest}
        return {**doc, "data": data}
