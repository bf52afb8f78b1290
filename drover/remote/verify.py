"""Did it arrive?  Looked up in the receiver's own record, never assumed from silence or a paste.

- Claude Code: its transcript -- a peer record whose origin.msg_id is the id drover sent (inbox lane), or a turn
  whose text carries drover's message id (tmux lane: the envelope's from-session attribute).
- Codex: its rollouts under $CODEX_HOME/sessions written since the message was accepted, carrying drover's id.
- drover's demo agent: the log it keeps of what it received (its --log file).
- Anything else: no record drover can read, so arrival cannot be verified (and absence cannot be proven).

Also whether the text sits unsent in the pane's input box, which a retry must know before it sends again.
"""

import json
import os
import re
import time
from typing import Any, Dict, Iterable, List, Optional

from . import claude, procs
from .discovery import Profiles, Session, pane_of
from .protocol import HelperError
from .screen import classify
from .tmux import capture

# Transcripts can be large: scan at most this much of each file's end (messages being verified are recent).
TAIL_BYTES = 8 << 20


def _shows(value: object, marks: List[str]) -> bool:
    """Does a decoded record hold the message: an origin whose msg_id is ours (Claude's inbox), or a text that
    carries drover's own envelope with our id?  A record that merely mentions the id (a log quoted in a chat)
    does not count: drover's envelope disarms every opening tag inside a message's body."""
    if isinstance(value, dict):
        origin = value.get("origin")
        if isinstance(origin, dict) and origin.get("msg_id") in marks:
            return True
        return any(_shows(v, marks) for v in value.values())
    if isinstance(value, list):
        return any(_shows(v, marks) for v in value)
    if isinstance(value, str):
        return any('<cross-session-message from-session="%s"' % m in value for m in marks)
    return False


CLOSE = "</cross-session-message>"


def _after_envelope(value: object, marks: List[str]) -> str:
    """What a recorded text holds after drover's envelope closed: nothing, when the message arrived as sent.  A key
    a person pressed in the instant between drover's last look and its Enter rides along there (`…</cross-session-
    message>Z`); the message arrived, but not only it, and the outcome says so."""
    if isinstance(value, dict):
        return next((t for t in (_after_envelope(v, marks) for v in value.values()) if t), "")
    if isinstance(value, list):
        return next((t for t in (_after_envelope(v, marks) for v in value) if t), "")
    if isinstance(value, str) and CLOSE in value:
        opening = next((value.find(o) for o in ('<cross-session-message from-session="%s"' % m for m in marks) if o in value), -1)
        if opening >= 0:
            after = value.rpartition(CLOSE)[2].strip()
            # Claude Code wraps a paste in a tag of its own (`<pasted_content id="f6ca">` ... `</pasted_content
            # id="f6ca">`): its closing half, matching the opening right before the envelope, is Claude's, not extra.
            wrapper = PASTED.search(value[:opening])
            if wrapper is not None and after.startswith("</pasted_content%s>" % wrapper.group(1)):
                after = after[len("</pasted_content%s>" % wrapper.group(1)) :].strip()
            return after
    return ""


PASTED = re.compile(r"<pasted_content((?: [a-z_]+=\"[^\"<>]*\")*)>\s*\Z")


def _record_of(paths: Iterable[str], needles: List[str], since: float = 0.0, inbox: bool = False) -> Optional[Any]:
    """(the file, the record) of the message: the first file (modified since `since`) whose tail holds it.
    `inbox`: only Claude's own record of an inbox message counts (peer_record), nothing that merely holds its id."""
    wanted = [n.encode("utf-8") for n in needles if n]
    for path in paths:
        try:
            if since and os.path.getmtime(path) < since - 5:
                continue
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - TAIL_BYTES))
                data = f.read()
        except OSError:
            continue
        for line in data.splitlines():
            if not any(n in line for n in wanted):
                continue
            try:
                record = json.loads(line.decode("utf-8", "replace"))
            except ValueError:
                continue
            if (inbox and any(peer_record(record, n) for n in needles)) or (not inbox and _shows(record, needles)):
                return path, record
    return None


def peer_record(record: object, msg_id: str) -> bool:
    """Is this transcript record Claude's own record of the inbox message `msg_id`: a user record that Claude wrote
    for a message from another session (origin.kind "peer") whose origin.msg_id is ours?  Nothing else counts: not
    an assistant quoting the message or its id, not a tool's input or output that holds an origin-shaped object,
    not a queue-operation (queued, not yet delivered), not an earlier message with the same words (another id)."""
    if not isinstance(record, dict) or record.get("type") != "user" or not isinstance(record.get("message"), dict):
        return False
    origin = record.get("origin")
    return isinstance(origin, dict) and origin.get("kind") == "peer" and origin.get("msg_id") == msg_id


