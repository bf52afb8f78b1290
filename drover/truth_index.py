"""An index beside the truth file, for the filters a backward scan answers slowly: `drover log --pending`,
`--actor`, `--target`, `--host`, `--outcome` whose matches are few and far back (or none, so that the scan reads
the whole file).  `truth.index` (SQLite, from the stdlib) holds, per accepted event, its offset in the file, its
id, time, actor, host, target and latest outcome; every spelling of its session (`names`: the target as
addressed, `options.session`, the latest outcome's session; drover/record.py `spellings`); the offsets of the
outcome lines folded into it; the offsets of malformed lines.  It is a cache of the file, never the record:

- it covers the file up to `upto`, stored with the file's inode and digests of the DIGEST_SPAN bytes at the start
  and before `upto`.  A query first catches it up from `upto` to the end, under SQLite's write lock (concurrent
  readers index each line once, in transactions of BATCH lines, so a crash loses at most a batch's progress); a
  file that was replaced, cut or rewritten (the inode or a digest differs) is indexed again from its start.
- an answer is read back from the file: every accepted and outcome line it uses is parsed again and must be the
  event the index named, else the index is dropped and built again, once.
- any trouble (a read-only home, a full disk, a corrupt or unsafe index file, a writer holding the file's lock
  past LOCK_WAIT_S) returns None: the caller scans the file, slower, with the same answer.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import stat
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from drover.errors import TruthFileError
from drover.record import ID_PREFIX, Message, Query, ReadStats, may_have_arrived, message_matches, parse, spellings

INDEX = "truth.index"
FORMAT = 2  # bump when the schema or what is indexed changes (2: `names`): an index of another format is rebuilt
DIGEST_SPAN = 4096
BATCH = 10000  # lines per transaction while catching up
READ = 1 << 20
NAMES_HELD = 4096  # spellings held before they are written (within the batch's transaction)
BUSY_S = 60.0  # how long a reader waits for another one that is catching the index up

log = logging.getLogger("drover.truth")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v);
CREATE TABLE IF NOT EXISTS msgs (off INTEGER PRIMARY KEY, len INTEGER NOT NULL, id TEXT NOT NULL, ts REAL NOT NULL,
    actor TEXT NOT NULL, host TEXT NOT NULL, target TEXT NOT NULL, outcome TEXT);
CREATE INDEX IF NOT EXISTS msgs_id ON msgs (id, off);
CREATE INDEX IF NOT EXISTS msgs_actor ON msgs (actor, off);
CREATE INDEX IF NOT EXISTS msgs_host ON msgs (host, off);
CREATE INDEX IF NOT EXISTS msgs_target ON msgs (target, off);
CREATE INDEX IF NOT EXISTS msgs_outcome ON msgs (outcome, off);
CREATE TABLE IF NOT EXISTS outs (acc INTEGER, off INTEGER, len INTEGER NOT NULL, PRIMARY KEY (acc, off)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS bad (off INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS names (name TEXT NOT NULL, off INTEGER NOT NULL, src INTEGER NOT NULL, id INTEGER NOT NULL,
    PRIMARY KEY (name, off, src)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS names_off ON names (off, src);
"""


class Record(Protocol):
    """What the index needs of `TruthFile`."""

    home: Path

    def _reading(self) -> AbstractContextManager[tuple[int, int, bool] | None]: ...
    def _open_home(self, create: bool) -> int | None: ...
    def _check(self, st: os.stat_result, what: Path, kind: str) -> None: ...


class Stale(Exception):
    """The index named a line that is not what the file holds there."""


