"""The truth file: the local, append-only record of every message and what became of it.

`$DROVER_HOME/truth.jsonl` (default `$XDG_STATE_HOME/drover/truth.jsonl`), mode 0600, one JSON event a line.
Every line is appended with a single write under an exclusive lock and fsynced before drover reports, so
concurrent drover processes never interleave or lose a line.  A message gets its id and an `accepted` event
*before* any delivery is tried (write-ahead): a crash mid-send leaves an accepted event with no outcome, which
`drover log --pending` shows.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = 1
TAIL_CHUNK = 1 << 20


def default_home() -> Path:
    env = os.environ.get("DROVER_HOME")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "drover"


def new_message_id() -> str:
    """Sortable by time (milliseconds, hex) with 40 random bits: unique across processes and hosts."""
    return f"msg_{int(time.time() * 1000):012x}{secrets.token_hex(5)}"


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def now_iso(ts: float | None = None) -> str:
    ts = time.time() if ts is None else ts
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


@dataclass
class Message:
    """A message folded from its events: what was asked and what became of it."""

    id: str
    time: str
    ts: float
    actor: str
    host: str
    target: str
    text: str
    text_chars: int
    options: dict[str, Any] = field(default_factory=dict)
    outcome: str | None = None
    lane: str | None = None
    detail: str | None = None
    code: str | None = None
    outcome_time: str | None = None
    session: dict[str, Any] | None = None
    redirected_from: str | None = None

    @property
    def pending(self) -> bool:
        return self.outcome is None

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["pending"] = self.pending
        return out


class TruthFile:
    def __init__(self, home: Path | None = None) -> None:
        self.home = home or default_home()
        self.path = self.home / "truth.jsonl"

    # -- writing ---------------------------------------------------------------------------------------------
    def _open(self) -> int:
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return fd

    @contextmanager
    def locked(self) -> Iterator[int]:
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # closing releases the lock

    @staticmethod
    def _write(fd: int, event: dict[str, Any]) -> None:
        data = (json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8", "surrogatepass")
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fsync(fd)

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
        limits counted from the file hold across concurrent processes.
        """
        msg_id = new_message_id()
        ts = time.time()
        stored = text
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
        if max_stored_chars is not None and len(text) > max_stored_chars:
            stored = text[:max_stored_chars]
            event["text_truncated"] = True
        event["text"] = stored
        with self.locked() as fd:
            refusal = check(self.recent(ts - window_s)) if check else None
            self._write(fd, event)
            if refusal is not None:
                self._write(fd, self._outcome_event(msg_id, refusal))
        return msg_id, refusal

    @staticmethod
    def _outcome_event(msg_id: str, result: dict[str, Any]) -> dict[str, Any]:
        ts = time.time()
        event = {"v": VERSION, "event": "outcome", "id": msg_id, "time": now_iso(ts), "ts": ts}
        event.update({k: v for k, v in result.items() if v is not None})
        return event

    def outcome(self, msg_id: str, result: dict[str, Any]) -> None:
        self.append(self._outcome_event(msg_id, result))

    # -- reading ---------------------------------------------------------------------------------------------
    def events(self) -> Iterator[dict[str, Any]]:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return
        with f:
            for raw in f:
                try:
                    event = json.loads(raw)
                except ValueError:
                    continue  # a torn line can only come from outside drover; skip it, keep the rest
                if isinstance(event, dict):
                    yield event

    def recent(self, since_ts: float) -> list[dict[str, Any]]:
        """Events newer than since_ts, read backwards from the end so old history costs nothing."""
        try:
            f = open(self.path, "rb")
        except FileNotFoundError:
            return []
        out: list[dict[str, Any]] = []
        with f:
            end = f.seek(0, os.SEEK_END)
            pos, tail = end, b""
            while pos > 0:
                start = max(0, pos - TAIL_CHUNK)
                f.seek(start)
                block = f.read(pos - start) + tail
                pos = start
                lines = block.split(b"\n")
                tail = lines.pop(0) if pos > 0 else b""
                done = False
                for raw in reversed(lines):
                    if not raw.strip():
                        continue
                    try:
                        event = json.loads(raw)
                    except ValueError:
                        continue
                    if float(event.get("ts", 0)) < since_ts:
                        done = True
                        break
                    out.append(event)
                if done:
                    break
        out.reverse()
        return out

    def messages(self) -> list[Message]:
        by_id: dict[str, Message] = {}
        for ev in self.events():
            kind, msg_id = ev.get("event"), ev.get("id")
            if not isinstance(msg_id, str):
                continue
            if kind == "accepted":
                by_id[msg_id] = Message(
                    id=msg_id,
                    time=str(ev.get("time", "")),
                    ts=float(ev.get("ts", 0)),
                    actor=str(ev.get("actor", "")),
                    host=str(ev.get("host", "")),
                    target=str(ev.get("target", "")),
                    text=str(ev.get("text", "")),
                    text_chars=int(ev.get("text_chars", 0)),
                    options=dict(ev.get("options") or {}),
                )
            elif kind == "outcome" and msg_id in by_id:
                m = by_id[msg_id]
                m.outcome = ev.get("outcome")
                m.lane = ev.get("lane")
                m.detail = ev.get("detail")
                m.code = ev.get("code")
                m.outcome_time = ev.get("time")
                m.session = ev.get("session")
                m.redirected_from = ev.get("redirected_from")
        return sorted(by_id.values(), key=lambda m: m.ts)
