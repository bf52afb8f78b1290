"""Transcripts: Claude's and Codex's own records of a session, filtered on the host so only what matters
crosses the network."""

import glob
import json
import os
import re
from collections import deque
from datetime import datetime, timedelta, timezone
from typing import Any, Dict, Optional, Tuple

from . import claude
from . import protocol as P
from .discovery import Session
from .protocol import HelperError

ISO = re.compile(r"^(\d{4})-(\d\d)-(\d\d)[T ](\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?$")


def parse_ts(value: object) -> Optional[float]:
    """An ISO 8601 time as a Unix timestamp (by hand: Python 3.6 has no datetime.fromisoformat)."""
    if not isinstance(value, str):
        return None
    m = ISO.match(value.strip())
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    frac = float("0." + m.group(7)) if m.group(7) else 0.0
    zone = m.group(8)
    if zone in (None, "Z"):
        tz = timezone.utc
    else:
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        tz = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    try:
        return datetime(year, month, day, hour, minute, second, tzinfo=tz).timestamp() + frac
    except ValueError:
        return None


def _blocks_text(content: object, limit: int) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for block in content if isinstance(content, list) else []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind in ("text", "input_text", "output_text"):
            parts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            args = block.get("input") or {}
            brief = args.get("command") or args.get("file_path") or args.get("pattern") or json.dumps(args)[:120]
            parts.append("[tool %s: %s]" % (block.get("name"), str(brief)[:200]))
        elif kind == "tool_result":
            body = block.get("content")
            text = body if isinstance(body, str) else _blocks_text(body, limit)
            parts.append("[tool result: %s]" % text.strip()[:200])
    return "\n".join(p for p in parts if p)[:limit]


