"""Claude Code's inbox lane: the session's own Unix socket, a reply socket of ours, and the receipts.

Protocol facts: shared/design/claude-code-inbox.md.  The receiver never writes back on the connection; receipts
and idle notices come to the `from` address, a socket this process listens on.
"""

import hashlib
import json
import os
import re
import select
import socket as socketlib
import stat
import struct
import threading
import time
import uuid
from typing import Any, Callable, Dict, Optional, Tuple

from . import claude, procs, tmux, verify
from . import protocol as P
from .faults import fault
from .protocol import HelperError

# Claude Code drops a line over this many characters -- JavaScript's characters, UTF-16 code units: an emoji
# counts twice -- and closes the connection.  Measured in the receiver's units, before sending.
INBOX_MAX_LINE = 1048576


def utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


# One reply socket per process (<pid>.sock, as the receiver requires): concurrent sends in one process share it.
_REPLY_LOCK = threading.Lock()


def _uds_address(path: str) -> str:
    return "uds:" + "".join(ch if re.match(r"[A-Za-z0-9:_/.\-]", ch) else "%%%02X" % ord(ch) for ch in path)


def _peer_token(rec: Dict[str, Any]) -> Optional[str]:
    sock = rec.get("messagingSocketPath") or ""
    key = os.path.join(os.path.dirname(rec["_path"]), "%d.%s.key" % (rec["pid"], hashlib.sha256(sock.encode()).hexdigest()))
    try:
        with open(key, encoding="utf-8") as f:
            token = json.load(f).get("peerToken")
    except (OSError, ValueError):
        return None
    return token if isinstance(token, str) else None


