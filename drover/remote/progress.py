"""The last progress a session shows: the newest timestamped entry of the engine's own record (Claude's transcript,
a Codex rollout, the demo agent's log), else the pane's last output (tmux's window_activity).

What is not progress, and why:
- Claude's model calls: Claude Code 2.1 writes an `api-request` entry (and `api-request-shape`/`-blob`) for every
  attempt of a call, so a 529 "overloaded" loop writes one every few seconds while the turn goes nowhere -- the
  same request again (its `requestDigest` repeats).  Its `system` / `api_error` entries, where written, likewise.
  They are evidence (`requests`, `retries`, `last_request`, `last_retry`), never progress, or a worker stuck in a
  retry loop would look fresh for as long as the loop runs.  A call that hangs shows the same way: the request,
  and nothing after it.
- Claude's `queue-operation` entries: a message arriving for the session, not the session doing anything.
- An entry stamped in the future (past FUTURE_SLACK_S of the host's clock): a clock that jumped or a forged line
  would otherwise keep a session looking fresh until that time comes.  It is stepped over and counted
  (`future_entries`), and the entry before it stands.

Only the file's tail is read (TAIL_BYTES, doubled up to MAX_TAIL_BYTES for long lines): `ls` asks this of every
session, and a transcript can be hundreds of megabytes.
"""

import json
import os
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

FUTURE_SLACK_S = 120.0  # a host's clock and the engine's may differ a little; more than this is not a time to trust
TAIL_BYTES = 64 * 1024
MAX_TAIL_BYTES = 8 * 1024 * 1024
RETRY_KINDS = (("system", "api_error"),)  # (type, subtype) of Claude's retry entries
REQUEST = "api-request"  # one model call's attempt (Claude Code 2.1): a retry repeats its requestDigest
NOT_PROGRESS = ("api-request-shape", "api-request-blob", "queue-operation")


def _tails(path: str) -> Iterator[Tuple[List[bytes], bool]]:
    """The whole lines at the end of `path`, oldest first, over a window that doubles on each next(); with whether
    the window holds the whole file.  The first line of a window that starts inside one is left out, and so is a
    last line a writer has not finished (no newline yet)."""
    try:
        size = os.path.getsize(path)
    except OSError:
        return
    want = TAIL_BYTES
    with open(path, "rb") as f:
        while True:
            start = max(0, size - want)
            f.seek(start)
            data = f.read(size - start)
            lines = data.split(b"\n")[:-1]  # the piece after the last newline is not a whole line
            if start > 0:
                lines = lines[1:]  # begins inside a line
            yield [ln for ln in lines if ln.strip()], start == 0 or want >= MAX_TAIL_BYTES
            if start == 0 or want >= MAX_TAIL_BYTES:
                return
            want *= 2


def _entry_time(rec: Dict[str, Any], engine: str) -> Optional[float]:
    if engine == "demo":
        t = rec.get("t")
        return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None
    from .transcripts import parse_ts

    return parse_ts(rec.get("timestamp"))


def _kind(rec: Dict[str, Any], engine: str) -> str:
    if engine == "codex" and isinstance(rec.get("payload"), dict):
        return "%s/%s" % (rec.get("type"), rec["payload"].get("type"))
    sub = rec.get("subtype")
    return "%s/%s" % (rec.get("type"), sub) if sub else str(rec.get("type"))


def scan(path: str, engine: str, now: Optional[float] = None) -> Dict[str, Any]:
    """What the record's tail says: its newest progress entry (time, kind), the retries after it, entries from the
    future.  Pure reading: no state is decided here.  The window grows until it holds a progress entry."""
    now = time.time() if now is None else now
    out = {}  # type: Dict[str, Any]
    for lines, last in _tails(path):
        out = _scan_lines(lines, engine, now)
        if out["last_progress"] is not None or last:
            break
    if not out:
        out = _scan_lines([], engine, now)
    out["path"] = path
    return out


def _scan_lines(lines: List[bytes], engine: str, now: float) -> Dict[str, Any]:
    out = {
        "last_progress": None,
        "entry": None,
        "retries": 0,
        "last_retry": None,
        "requests": 0,
        "last_request": None,
        "future_entries": 0,
    }  # type: Dict[str, Any]
    digests = []  # type: List[str]
    for raw in reversed(lines):
        try:
            rec = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            continue
        if not isinstance(rec, dict):
            continue
        ts = _entry_time(rec, engine)
        if ts is None:
            continue  # an entry with no time (a title, a summary) says nothing about when
        if ts > now + FUTURE_SLACK_S:
            out["future_entries"] += 1
            continue
        if (rec.get("type"), rec.get("subtype")) in RETRY_KINDS:
            out["retries"] += 1
            if out["last_retry"] is None:
                err = rec["error"] if isinstance(rec.get("error"), dict) else {}
                out["last_retry"] = {
                    "time": ts,
                    "attempt": rec.get("retryAttempt"),
                    "max": rec.get("maxRetries"),
                    "status": err.get("status"),
                }
            continue
        if engine == "claude" and rec.get("type") == REQUEST:
            out["requests"] += 1
            if out["last_request"] is None:
                out["last_request"] = ts
            if isinstance(rec.get("requestDigest"), str):
                digests.append(rec["requestDigest"])
            continue
        if engine == "claude" and rec.get("type") in NOT_PROGRESS:
            continue
        out["last_progress"] = ts
        out["entry"] = _kind(rec, engine)
        break
    out["retries"] += len(digests) - len(set(digests))  # the same request sent again
    return out


def _record_of(session: Dict[str, Any]) -> Tuple[Optional[str], Optional[str]]:
    """(path, engine) of the record the session's engine keeps, or (None, None)."""
    from . import transcripts
    from .protocol import HelperError

    try:
        path, engine = transcripts.transcript_for(session, "")
    except HelperError:
        return None, None
    except OSError:
        return None, None
    return path, engine


def of(session: Dict[str, Any], now: Optional[float] = None) -> Dict[str, Any]:
    """The session's progress evidence: {last_progress, source, ...}.  `source` says where the time came from:
    `transcript` (Claude), `rollout` (Codex), `log` (the demo agent), `pane` (tmux's last output), or None."""
    path, engine = _record_of(session)
    if path is not None and engine is not None:
        found = scan(path, engine, now)
        found["source"] = {"claude": "transcript", "codex": "rollout", "demo": "log"}.get(engine, engine)
        if found["last_progress"] is not None or engine != "demo":
            # Where the engine records progress, its record is the word: silence there is no progress, and the
            # pane's redraws (a spinner) are not taken for it.  Only the demo agent's log, which holds messages
            # alone, gives way to the pane when it is still empty.
            return found
    from . import discovery

    pane = discovery.pane_of(session) or {}
    since = pane.get("since")
    return {
        "source": "pane" if isinstance(since, int) else None,
        "last_progress": since if isinstance(since, int) else None,
        "entry": "output" if isinstance(since, int) else None,
        "retries": 0,
        "last_retry": None,
        "requests": 0,
        "last_request": None,
        "future_entries": 0,
    }
