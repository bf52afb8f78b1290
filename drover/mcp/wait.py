"""drover_wait: sessions.wait_many cut into calls that each answer within the cap (50 s), resumed by a cursor.

MCP clients time a tool call out at 60 s, and a session may work for an hour.  So one call waits at most the cap;
when the wait is not over it answers `reached: false` with a `cursor` -- the record's events cursor
(drover/lifecycle.py, as `drover events` prints it) -- and the next call, given that cursor, first reads the record
from it: what happened to the sessions while nobody was waiting (a `done`, an exit, a message delivered) is in the
answer, and a `done` or an exit there settles the wait as wait_many itself would.  The server keeps no state between
the calls: the cursor is all of it, so a restarted server resumes the same.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from drover.remote import protocol as P

Runner = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
PAGE = 500
MAX_PAGES = 20  # at most this many pages of the record per call; `more` says when there was more


def _spellings(rows: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per host, every spelling of the waited sessions (identity, id, name, the target as given)."""
    out: dict[str, set[str]] = {}
    for r in rows:
        names = out.setdefault(str(r.get("host")), set())
        names |= {str(r[k]) for k in ("identity", "id", "name", "target") if r.get(k) not in (None, "")}
    return out


def _about(ev: dict[str, Any], spellings: dict[str, set[str]]) -> bool:
    """Is this record event about one of the waited sessions (a lifecycle event of it, or a message to it)?"""
    names = spellings.get(str(ev.get("host")))
    if not names:
        return False
    for key in ("session", "target", "resolved"):
        value = ev.get(key)
        if isinstance(value, dict):
            if any(str(v) in names for v in value.values() if isinstance(v, str | int)):
                return True
        elif isinstance(value, str) and value in names:
            return True
    return any(str(ev.get(k)) in names for k in ("identity", "id", "name") if ev.get(k))


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
        doc = await self.op("sessions.wait_many", {**payload, "timeout_s": self.cap_s})
        data = doc.get("data")
        if not isinstance(data, dict):
            return doc  # refused before any waiting (a bad target, a bad argument): the op's own error
        events, end_cursor, more, bad = await self._events(start_cursor)
        if bad is not None:
            return bad
        wanted = _spellings(data.get("sessions") or [])
        data = {**data, "cursor": end_cursor, "events": [e for e in events if _about(e["event"], wanted)]}
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