class ReplySocket:
    """The socket receipts and idle notices come back to: <pid>.sock beside the target's, listened on by us."""

    def __init__(self, target_socket: str) -> None:
        self.path = os.path.join(os.path.dirname(target_socket), "%d.sock" % os.getpid())
        self.sock: Optional[socketlib.socket] = None

    def __enter__(self) -> "ReplySocket":
        _REPLY_LOCK.acquire()
        try:
            if os.path.exists(self.path):
                os.unlink(self.path)  # ours from an earlier crash: the pid is ours now
            sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
            sock.bind(self.path)
            os.chmod(self.path, 0o600)
            sock.listen(16)
            sock.settimeout(0.5)  # accept() only after select() saw a connection: never blocks long
            self.sock = sock
        except OSError as exc:
            _REPLY_LOCK.release()
            raise HelperError(P.REPLY_SOCKET, "cannot listen for receipts at %s: %s" % (self.path, exc)) from None
        except BaseException:
            _REPLY_LOCK.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.sock is not None:
                self.sock.close()
            if os.path.exists(self.path):
                os.unlink(self.path)
        finally:
            _REPLY_LOCK.release()

    @property
    def address(self) -> str:
        return _uds_address(self.path)

    def wait_for(self, match: Callable[[Dict[str, Any]], bool], timeout: float) -> Optional[Dict[str, Any]]:
        """The first JSON line for which match(line) is true, within timeout; None if none came."""
        assert self.sock is not None
        deadline = time.monotonic() + timeout
        while True:
            # One look even when the time is up: a receipt already waiting to be accepted is not lost.
            ready, _, _ = select.select([self.sock], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return None
            try:
                conn, _ = self.sock.accept()
            except (socketlib.timeout, BlockingIOError):
                continue  # the connection went away between the look and the accept
            with conn:
                conn.settimeout(2.0)
                data = b""
                try:
                    while b"\n" not in data and len(data) < 1 << 20:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                except socketlib.timeout:
                    pass
            for line in data.splitlines():
                try:
                    msg = json.loads(line.decode("utf-8", "replace"))
                except ValueError:
                    continue
                if isinstance(msg, dict) and match(msg):
                    return msg


def _foreign(detail: str) -> Dict[str, Any]:
    detail += ": nothing was sent (nor the session's peer token)"
    return {"outcome": P.FAILED, "code": P.SOCKET_FOREIGN, "detail": detail}


def _not_its_socket(rec: Dict[str, Any], path: str) -> Optional[Dict[str, Any]]:
    """Why what sits at the inbox path is not the session's own socket (before connecting), or None."""
    try:
        st = os.lstat(path)
    except OSError:
        return None  # missing: connect() says so
    if stat.S_ISLNK(st.st_mode):
        return _foreign("the inbox path %s is a symbolic link, not the socket the session made" % path)
    if not stat.S_ISSOCK(st.st_mode):
        return _foreign("the inbox path %s is not a socket (something replaced it); the session itself may be alive" % path)
    try:
        owner = os.stat("/proc/%d" % rec["pid"]).st_uid
    except OSError:
        owner = None
    if owner is not None and st.st_uid != owner:
        return _foreign("the inbox socket %s belongs to uid %d, not to the session's (uid %d)" % (path, st.st_uid, owner))
    return None


def _listener_pid(conn: socketlib.socket) -> int:
    """The pid of the process that listens at the other end (SO_PEERCRED; 0 when unknown, another pid namespace)."""
    try:
        creds = conn.getsockopt(socketlib.SOL_SOCKET, getattr(socketlib, "SO_PEERCRED", 17), struct.calcsize("3i"))
    except OSError:
        return 0
    return int(struct.unpack("3i", creds)[0])


def send_line(rec: Dict[str, Any], line: str) -> Optional[Dict[str, Any]]:
    """Write one line to the session's inbox, after the auth line when its peer token is readable.

    Only to the session's own socket: a real socket (not a link) owned by its user, whose listener is the session's
    own process (SO_PEERCRED, as Claude checks its peers) -- else nothing is written, the token least of all.
    None when sent; else a failed outcome (stale, missing or foreign socket).
    """
    path = str(rec.get("messagingSocketPath"))
    wrong = _not_its_socket(rec, path)
    if wrong is not None:
        return wrong
    conn = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    conn.settimeout(5.0)
    try:
        conn.connect(path)
        listener = _listener_pid(conn)
        if listener != rec["pid"]:
            who = "pid %d" % listener if listener else "a process drover cannot identify"
            return _foreign("the inbox socket %s is listened on by %s, not by the session (pid %d)" % (path, who, rec["pid"]))
        token = _peer_token(rec)
        lines = ([json.dumps({"type": "auth", "token": token})] if token else []) + [line]
        conn.sendall(("".join(one + "\n" for one in lines)).encode("utf-8"))
        conn.shutdown(socketlib.SHUT_WR)
        # The receiver never writes back: wait for it to close, so we know it read everything.
        while conn.recv(4096):
            pass
    except ConnectionRefusedError:
        if claude.alive(rec):
            detail = "the inbox socket %s refuses connections although the session's process still runs" % path
        else:
            detail = "the inbox socket %s refuses connections: the session is gone" % path
        return {"outcome": P.FAILED, "code": P.SOCKET_STALE, "detail": detail}
    except (BrokenPipeError, ConnectionResetError):
        # The receiver closed before reading everything (a line over its limit, or it exited): not silence.
        detail = "the inbox at %s closed the connection before reading the whole message: it was not taken" % path
        return {"outcome": P.FAILED, "code": P.INBOX_ERROR, "detail": detail}
    except FileNotFoundError:
        return {"outcome": P.FAILED, "code": P.SOCKET_MISSING, "detail": "the inbox socket %s does not exist" % path}
    except socketlib.timeout:
        # It may have read it and be slow to hang up (a session stopped with Ctrl-Z reads it when resumed).
        detail = "the inbox at %s did not finish reading the message within 5s: it may still arrive" % path
        return {"outcome": P.FAILED, "code": P.INBOX_TIMEOUT, "detail": detail, "indeterminate": True}
    except OSError as exc:
        return {"outcome": P.FAILED, "code": P.INBOX_ERROR, "detail": "cannot write to the inbox at %s: %s" % (path, exc)}
    finally:
        conn.close()
    return None


def receipt_outcome(receipt: Dict[str, Any]) -> Tuple[str, str, str]:
    """(outcome, detail, code) for a peer_message_status receipt."""
    status = receipt.get("status")
    reason = receipt.get("reason") or ""
    suffix = ": %s" % reason if reason else ""
    if status == "expired" and receipt.get("status_detail") == "refused":
        detail = "the receiver refuses messages from other sessions (crossSessionInbound = refuse)"
        return P.REFUSED, detail, P.RECEIVER_REFUSED
    if status == "expired":
        return P.REFUSED, "held, then expired before its human answered", P.EXPIRED
    if status == "dropped":
        why = str(receipt.get("drop_reason") or "unknown")
        return P.DROPPED, "the receiver dropped it: %s" % why, P.DROP_REASONS.get(why, P.RECEIVER_DROPPED)
    if status == "held":
        return P.HELD, "held by the receiver for its human" + suffix, P.HELD
    if status == "denied":
        return P.REFUSED, "the receiver's human denied it" + suffix, P.DENIED
    if status == "delivered":
        return P.DELIVERED, "released by the receiver's human and delivered" + suffix, P.DELIVERED
    return P.DELIVERED, "receipt %r%s" % (status, suffix), str(status)


def deliver(
    session: Dict[str, Any],
    content: Callable[[str], str],
    args: Dict[str, Any],
    base: Dict[str, Any],
    guard: Optional[Callable[[], Optional[Dict[str, Any]]]] = None,
) -> Dict[str, Any]:
    """Send content(reply_address) -- the envelope, which names our reply socket -- and read the receipt.

    `guard`: the last look before the line is written; a refusal it returns is the outcome, and nothing is sent."""
    rec = session["_record"]
    with ReplySocket(rec["messagingSocketPath"]) as reply:
        # The client picks the id and records it before sending, so a crash after this line leaves a message that
        # `drover retry` can still look for in the transcript.
        msg_id = str(args.get("receiver_msg_id") or uuid.uuid4())
        line = json.dumps(
            {
                "msgV": 1,
                "msg_id": msg_id,
                "type": "user",
                "message": {"role": "user", "content": content(reply.address)},
                "priority": "next",
                "from": reply.address,
                "session_id": rec["sessionId"],
            },
            ensure_ascii=False,
        )
        base = dict(base, lane="inbox", receiver_msg_id=msg_id)
        units = utf16_units(line)
        if units > INBOX_MAX_LINE:
            detail = "the message line is %d UTF-16 units (emoji count twice); Claude's inbox drops lines over %d" % (
                units,
                INBOX_MAX_LINE,
            )
            return dict(base, outcome=P.REFUSED, code=P.TOO_LARGE, detail=detail)
        # Watching begins before the line leaves: Claude may write its record before send_line returns.
        watch = verify.PeerWatch(session, msg_id)
        # As late as it can be: a dialog Claude draws after this look and before the write is the window left open.
        refused = guard() if guard is not None else None
        if refused is not None:
            return dict(base, **refused)
        started = time.monotonic()
        failed = send_line(rec, line)
        if failed is not None:
            return dict(base, **failed)
        fault("after_inbox_send")
        state = session["state"]
        ended, receipt, seen = _await_evidence(reply, watch, msg_id, state, float(args.get("receipt_wait_s", 1.5)))
    base = dict(base, wait_ended_by=ended, waited_s=round(time.monotonic() - started, 3))
    if seen is not None:
        # Claude's own record of it: the proof of acceptance, whatever the registry said the session was doing.
        detail = "the inbox accepted it and the session was idle"
        if state != "idle":
            detail = "the inbox accepted it and the session took it at once, though %s" % session["reason"]
        how = "seen in the receiver's record %s" % seen
        return dict(base, outcome=P.DELIVERED, detail=detail, state=state, verified=True, verification=how)
    if receipt is None:
        if state == "idle":
            return dict(base, outcome=P.DELIVERED, detail="the inbox accepted it and the session was idle", state=state)
        detail = "the inbox accepted it; it arrives when the turn allows (%s)" % session["reason"]
        return dict(base, outcome=P.QUEUED, detail=detail, state=state)
    outcome, detail, code = receipt_outcome(receipt)
    if outcome == P.HELD:
        detail = held_detail(session, str(base.get("declared_mode")), receipt)
    return dict(base, outcome=outcome, detail=detail, code=code, receipt=receipt, state=state)


# How long after the line is written Claude Code's negative receipts (held, refused, dropped) reach a busy session's
# sender: they go out as Claude reads the line, turn or no turn, while an accepted message to a busy session gets no
# receipt and reaches the transcript only when the turn allows, so silence past this window is the answer.
# Measured on 2.1.328 (bench/inbox_window.py, docs/lanes.md), 2 cores at load average 16-27: 284 receipts, p50
# 16 ms (refused) to 83 ms (held), p99 of the slowest kind (held) 502 ms, worst 583 ms.  1 s is that worst with a
# margin of 1.7; `receipt_wait_s` bounds it, and an idle session's wait ends on its record long before either.
BUSY_RECEIPT_WINDOW_S = 1.0

# What ended the wait for the message's fate (the outcome's `wait_ended_by`).
ENDED_BY_RECORD = "record"  # Claude's transcript shows the message: delivered, verified
ENDED_BY_RECEIPT = "receipt"  # a receipt for it came back: held, refused, dropped (or released)
ENDED_BY_WINDOW = "busy_window"  # a busy or waiting session, silent past the window its receipts come in
ENDED_BY_LIMIT = "receipt_wait_s"  # the upper bound, with neither receipt nor record


def _await_evidence(
    reply: ReplySocket, watch: "verify.PeerWatch", msg_id: str, state: str, limit: float
) -> Tuple[str, Optional[Dict[str, Any]], Optional[str]]:
    """(what ended the wait, the receipt or None, the transcript that shows the message or None).

    Looks at the reply socket (a receipt wins when it is there first) and at the receiver's transcript in turn,
    every few milliseconds; a session that is not idle queues an accepted message behind its turn, so after the
    window its receipts come in, silence is the answer -- never `delivered` without the record."""
    start = time.monotonic()
    window = limit if state == "idle" else min(limit, BUSY_RECEIPT_WINDOW_S)
    pause = 0.005
    while True:
        left = start + window - time.monotonic()
        receipt = reply.wait_for(
            lambda m: m.get("action") == "peer_message_status" and m.get("orig_msg_id") == msg_id, max(0.0, min(pause, left))
        )
        if receipt is not None:
            return ENDED_BY_RECEIPT, receipt, None
        seen = watch.seen()
        if seen is not None:
            return ENDED_BY_RECORD, None, seen
        if time.monotonic() >= start + window:
            return (ENDED_BY_LIMIT if window >= limit else ENDED_BY_WINDOW), None, None
        pause = min(pause * 2, 0.04)


HELD_BY_SETTING = (
    'held by the receiver for its human: its crossSessionInbound setting is "hold"%s, so Claude parks every message '
    "from another session for its human to review, with no dialog; it arrives if they release it, or once the "
    'setting is "accept"'
)
HELD_BY_PARITY = (
    "held by the receiver for its human: the class drover declared (%s) is not the one the session runs in "
    "(permission-mode parity), so Claude asks its human in a 'Held message from another session' dialog%s"
)
# What Claude Code 2.1.328 draws for each: the parity dialog, or the notice of a message parked by the setting.
DIALOG_WORDS = ("Deliver this message to Claude", "Held message from another session")
PARKED_WORDS = ("Held peer message",)


def _screen_says(session: Dict[str, Any], wait: float) -> Optional[str]:
    """ "parity" or "setting" from what Claude draws on its own screen after holding, or None (no pane, or neither)."""
    pane = session.get("_pane")
    if not pane:
        return None
    deadline = time.monotonic() + wait
    while True:
        try:
            screen = tmux.capture(pane["socket"], pane["id"])
        except HelperError:
            return None
        if any(w in screen for w in DIALOG_WORDS):
            return "parity"
        if any(w in screen for w in PARKED_WORDS):
            return "setting"
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def held_detail(session: Dict[str, Any], declared: str, receipt: Dict[str, Any], wait: float = 2.0) -> str:
    """Why the receiver holds it, from Claude's own evidence.  Its receipt gives the same reason for a standing `hold`
    setting as for a permission-class mismatch; its screen tells them apart (only the mismatch raises a dialog).
    Without a screen, the settings files are evidence only when the session reads the files drover can read (no
    --settings or --setting-sources on its command line): otherwise both causes are said, not one guessed."""
    reason = receipt.get("reason") or ""
    parity = HELD_BY_PARITY % (declared, ": %s" % reason if reason else "")
    seen = _screen_says(session, wait)
    if seen == "parity":
        return parity
    setting, where = claude.inbound_setting(session.get("cwd") or "", (session.get("_record") or {}).get("_config"))
    if seen == "setting":
        return HELD_BY_SETTING % (" (%s)" % where if setting == "hold" else "")
    argv = procs.argv_of(int(session.get("engine_pid") or 0)) or []
    flags = sorted({a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in ("--settings", "--setting-sources")})
    if flags or claude.managed_dropins():
        why = "it runs with %s" % " and ".join(flags) if flags else "managed settings drop-ins apply"
        return (
            "held by the receiver for its human, and drover cannot tell which of two causes (%s, so the settings "
            'files drover reads may not be the ones it reads): a crossSessionInbound setting of "hold" (Claude '
            "parks every message from another session for its human to review, no dialog), or permission-mode "
            "parity (the class drover declared, %s, is not the one the session runs in: a 'Held message from another "
            "session' dialog asks its human)" % (why, declared)
        )
    if setting == "hold":
        return HELD_BY_SETTING % (" (%s)" % where)
    return parity


def subscribe_idle(rec: Dict[str, Any], reply: ReplySocket) -> str:
    """Ask the session for a notice when it goes idle; the subscription's msg_id."""
    msg_id = str(uuid.uuid4())
    line = json.dumps(
        {"type": "control", "action": "notify_when_idle", "from": reply.address, "msg_id": msg_id, "from_mode": "prompting"}
    )
    failed = send_line(rec, line)
    if failed is not None:
        raise HelperError(failed["code"], failed["detail"])
    return msg_id