def _claude_event(rec: Dict[str, Any], limit: int) -> Optional[Dict[str, Any]]:
    kind = rec.get("type")
    if kind not in ("user", "assistant") or not isinstance(rec.get("message"), dict):
        return None
    origin = rec["origin"] if isinstance(rec.get("origin"), dict) else {}
    role = rec["message"].get("role", kind)
    if origin.get("kind") == "peer":
        role = "peer"
    text = origin.get("body") if role == "peer" else _blocks_text(rec["message"].get("content"), limit)
    content = rec["message"].get("content")
    if (
        role == "user"
        and isinstance(content, list)
        and all(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    ):
        role = "tool"
    event = {"time": rec.get("timestamp"), "role": role, "text": text or ""}
    if role == "peer":
        event["from"] = origin.get("name")
    return event


def _codex_event(rec: Dict[str, Any], limit: int) -> Optional[Dict[str, Any]]:
    payload = rec["payload"] if isinstance(rec.get("payload"), dict) else rec
    kind = payload.get("type")
    if kind == "message":
        return {
            "time": rec.get("timestamp"),
            "role": payload.get("role", "?"),
            "text": _blocks_text(payload.get("content"), limit),
        }
    if kind in ("function_call", "local_shell_call", "custom_tool_call"):
        brief = payload.get("arguments") or payload.get("action") or payload.get("input") or ""
        return {
            "time": rec.get("timestamp"),
            "role": "tool",
            "text": "[tool %s: %s]" % (payload.get("name", kind), str(brief)[:200]),
        }
    return None


ENVELOPE = re.compile(r"^<cross-session-message([^>]*)>\n(.*)\n</cross-session-message>$", re.S)
FROM_NAME = re.compile(r' from-name="([^"]*)"')


def _demo_event(rec: Dict[str, Any], limit: int) -> Optional[Dict[str, Any]]:
    """drover's demo agent (drover/demo_agent.py): its log is its transcript -- what it received, what it replied."""
    kind = rec.get("type")
    if kind not in ("message", "reply") or not isinstance(rec.get("t"), (int, float)):
        return None
    when = datetime.fromtimestamp(rec["t"], timezone.utc).isoformat()
    text = str(rec.get("text", ""))
    if kind == "reply":
        return {"time": when, "role": "assistant", "text": text[:limit]}
    m = ENVELOPE.match(text)
    if m is None:
        return {"time": when, "role": "user", "text": text[:limit]}
    sender = FROM_NAME.search(m.group(1))
    return {"time": when, "role": "peer", "text": m.group(2)[:limit], "from": sender.group(1) if sender else None}


def _demo_log(session: Session) -> Optional[str]:
    from . import procs

    argv = procs.argv_of(int(session.get("engine_pid") or 0)) or []
    if "--log" in argv and argv.index("--log") + 1 < len(argv):
        return argv[argv.index("--log") + 1]
    return None


def codex_home() -> str:
    return os.environ.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")


ROLLOUT_ID = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.jsonl$")


def _rollout_id(path: str) -> str:
    """The thread id a rollout's file name ends with ("" when it ends with none)."""
    found = ROLLOUT_ID.search(path)
    return found.group(1) if found else ""


def transcript_for(session: Optional[Session], target: str) -> Tuple[str, str]:
    """(path, engine) of the session's transcript: Claude's by sessionId, else a Codex rollout by id."""
    if session is not None and session["engine"] == "claude" and ("_record" in session or "_headless" in session):
        sid = session["_record"]["sessionId"] if "_record" in session else session["id"]
        hits = claude.transcripts(sid)
        if hits:
            return max(hits, key=os.path.getmtime), "claude"
        if "_headless" in session and os.path.isfile(os.path.join(session["_headless"], "stream.jsonl")):
            return os.path.join(session["_headless"], "stream.jsonl"), "claude"  # its entries are shaped alike
        raise HelperError(P.NO_TRANSCRIPT, "Claude session %s has no transcript yet" % sid)
    if session is not None and session["engine"] == "codex" and "_headless" in session:
        pattern = os.path.join(codex_home(), "sessions", "**", "rollout-*%s.jsonl" % glob.escape(session["id"]))
        found = sorted(glob.glob(pattern, recursive=True))
        if found:
            return found[-1], "codex"
        stream = os.path.join(session["_headless"], "stream.jsonl")
        if os.path.isfile(stream):
            return stream, "codex"
        raise HelperError(P.NO_TRANSCRIPT, "headless Codex thread %s has no rollout and no stream yet" % session["id"])
    if session is not None and session.get("thread"):
        # A Codex pane (or a thread no pane runs): its thread's rollout, under the CODEX_HOME its TUI runs with.
        from . import codex

        found = codex.records(session)
        if found:
            return found[-1], "codex"
        raise HelperError(
            P.NO_TRANSCRIPT, "Codex thread %s has no rollout yet (Codex writes it at the first message)" % session["thread"]
        )
    if session is not None and session["engine"] == "demo":
        log = _demo_log(session)
        if log and os.path.isfile(log):
            return log, "demo"
        raise HelperError(P.NO_TRANSCRIPT, "the demo agent %s keeps no log drover can read" % session["id"])
    if re.match(r"^[0-9a-f]{8}[0-9a-f-]*$", target):  # a rollout's id, or 8+ hex of it: never a name's substring
        pattern = os.path.join(codex_home(), "sessions", "**", "rollout-*%s*.jsonl" % glob.escape(target))
        # The id the file name ends with must start with the target: 8 hex digits from the middle of some other
        # rollout's id (or of its date) are no name for it.
        hits = [h for h in glob.glob(pattern, recursive=True) if _rollout_id(h).startswith(target)]
        if len(hits) == 1:
            return hits[0], "codex"
        if len(hits) > 1:
            raise HelperError(P.AMBIGUOUS_SESSION, "%r matches %d Codex rollouts" % (target, len(hits)))
    what = "%s (%s)" % (session["id"], session["engine"]) if session else repr(target)
    raise HelperError(P.NO_TRANSCRIPT, "no transcript for %s: drover reads Claude transcripts and Codex rollouts" % what)


def read(path: str, engine: str, args: Dict[str, Any]) -> Dict[str, Any]:
    last = max(1, int(args.get("last", 20)))
    roles = set(args.get("roles") or [])
    grep = re.compile(args["grep"], re.I) if args.get("grep") else None
    since = args.get("since")
    raw = bool(args.get("raw"))
    limit = int(args.get("max_chars", 4000))
    kept: deque = deque(maxlen=last)
    total = 0
    to_event = {"claude": _claude_event, "demo": _demo_event}.get(engine, _codex_event)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            event = to_event(rec, limit)
            if event is None:
                continue
            if roles and event["role"] not in roles:
                continue
            if since is not None:
                ts = parse_ts(event["time"])
                if ts is None or ts < float(since):
                    continue
            if grep and not grep.search(event["text"]):
                continue
            total += 1
            kept.append(rec if raw else event)
    return {"path": path, "engine": engine, "matched": total, "events": list(kept)}
