"""Lifecycle events: how a delegate's end is recorded (`done`, `failed`, `exited`, `stalled`), and the record read
forward from a cursor.

They are lines of the truth file like any other event, so one lock orders them with the messages they follow and
one reader (`drover events`) streams both.  Their shape:

    {"v": 1, "event": "done", "id": "lc_...", "ts": ..., "time": ..., "host": "box-a",
     "session": {"identity": ..., "id": ..., "name": ..., "pane": ..., "pid": ..., "server": ..., "engine": ...},
     "spawn": "spawn_..." | null, "once": KEY | absent, ...kind's own fields (summary, evidence, last_seen, ...)}

`session` carries every spelling drover knows of the session, so a reader finds the event by any of them.

**Once.**  A death seen by two watchers (the daemon's round and a cron `drover watch run`, say) must be told once.
`record_once` looks for the event's `once` key and writes it in the same hold of the file's one exclusive lock, so
of two writers racing on one key exactly one writes.

**Cursors.**  `INODE:OFFSET`: the byte offset just past an event's line in the record whose inode is INODE.  The
record only grows, so everything after a cursor is what happened after the event it names; a reader killed
between two events resumes from the last cursor it printed and misses and repeats nothing.  A cursor of another
record (the file was replaced: another inode, or an offset past its end) is refused, never replayed from a guess.
The cursor of "no record yet" (`0:0`, what `start` and `end` are before the first event) is valid: it means the
start of whatever record appears, so a follower can be started on a fresh home and given the first event.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from drover.errors import InvalidRequest
from drover.record import ACCEPTED_PREFIX, SESSION_KEYS, VERSION, now_iso, parse
from drover.remote import protocol as P
from drover.truth import TruthFile
from drover.truth_query import ORDER_SLACK_S

KINDS = ("done", "failed", "exited", "stalled")
TERMINAL = ("done", "failed", "exited")  # a session past one of these is not working on its task any more
READ_LIMIT = 10_000  # events per read at most: a reader of a huge record pages through it with the cursor


def new_event_id() -> str:
    return f"lc_{int(time.time() * 1000):012x}{secrets.token_hex(6)}"


def session_of(data: dict[str, Any]) -> dict[str, Any]:
    """The spellings of a session, as lifecycle events carry them (the keys of the record's `options.session`), from
    a flat description of it (a spawn row, a `ls` row, an `options.session`): only the keys that have a value.  A
    host's resolve answer, which nests the session, goes through `record.session_of` first."""
    return {k: data[k] for k in SESSION_KEYS if data.get(k) not in (None, "")}


def event(kind: str, *, host: str, session: dict[str, Any], spawn: str | None = None, **fields: Any) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"not a lifecycle event: {kind!r}")
    ts = time.time()
    ev: dict[str, Any] = {
        "v": VERSION,
        "event": kind,
        "id": new_event_id(),
        "ts": ts,
        "time": now_iso(ts),
        "host": host,
        "session": session_of(session),
        "spawn": spawn,
    }
    ev.update({k: v for k, v in fields.items() if v is not None})
    return ev


def record(truth: TruthFile, ev: dict[str, Any]) -> dict[str, Any]:
    truth.append(ev)
    return ev


def record_once(
    truth: TruthFile,
    ev: dict[str, Any],
    key: str,
    since_ts: float | None = None,
    stands: Callable[[dict[str, Any]], bool] | None = None,
    needles: tuple[bytes, ...] = (),
) -> tuple[dict[str, Any], bool]:
    """Write `ev` with `once` = key unless an event with that key is already in the record: (the event that
    stands, whether it was written now).  The look and the write are one hold of the exclusive lock.

    `since_ts`: no event with this key can be older (the spawn it is about was requested then), so the look stops
    there instead of reading the whole record.  `stands`: another event that makes this one moot (a `done` about
    the session an `exited` would report), looked for in the same hold, among the lines holding one of `needles`."""
    ev = {**ev, "once": key}
    needle = key.encode("utf-8", "surrogatepass")
    cutoff = None if since_ts is None else since_ts - ORDER_SLACK_S

    def skip(raw: bytes) -> bool:
        # Lines without the key are passed over unparsed; with a time bound, accepted lines are parsed too, for
        # their time (they carry the sender's clock in file order, so the first one older than the bound ends it).
        if needle in raw or any(n in raw for n in needles):
            return False
        return cutoff is None or not raw.startswith(ACCEPTED_PREFIX)

    with truth.locked() as fd:
        for old in truth.backward(fd=fd, skip=skip):
            if old.get("once") == key or (stands is not None and stands(old)):
                return old, False
            if cutoff is not None and old["event"] == "accepted" and old["ts"] < cutoff:
                break
        truth._write(fd, ev)
    return ev, True


