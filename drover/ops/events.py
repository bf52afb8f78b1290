"""events.read: the truth file's events (messages, spawns, handoffs, lifecycle) read forward from a cursor, each with
the cursor just past it -- what `drover events [--follow]` prints, and what a coordinator resumes from.

A cursor is `INODE:OFFSET` (drover/lifecycle.py): a reader that prints each event's cursor and is killed resumes
from the last one it printed and misses and repeats nothing.  Without a cursor the answer is the last N events.
From a cursor, `limit` counts the events given (the kind filter is applied first, the record paged through as far
as it takes), and `more` says whether wanted events remain after the answer's cursor -- a reader asks again from it.
`wait_s` blocks (bounded) until at least one event arrives: the record's size is looked at every LOOK_S -- a stat,
not a read -- so a waiting reader costs nothing while nothing is written.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import time
from typing import Any

from pydantic import Field

from drover import lifecycle
from drover.errors import InvalidRequest
from drover.ops.core import Context, Request, Result, op
from drover.record import parse
from drover.truth import TruthFile

LOOK_S = 0.2  # between two looks at the record's size while waiting
MAX_WAIT_S = 50.0  # an MCP tool call must answer within a minute: a caller wanting longer asks again with the cursor
TAIL_BLOCK = 1 << 16


class EventsRequest(Request):
    since: str | None = Field(None, description="a cursor (INODE:OFFSET), start or end; default: the last `limit` events")
    limit: int = Field(20, ge=1, le=lifecycle.READ_LIMIT, description="at most this many events")
    kinds: list[str] | None = Field(None, description="only these event kinds (accepted, outcome, spawned, done, spawn*)")
    wait_s: float = Field(0.0, ge=0, le=MAX_WAIT_S, description="with a cursor: block up to this long for an event")


# Every kind of event drover writes to the record: a `--kind` that is none of these and no pattern matching one is a
# typo (a follower would wait forever for it).
RECORD_KINDS = (
    "accepted",
    "outcome",
    "handoff",
    "spawn_requested",
    "spawned",
    "spawn_failed",
    "spawn_briefed",
    "nudge_run",
    "watch_tried",
    *lifecycle.KINDS,
)


def check_kinds(kinds: list[str] | None) -> None:
    for k in kinds or []:
        if not any(fnmatch.fnmatchcase(known, k) for known in RECORD_KINDS):
            raise InvalidRequest(
                f"no event kind is {k!r}",
                hint=f"name one of {', '.join(RECORD_KINDS)} (or a pattern such as spawn*)",
            )


def _wanted(ev: dict[str, Any], kinds: list[str] | None) -> bool:
    return not kinds or any(fnmatch.fnmatchcase(str(ev.get("event")), k) for k in kinds)


Rows = list[tuple[dict[str, Any], lifecycle.Cursor]]


def tail(truth: TruthFile, limit: int, kinds: list[str] | None) -> tuple[Rows, lifecycle.Cursor]:
    """The last `limit` wanted events, oldest first, each with its cursor, and the cursor after the last whole line."""
    found: Rows = []
    with truth._reading() as opened:
        if opened is None:
            return [], lifecycle.parse_cursor(truth, "start")
        fd, end, _settled = opened
        inode = os.fstat(fd).st_ino
        pos, carry = end, b""  # carry: the bytes from pos on not yet taken as whole lines
        through: int | None = None  # just past the last newline: a line not yet finished is not given
        while pos > 0 and len(found) < limit:
            size = min(TAIL_BLOCK, pos)
            pos -= size
            data = os.pread(fd, size, pos) + carry  # the bytes [pos, pos + len(data))
            if through is None:
                last_nl = data.rfind(b"\n")
                if last_nl < 0:
                    carry = data
                    continue
                through = pos + last_nl + 1
                data = data[: last_nl + 1]
            if pos > 0:
                # The first line may begin before pos: keep it for the next block back.
                first_nl = data.find(b"\n")
                carry, data, base = data[: first_nl + 1], data[first_nl + 1 :], pos + first_nl + 1
            else:
                carry, base = b"", 0
            entries = []
            for raw in data.split(b"\n")[:-1]:
                base += len(raw) + 1
                entries.append((raw, base))
            for raw, line_end in reversed(entries):
                ev = parse(raw) if raw.strip() else None
                if ev is not None and _wanted(ev, kinds):
                    found.append((ev, lifecycle.Cursor(inode, line_end)))
                    if len(found) >= limit:
                        break
        next_cursor = lifecycle.Cursor(inode, through if through is not None else 0)
    found.reverse()
    return found, next_cursor


def read(truth: TruthFile, since: str, limit: int, kinds: list[str] | None) -> tuple[Rows, lifecycle.Cursor, bool]:
    """At most `limit` wanted events after `since`, paging through the record as far as it takes; the cursor to read
    on from (past filtered-out lines too, unless wanted events remain: then just past the last one given); whether
    wanted events remain."""
    cursor = lifecycle.parse_cursor(truth, since)
    out: Rows = []
    while True:
        rows, nxt = lifecycle.read_forward(truth, cursor, lifecycle.READ_LIMIT)
        for ev, c in rows:
            if not _wanted(ev, kinds):
                continue
            if len(out) >= limit:
                return out, out[-1][1], True
            out.append((ev, c))
        if len(rows) < lifecycle.READ_LIMIT:
            return out, nxt, False
        cursor = nxt


def _size(truth: TruthFile) -> tuple[int, int] | None:
    try:
        st = os.stat(truth.path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size


@op(
    "events.read",
    EventsRequest,
    "the record's events from a cursor, each with its cursor (wait_s: wait for one)",
    "drover events",
)
async def events_read(ctx: Context, req: EventsRequest) -> Result:
    truth = ctx.truth
    check_kinds(req.kinds)
    more: bool | None = None
    if req.since is None:
        rows, nxt = tail(truth, req.limit, req.kinds)
    else:
        deadline = time.monotonic() + req.wait_s
        since = req.since
        while True:
            seen = _size(truth)
            rows, nxt, more = read(truth, since, req.limit, req.kinds)
            since = str(nxt)  # past what was read, filtered out or not: a waiter never reads a line twice
            if rows or time.monotonic() >= deadline:
                break
            while _size(truth) == seen and time.monotonic() < deadline:
                await asyncio.sleep(LOOK_S)
    events = [{"cursor": str(c), "event": ev} for ev, c in rows]
    data: dict[str, Any] = {"events": events, "cursor": str(nxt), "record": str(truth.path)}
    if more is not None:
        data["more"] = more  # from a cursor: wanted events remain after `cursor`
    return Result(data)