def _connect(truth: Record) -> sqlite3.Connection | None:
    """The index, opened as the record is (relative to the checked home, no link followed, a regular file of
    yours that nobody else can write), or None when that cannot be."""
    try:
        dfd = truth._open_home(create=False)
    except TruthFileError:
        return None
    if dfd is None:
        return None
    try:
        fd = os.open(INDEX, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600, dir_fd=dfd)
    except OSError as exc:
        log.debug("drover: no index (%s); scanning the file", exc)
        return None
    finally:
        os.close(dfd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        truth._check(st, truth.home / INDEX, "index")
    except TruthFileError as exc:
        log.debug("drover: not using the index: %s", exc.message)
        return None
    finally:
        os.close(fd)
    conn = sqlite3.connect(str(truth.home / INDEX), timeout=BUSY_S, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")
    return conn


def _digest(fd: int, start: int, end: int) -> str:
    return hashlib.sha256(os.pread(fd, max(0, end - start), start)).hexdigest()


def _identity(fd: int, upto: int) -> dict[str, Any]:
    st = os.fstat(fd)
    return {
        "format": FORMAT,
        "dev": st.st_dev,
        "ino": st.st_ino,
        "upto": upto,
        "head": _digest(fd, 0, min(upto, DIGEST_SPAN)),
        "tail": _digest(fd, max(0, upto - DIGEST_SPAN), upto),
    }


def _covered(conn: sqlite3.Connection, fd: int, end: int) -> int:
    """How far the index covers this file; 0, with the index emptied, when it is of another file or state.
    It may cover more than `end`: another reader, who found the file longer, caught it up."""
    meta = dict(conn.execute("SELECT k, v FROM meta").fetchall())
    upto = meta.get("upto")
    if isinstance(upto, int) and 0 <= upto <= max(end, os.fstat(fd).st_size) and meta == _identity(fd, upto):
        return upto
    for table in ("meta", "msgs", "outs", "bad", "names"):
        conn.execute(f"DELETE FROM {table}")
    return 0


def _lines(fd: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
    """(offset, line without its newline) from `start` to `end`; a last line without a newline ends at `end`."""
    pos, carry, carry_at = start, b"", start
    while pos < end:
        block = os.pread(fd, min(READ, end - pos), pos)
        if not block:
            break
        pos += len(block)
        parts = (carry + block).split(b"\n")
        carry = parts.pop()
        at = carry_at
        for raw in parts:
            yield at, raw
            at += len(raw) + 1
        carry_at = at
    if carry:
        yield carry_at, carry


def _index(conn: sqlite3.Connection, fd: int, start: int, end: int) -> int:
    """Index the lines from `start` on, BATCH of them at most, in the open transaction; return where it stopped."""
    rows: list[list[Any]] = []
    recent: dict[str, list[Any]] = {}  # id -> its latest accepted row of this batch (not yet in the table)
    outs: list[tuple[int, int, int]] = []
    updates: list[tuple[str, int]] = []
    bad: list[tuple[int]] = []
    names: list[tuple[str, int, int, int]] = []
    out_names: dict[int, list[tuple[str, int, int, int]]] = {}  # accepted offset -> its latest outcome's spellings
    upto = start

    def flush_names() -> None:
        # Written as they come, not held for the batch: a line names its session up to a dozen ways.
        conn.executemany("INSERT OR IGNORE INTO names VALUES (?, ?, ?, ?)", names)
        # The newest outcome names the session (as the fold has it): an earlier outcome's spellings go.
        conn.executemany("DELETE FROM names WHERE off = ? AND src = 1", [(acc,) for acc in out_names])
        conn.executemany("INSERT OR IGNORE INTO names VALUES (?, ?, ?, ?)", [r for rs in out_names.values() for r in rs])
        names.clear()
        out_names.clear()

    for n, (off, raw) in enumerate(_lines(fd, start, end)):
        if n == BATCH:
            break
        if len(names) + 8 * len(out_names) > NAMES_HELD:
            flush_names()
        upto = min(end, off + len(raw) + 1)
        if not raw.strip():
            continue
        ev = parse(raw)
        if ev is None:
            bad.append((off,))
            continue
        kind = ev["event"]
        if kind == "accepted":
            row = [off, len(raw), ev["id"], ev["ts"], ev.get("actor") or "", ev.get("host") or "", ev.get("target") or "", None]
            recent[ev["id"]] = row
            rows.append(row)
            names.extend(_names(off, 0, ev, None))
        elif kind == "outcome":
            # An outcome belongs to the latest accepted event of its id before it, as the backward fold has it.
            mine = recent.get(ev["id"])
            if mine is not None:
                mine[7] = ev["outcome"]
                outs.append((mine[0], off, len(raw)))
                out_names[mine[0]] = _names(mine[0], 1, {}, ev)
                continue
            found = conn.execute("SELECT off FROM msgs WHERE id = ? ORDER BY off DESC LIMIT 1", (ev["id"],)).fetchone()
            if found is not None:
                updates.append((ev["outcome"], found[0]))
                outs.append((found[0], off, len(raw)))
                out_names[found[0]] = _names(found[0], 1, {}, ev)
    conn.executemany("INSERT INTO msgs VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.executemany("UPDATE msgs SET outcome = ? WHERE off = ?", updates)
    conn.executemany("INSERT INTO outs VALUES (?, ?, ?)", outs)
    conn.executemany("INSERT INTO bad VALUES (?)", bad)
    flush_names()
    conn.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", _identity(fd, upto).items())
    return upto


def _names(off: int, src: int, acc: dict[str, Any], out: dict[str, Any] | None) -> list[tuple[str, int, int, int]]:
    """Rows of the names table: each spelling of the message at `off`, from its accepted event (src 0) or its
    outcome (src 1); `id` 1 for an id a prefix may name."""
    spelled, ids = spellings(acc, out)
    return [(name, off, src, int(name in ids)) for name in spelled]


def _catch_up(conn: sqlite3.Connection, fd: int, end: int) -> None:
    conn.executescript(SCHEMA)
    while True:
        conn.execute("BEGIN IMMEDIATE")  # one reader at a time indexes; the others wait, then find it done
        try:
            upto = _covered(conn, fd, end)
            if upto < end:
                upto = _index(conn, fd, upto, end)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if upto >= end:
            return


def _event(fd: int, off: int, length: int, kind: str, msg_id: str) -> dict[str, Any]:
    ev = parse(os.pread(fd, length, off))
    if ev is None or ev["event"] != kind or ev["id"] != msg_id:
        raise Stale(f"offset {off}: not the {kind} event of {msg_id}")
    return ev


def _message(conn: sqlite3.Connection, fd: int, off: int, length: int, msg_id: str) -> Message:
    """The message as the file has it: its accepted line, and its outcome lines folded in (the newest wins)."""
    m = Message.accepted(_event(fd, off, length, "accepted", msg_id))
    outs = [
        _event(fd, o, n, "outcome", msg_id)
        for o, n in conn.execute("SELECT off, len FROM outs WHERE acc = ? ORDER BY off", (off,)).fetchall()
    ]
    if outs:
        m.apply(outs[-1])
        m.uncertain = any(may_have_arrived(ev) for ev in outs) or "attempt" in outs[0]
    return m


def _matches(m: Message, since_ts: float | None, filters: dict[str, Any], host_in: Callable[[str], bool] | None) -> bool:
    return not (
        (since_ts is not None and m.ts < since_ts)
        or any(filters.get(k) and getattr(m, k) != filters[k] for k in ("host", "actor", "outcome"))
        or (filters.get("target") and not message_matches(filters["target"], m))
        or (filters.get("pending") and m.outcome is not None)
        or (host_in is not None and not host_in(m.host))
    )


def _answer(
    conn: sqlite3.Connection,
    fd: int,
    stats: ReadStats,
    limit: int,
    since_ts: float | None,
    cutoff: float | None,
    filters: dict[str, Any],
    host_in: Callable[[str], bool] | None,
) -> Query:
    where: list[str] = ["off > ?"]
    args: list[Any] = [-1]
    if since_ts is not None:
        # The scan stops at the first accepted event before the window's slack; so does this.
        stop = conn.execute("SELECT MAX(off) FROM msgs WHERE ts < ?", (cutoff,)).fetchone()[0]
        args[0] = -1 if stop is None else stop
        where.append("ts >= ?")
        args.append(since_ts)
    stop_at = args[0]
    for column in ("host", "actor", "outcome"):
        if filters.get(column):
            where.append(f"{column} = ?")
            args.append(filters[column])
    target = filters.get("target")
    if target:
        # Any spelling of the session: exactly, or (8+ hex characters) as the prefix of one of its ids.
        spelled = "name = ?"
        args.append(target)
        if ID_PREFIX.match(target):
            spelled += " OR (id = 1 AND name >= ? AND name < ?)"
            args.extend([target, target + "\U0010ffff"])
        where.append(f"off IN (SELECT off FROM names WHERE {spelled})")
    if filters.get("pending"):
        where.append("outcome IS NULL")
    if host_in is not None:
        hosts = [h for (h,) in conn.execute("SELECT DISTINCT host FROM msgs") if host_in(h)]
        where.append(f"host IN ({','.join('?' * len(hosts))})" if hosts else "0")
        args.extend(hosts)
    sql = f"SELECT off, len, id FROM msgs WHERE {' AND '.join(where)} ORDER BY off DESC LIMIT ?"
    rows = conn.execute(sql, [*args, limit + 1]).fetchall()
    found = [_message(conn, fd, *row) for row in rows[:limit]]
    for m in found:  # what the index says of a message is checked against the file's lines, which are the record
        if not _matches(m, since_ts, filters, host_in):
            raise Stale(f"{m.id} does not match the query the index gave it for")
    complete = len(rows) <= limit
    if not complete:
        _event(fd, rows[limit][0], rows[limit][1], "accepted", rows[limit][2])
        stop_at = rows[limit][0]
    # Malformed lines in the stretch of the file the answer covers, as the scan counts those it reads.
    stats.skipped = conn.execute("SELECT COUNT(*) FROM bad WHERE off > ?", (stop_at,)).fetchone()[0]
    found.reverse()
    return Query(found, len(found) + (0 if complete else 1), complete, stats)


def query(
    truth: Record,
    stats: ReadStats,
    limit: int,
    since_ts: float | None,
    cutoff: float | None,
    filters: dict[str, Any],
    host_in: Callable[[str], bool] | None,
) -> Query | None:
    """The answer `Queries.query` gives, from the index caught up to the file's end; None when the index cannot
    be used (the caller scans instead)."""
    with truth._reading() as opened:
        if opened is None:
            return None
        fd, end, settled = opened
        if not settled:
            return None  # a writer holds the lock: what follows its line is not settled enough to index
        for attempt in (1, 2):
            conn = None
            try:
                conn = _connect(truth)
                if conn is None:
                    return None
                _catch_up(conn, fd, end)
                conn.execute("BEGIN")  # one snapshot for the whole answer, whatever another reader commits
                found = _answer(conn, fd, stats, limit, since_ts, cutoff, filters, host_in)
                conn.execute("COMMIT")
                return found
            except sqlite3.OperationalError as exc:  # locked past BUSY_S, a full disk, a read-only file
                log.debug("drover: index of %s unusable: %s", truth.home, exc)
                return None
            except (Stale, sqlite3.DatabaseError) as exc:  # it lied, or it is not a database: build it anew
                log.debug("drover: index of %s unusable (%s), attempt %d", truth.home, exc, attempt)
                if conn is not None:
                    conn.close()
                    conn = None
                if attempt == 1:
                    _drop(truth)
            except (sqlite3.Error, OSError) as exc:
                log.debug("drover: index of %s unusable: %s", truth.home, exc)
                return None
            finally:
                if conn is not None:
                    conn.close()
    return None


def _drop(truth: Record) -> None:
    """Remove the index (and a journal SQLite may have left): the next query builds it from the file."""
    try:
        dfd = truth._open_home(create=False)
    except TruthFileError:
        return
    if dfd is None:
        return
    try:
        for name in (INDEX, INDEX + "-journal"):
            try:
                os.unlink(name, dir_fd=dfd)
            except OSError:
                pass
    finally:
        os.close(dfd)