def matches(ev: dict[str, Any], host: str | None, spellings: Iterable[str]) -> bool:
    """Is this lifecycle event about the session named by any of `spellings` (on `host`, when given)?"""
    if host is not None and ev.get("host") != host:
        return False
    session = ev.get("session")
    if not isinstance(session, dict):
        return False
    wanted = {str(s) for s in spellings if s not in (None, "")}
    return any(str(session.get(k)) in wanted for k in SESSION_KEYS if session.get(k) not in (None, ""))


def latest(
    truth: TruthFile,
    host: str | None,
    spellings: Iterable[str],
    kinds: Iterable[str] = TERMINAL,
    since_ts: float | None = None,
) -> dict[str, Any] | None:
    """The newest lifecycle event of one of `kinds` about that session, or None; read backwards from the end,
    stopping at `since_ts` (e.g. the session's start: an event before it is about a session the name once meant)."""
    wanted = list(spellings)
    kinds = tuple(kinds)
    needles = tuple(f'"event":"{k}"'.encode() for k in kinds)
    for ev in truth.backward(skip=lambda raw: not any(n in raw for n in needles)):
        if since_ts is not None and ev["ts"] < since_ts:
            return None
        if ev.get("event") in kinds and matches(ev, host, wanted):
            return ev
    return None


# -- reading forward from a cursor ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cursor:
    inode: int
    offset: int

    def __str__(self) -> str:
        return f"{self.inode}:{self.offset}"


NO_RECORD = Cursor(0, 0)  # the cursor given while there is no truth file yet


def _bad_cursor(text: str, why: str) -> InvalidRequest:
    return InvalidRequest(
        f"the cursor {text!r} {why}",
        code=P.INVALID_REQUEST,
        hint="give a cursor drover printed for this record, or `start` (from the beginning) or `end` (only what comes next)",
    )


def _stat(truth: TruthFile) -> os.stat_result | None:
    try:
        return os.stat(truth.path)
    except FileNotFoundError:
        return None


def parse_cursor(truth: TruthFile, text: str | None) -> Cursor:
    """`start`, `end`, or INODE:OFFSET of this record; anything else, or a cursor of another record, is an error."""
    st = _stat(truth)
    inode, size = (st.st_ino, st.st_size) if st is not None else (0, 0)
    if text in (None, "", "start"):
        return Cursor(inode, 0)
    if text == "end":
        return Cursor(inode, size)
    assert text is not None
    head, sep, tail = text.partition(":")
    if not sep or not head.isdigit() or not tail.isdigit() or len(head) > 20 or len(tail) > 20:
        raise _bad_cursor(text, "is not INODE:OFFSET, start or end")
    cur = Cursor(int(head), int(tail))
    if cur == NO_RECORD:
        return cur  # "no record yet": the start of whichever record there is now (see the module's doc)
    if st is None or cur.inode != inode:
        raise _bad_cursor(text, "is of another record (the truth file was replaced or moved)")
    if cur.offset > size:
        raise _bad_cursor(text, f"points past the end of the record ({size} bytes): it is of another record")
    return cur


def read_forward(truth: TruthFile, cursor: Cursor, limit: int = READ_LIMIT) -> tuple[list[tuple[dict[str, Any], Cursor]], Cursor]:
    """The well-formed events after `cursor`, each with the cursor just past it, and the cursor to read on from.

    Only whole lines are taken: a line a writer has not finished is left for the next read, so the cursor never
    stands inside a line.  A line that is not a well-formed event is stepped over (its bytes are past the cursor).
    At most `limit` events; the returned cursor then stands after the last one given."""
    out: list[tuple[dict[str, Any], Cursor]] = []
    with truth._reading() as opened:
        if opened is None:
            return out, cursor
        fd, end, _settled = opened
        if os.fstat(fd).st_ino != cursor.inode and cursor.offset:
            raise _bad_cursor(str(cursor), "is of another record (the truth file was replaced while reading)")
        inode = os.fstat(fd).st_ino
        pos = cursor.offset  # NO_RECORD (0:0): the record that appeared since, from its start
        carry = b""
        while pos < end and len(out) < limit:
            block = os.pread(fd, min(1 << 20, end - pos), pos)
            if not block:
                break
            data = carry + block
            start = 0
            base = pos - len(carry)
            while len(out) < limit:
                nl = data.find(b"\n", start)
                if nl < 0:
                    break
                raw = data[start:nl]
                start = nl + 1
                if raw.strip():
                    ev = parse(raw)
                    if ev is not None:
                        out.append((ev, Cursor(inode, base + start)))
            pos += len(block)
            carry = data[start:]
            if len(out) >= limit:
                return out, out[-1][1]
        last = out[-1][1] if out else None
        # Past the last event given: every whole line read (malformed ones too), never a line not yet finished.
        through = pos - len(carry)
        next_cursor = Cursor(inode, max(through, last.offset if last else cursor.offset))
    return out, next_cursor
