"""The truth file: the local, append-only record of every message and what became of it.

`$DROVER_HOME/truth.jsonl` (default `$XDG_STATE_HOME/drover/truth.jsonl`), mode 0600, one JSON event a line.
Every line is appended with a single write under an exclusive lock and fsynced before drover reports, so
concurrent drover processes never interleave or lose a line.  A message gets its id and an `accepted` event
*before* any delivery is tried (write-ahead): a crash mid-send leaves an accepted event with no outcome, which
`drover log --pending` shows.

What it survives:

- a crash mid-write: a last line without its newline is noticed under the lock and the next append starts on a
  new line; a write that fails half-way (disk full) is taken back with ftruncate, so it leaves no fragment.
- lines drover did not write: anything that is not a JSON object with the fields of its kind, of the right types,
  is skipped and counted; readers report one warning with the count (`ReadStats.warning`), never a crash.
- a full disk or a read-only home: `TruthDiskFull` / `TruthUnwritable` (exit code 7).  Before a delivery that
  means nothing is sent; after one, `outcome` keeps the known outcome and returns (and logs) a warning.
- neighbours: the home directory must be yours and not writable by group or others (a symlink to it is followed
  only if you own the symlink); the file is opened relative to it with O_NOFOLLOW, and must be a regular file
  that you own, that group and others cannot write, and that has no other hard link; the `locks` folder beside
  it and its lock files are held to the same rules (drover/truth_home.py).  Anything else is `TruthUnsafe`, for
  readers and writers.

How it scales: readers go backwards from the end in chunks and stop as soon as they have their answer (the newest
N messages, the messages since a time, one id), so their cost follows what they return, not the file's size.  An
outcome event always comes after its accepted event, so reading backwards meets the outcome first.  File order
is time order up to the moment a writer waits for the lock; readers that stop at a time keep reading
ORDER_SLACK_S seconds further back to absorb that.  There is no index and no rotation.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from drover import paths
from drover.errors import TruthFileError
from drover.record import (  # noqa: F401 - Message and well_formed are part of this module's interface
    VERSION,
    Message,
    ReadStats,
    now_iso,
    parse,
    well_formed,
)
from drover.truth_home import NAME, SafeHome
from drover.truth_query import ORDER_SLACK_S, Queries

CHUNK = 1 << 16  # the first backward read; each next one doubles, up to MAX_CHUNK
MAX_CHUNK = 1 << 20
HEAD_CHARS = 1000  # what an oversize refusal keeps of the text (with its length and sha256)
LOCK_WAIT_S = 2.0  # a reader waits this long for a writer to finish its line, then reads what is there

log = logging.getLogger("drover.truth")


def default_home() -> Path:
    """The drover home (drover/paths.py says where)."""
    return Path(paths.home())


def new_message_id() -> str:
    """Sortable by time (milliseconds, hex) with 40 random bits: unique across processes and hosts."""
    return f"msg_{int(time.time() * 1000):012x}{secrets.token_hex(5)}"


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class TruthFile(SafeHome, Queries):
    def __init__(self, home: Path | None = None) -> None:
        self.home = home or default_home()
        self.path = self.home / NAME

    def _open(self, write: bool) -> int | None:
        """The file's fd, checked: O_RDWR|O_APPEND (created 0600) to write, O_RDONLY to read (None: no file yet)."""
        dfd = self._open_home(create=write)
        if dfd is None:
            return None
        try:
            if write:
                flags = os.O_RDWR | os.O_APPEND | os.O_CREAT
            else:
                flags = os.O_RDONLY
            try:
                # O_NONBLOCK: a FIFO planted under the name must not hang the open; set back below.
                fd = os.open(NAME, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600, dir_fd=dfd)
            except FileNotFoundError as exc:
                if write:
                    raise self._error(exc, "create") from None
                return None
            except OSError as exc:
                raise self._error(exc, "open for writing" if write else "open") from None
        finally:
            os.close(dfd)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._unsafe(self.path, "it is not a regular file", "remove it; drover creates the file itself")
            self._check(st, self.path, "file")
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    # -- writing -----------------------------------------------------------------------------------------------
    @contextmanager
    def locked(self) -> Iterator[int]:
        """The file open for appending (O_RDWR, so the holder can also read it), under the exclusive lock."""
        fd = self._open(write=True)
        assert fd is not None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing releases the lock

    @staticmethod
    def _encode(event: dict[str, Any]) -> bytes:
        return (json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "surrogatepass")

    def _write(self, fd: int, *events: dict[str, Any]) -> None:
        """Append whole lines with one write, under the lock the caller holds, and fsync.

        A last line without its newline (a writer that crashed mid-line) gets one first, so this event starts on
        a line of its own.  If the write or the fsync fails, the file is cut back to what it was: no fragment."""
        data = b"".join(self._encode(e) for e in events)
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
        except OSError as exc:
            raise self._error(exc, "read") from None
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass  # the fragment stays; the next writer starts a new line after it, readers skip it
            raise self._error(exc, "write to") from None

    def append(self, event: dict[str, Any]) -> None:
        with self.locked() as fd:
            self._write(fd, event)

    def accept(
        self,
        *,
        actor: str,
        host: str,
        target: str,
        text: str,
        options: dict[str, Any],
        max_stored_chars: int | None = None,
        check: Callable[[list[dict[str, Any]]], dict[str, Any] | None] | None = None,
        window_s: float = 0.0,
    ) -> tuple[str, dict[str, Any] | None]:
        """Write the `accepted` event; return the message id and, if `check` refused it, the refusal outcome.

        `check` sees the events of the last `window_s` seconds and runs under the same lock as the write, so
        limits counted from the file hold across concurrent processes.  A text longer than `max_stored_chars` (or
        refused as too large) is stored as its first HEAD_CHARS characters, its length and its sha256.

        Raises TruthDiskFull / TruthUnwritable / TruthUnsafe when the event cannot be written: nothing may be sent
        then.  A refusal is written with its accepted event in the same single write.
        """
        msg_id = new_message_id()
        ts = time.time()
        event: dict[str, Any] = {
            "v": VERSION,
            "event": "accepted",
            "id": msg_id,
            "time": now_iso(ts),
            "ts": ts,
            "actor": actor,
            "host": host,
            "target": target,
            "text_chars": len(text),
            "text_sha256": text_digest(text),
            "options": options,
        }
        try:
            with self.locked() as fd:
                refusal = None
                if check is not None:
                    stats = ReadStats(str(self.path))
                    refusal = check(self.recent(ts - window_s, stats=stats, fd=fd))
                    stats.warnings()
                oversize = max_stored_chars is not None and len(text) > max_stored_chars
                if oversize or (refusal is not None and refusal.get("code") == "too_large"):
                    event["text"] = text[:HEAD_CHARS]
                    event["text_truncated"] = True
                else:
                    event["text"] = text
                if refusal is not None:
                    self._write(fd, event, self._outcome_event(msg_id, refusal))
                else:
                    self._write(fd, event)
        except TruthFileError as exc:
            exc.message = f"nothing was sent (drover records a message before it sends it): {exc.message}"
            raise
        return msg_id, refusal

    @staticmethod
    def _outcome_event(msg_id: str, result: dict[str, Any]) -> dict[str, Any]:
        ts = time.time()
        event = {"v": VERSION, "event": "outcome", "id": msg_id, "time": now_iso(ts), "ts": ts}
        event.update({k: v for k, v in result.items() if v is not None})
        return event

    def outcome(self, msg_id: str, result: dict[str, Any]) -> dict[str, Any] | None:
        """Record what became of a message.  This comes after the delivery, so it never raises for the record's
        sake: when the line cannot be written it returns a warning (and logs it) and the caller keeps the outcome."""
        try:
            self.append(self._outcome_event(msg_id, result))
        except TruthFileError as exc:
            what = result.get("outcome") or "the outcome"
            warning = {
                "code": exc.code,
                "message": f"{what}, but the outcome of {msg_id} could not be recorded: {exc.message}; "
                "the record shows the message as pending",
                "hint": exc.hint,
                "id": msg_id,
            }
            log.warning("drover: warning: %s (%s)", warning["message"], exc.hint)
            return warning
        return None

    # -- reading -----------------------------------------------------------------------------------------------
    @contextmanager
    def _reading(self) -> Iterator[tuple[int, int, bool] | None]:
        """(fd, end, settled) for reading, or None when there is no file.  `end` is the size under a shared lock,
        so every line before it is whole (settled), unless a writer held the lock for LOCK_WAIT_S."""
        fd = self._open(write=False)
        if fd is None:
            yield None
            return
        try:
            settled = False
            deadline = time.monotonic() + LOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    settled = True
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.005)
                except OSError:
                    break  # a file system without locks: read what is there
            end = os.fstat(fd).st_size
            if settled:
                fcntl.flock(fd, fcntl.LOCK_UN)  # what is before `end` will not change: appends only
            yield fd, end, settled
        finally:
            os.close(fd)

    @staticmethod
    def _lines_backward(fd: int, end: int) -> Iterator[tuple[bytes, bool]]:
        """The lines before `end`, last first, each with whether a newline ends it (only the last may lack one)."""
        pos, chunk = end, CHUNK
        carry: list[bytes] = []  # the line that continues into the blocks already read, its pieces last first
        terminated = False  # the text after the file's last newline has none
        while pos > 0:
            size = min(chunk, pos)
            pos -= size
            chunk = min(chunk * 2, MAX_CHUNK)
            block = os.pread(fd, size, pos)
            if len(block) != size:
                return  # the file shrank under us (a failed write taken back): what was read is all there is
            cut = block.rfind(b"\n")
            if cut < 0:
                carry.append(block)
                continue
            carry.append(block[cut + 1 :])
            yield b"".join(reversed(carry)), terminated
            terminated = True
            lines = block[:cut].split(b"\n")
            carry = [lines[0]]
            for raw in reversed(lines[1:]):
                yield raw, True
        if carry:
            yield b"".join(reversed(carry)), terminated

    def _backward(
        self, stats: ReadStats, fd: int, end: int, settled: bool, skip: Callable[[bytes], bool] | None = None
    ) -> Iterator[dict[str, Any]]:
        for raw, terminated in self._lines_backward(fd, end):
            if skip is not None and skip(raw):
                continue
            if not raw.strip():
                continue
            ev = parse(raw)
            if ev is None:
                if terminated or settled:
                    stats.skipped += 1  # an unfinished last line while a writer held the lock is not counted
                continue
            yield ev

    def backward(
        self, stats: ReadStats | None = None, fd: int | None = None, skip: Callable[[bytes], bool] | None = None
    ) -> Iterator[dict[str, Any]]:
        """Well-formed events, newest first.  With `fd` (the one `locked()` gave), read under that lock; lines
        for which `skip(raw)` is true are passed over unparsed (and so uncounted)."""
        stats = stats if stats is not None else ReadStats(str(self.path))
        if fd is not None:
            yield from self._backward(stats, fd, os.fstat(fd).st_size, True, skip)
            return
        with self._reading() as opened:
            if opened is not None:
                yield from self._backward(stats, *opened, skip)

    def events(self, stats: ReadStats | None = None) -> Iterator[dict[str, Any]]:
        """Well-formed events, oldest first (the whole file, forwards)."""
        stats = stats if stats is not None else ReadStats(str(self.path))
        with self._reading() as opened:
            if opened is None:
                return
            fd, end, settled = opened
            with os.fdopen(os.dup(fd), "rb") as f:
                pos = 0
                for raw in f:
                    pos += len(raw)
                    if pos > end:
                        raw = raw[: len(raw) - (pos - end)]
                    terminated = raw.endswith(b"\n")
                    if raw.strip():
                        ev = parse(raw)
                        if ev is not None:
                            yield ev
                        elif terminated or settled:
                            stats.skipped += 1
                    if pos >= end:
                        break

    def recent(self, since_ts: float, stats: ReadStats | None = None, fd: int | None = None) -> list[dict[str, Any]]:
        """Events at or after since_ts, oldest first, read backwards from the end so old history costs nothing."""
        out: list[dict[str, Any]] = []
        cutoff = since_ts - ORDER_SLACK_S
        for ev in self.backward(stats, fd):
            ts = ev["ts"]
            if ts >= since_ts:
                out.append(ev)
            elif ts < cutoff and ev["event"] == "accepted":
                break  # accepted events carry the sender's clock in file order; other kinds may come late
        out.reverse()
        return out

    def messages(self, stats: ReadStats | None = None) -> list[Message]:
        """Every message, in the order they were accepted (a full forward scan: the reference for `query`)."""
        by_id: dict[str, Message] = {}
        for ev in self.events(stats):
            kind = ev["event"]
            if kind == "accepted":
                by_id[ev["id"]] = Message.accepted(ev)
            elif kind == "outcome" and ev["id"] in by_id:
                by_id[ev["id"]].apply(ev)
        return list(by_id.values())