class PeerWatch:
    """Watches a Claude session's transcript for Claude's own record of one inbox message, reading only what was
    appended since the watch began (made before the line is sent): cheap enough to look every few milliseconds."""

    def __init__(self, session: Session, msg_id: str) -> None:
        self.session_id = str(session["_record"]["sessionId"])
        self.msg_id = msg_id
        self.offsets = {}  # type: Dict[str, int]
        self.partial = {}  # type: Dict[str, bytes]
        self._look_for_files(True)

    def _look_for_files(self, at_start: bool) -> None:
        for path in claude.transcripts(self.session_id):
            if path not in self.offsets:
                try:
                    # A file that appears after the watch began is read whole: all of it is new.
                    self.offsets[path] = os.path.getsize(path) if at_start else 0
                except OSError:
                    continue
                self.partial[path] = b""

    def seen(self) -> Optional[str]:
        """The transcript that now shows the message, or None."""
        if not self.offsets:
            self._look_for_files(False)
        wanted = self.msg_id.encode("utf-8")
        for path in list(self.offsets):
            try:
                with open(path, "rb") as f:
                    f.seek(self.offsets[path])
                    data = f.read()
            except OSError:
                continue
            if not data:
                continue
            self.offsets[path] += len(data)
            lines = (self.partial[path] + data).split(b"\n")
            self.partial[path] = lines.pop()  # a line Claude is still writing: completed at the next look
            for line in lines:
                if wanted not in line:
                    continue
                try:
                    record = json.loads(line.decode("utf-8", "replace"))
                except ValueError:
                    continue
                if peer_record(record, self.msg_id):
                    return path
        return None


def records_of(session: Session) -> Optional[List[str]]:
    """The files where this session's engine records what it received, or None if drover reads none for it."""
    engine = session["engine"]
    if engine == "claude" and "_record" in session:
        return claude.transcripts(session["_record"]["sessionId"])
    if engine == "codex":
        from . import codex

        return codex.records(session)  # its thread's rollout, in the CODEX_HOME its TUI runs with
    if engine == "demo":
        argv = procs.argv_of(int(session.get("engine_pid") or 0)) or []
        if "--log" in argv and argv.index("--log") + 1 < len(argv):
            return [argv[argv.index("--log") + 1]]
    return None


def needles(args: Dict[str, Any], lane: str) -> List[str]:
    """What marks this message in a record: Claude's inbox keeps the msg_id drover gave the line (a UUID); every
    other record keeps the text, whose envelope names drover's own message id (msg_ + time + 40 random bits).
    A message whose lane is unknown (its sender died) is looked for by both."""
    ids = [args.get("receiver_msg_id"), args.get("msg_id")]
    if lane == "inbox":
        ids = ids[:1]
    return [i for i in ids if i]


def find(session: Session, args: Dict[str, Any], lane: str) -> Dict[str, Any]:
    """{"found": True | False | None, "how": words}: None when the engine keeps no record drover can read."""
    if "_headless" in session:  # its own stream, by the line's uuid, whatever lane the message was sent on
        from . import headless

        return headless.seen(session, args)
    paths = records_of(session)
    if paths is None:
        return {"found": None, "how": "%s keeps no record drover can read" % session["engine"]}
    marks = needles(args, lane)
    if not marks:
        return {"found": None, "how": "the message carries no id to look for (a raw text)"}
    hit = _record_of(paths, marks, float(args.get("since") or 0), inbox=lane == "inbox")
    if hit:
        seen = {"found": True, "how": "seen in the receiver's record %s" % hit[0], "record": hit[0]}
        extra = _after_envelope(hit[1], marks)
        if extra:
            seen["how"] += ", followed by %r that drover did not send (a key typed at that instant?)" % extra[:40]
            seen["altered"] = True
        return seen
    if session["engine"] == "codex" and session.get("thread"):
        from . import codex

        waiting = codex.queued(session.get("_codex_home") or codex.default_home(), session["thread"])
        if any(m in text for text in waiting or [] for m in marks):
            how = "it waits in Codex's own queue for thread %s: it runs when a turn of the thread ends" % session["thread"]
            return {"found": False, "in_queue": True, "how": how}
    return {"found": False, "how": "not in the receiver's record (%d file(s) looked at)" % len(paths)}


def wait_found(session: Session, args: Dict[str, Any], lane: str, seconds: float) -> Dict[str, Any]:
    """find(), again and again for up to `seconds`: a receiver writes its record a moment after it takes a message."""
    deadline = time.monotonic() + seconds
    pause = 0.01  # most receivers write within a few ms: look again soon, then back off to 100 ms
    while True:
        seen = find(session, args, lane)
        if seen["found"] is not False or time.monotonic() >= deadline:
            return seen
        time.sleep(pause)
        pause = min(pause * 2, 0.1)


def in_input(session: Session, args: Dict[str, Any], profiles: Profiles) -> Optional[bool]:
    """Does the pane's input box hold this message, pasted but never submitted?  None: no pane or no input box."""
    pane = pane_of(session)
    if pane is None or pane.get("dead"):
        return None
    try:
        screen = capture(pane["socket"], pane["id"])
    except HelperError:
        return None
    text = classify(screen, profiles[pane["engine"]]).get("input")
    if text is None:
        return None
    mark = args.get("msg_id") or ""
    return "<cross-session-message" in text or bool(mark and mark in screen)
