"""Headless Claude Code sessions: held on this host by a holder (headless_holder.py), reached through its socket.

Each session has a directory of its own under the drover home's `headless/` (0700, ours, no link): `spec.json`
(what the holder runs), `holder.json` (its pid and claude's), `stream.jsonl` (claude's stream-json output),
`exit.json` (claude's exit, once it ended), `sock` (the holder's 0600 socket).  Nothing is sent through a directory
or socket that is a link, another user's, or group/world accessible, nor to a listener whose pid (SO_PEERCRED) is
not the holder's own.

The lane `headless`: a user line with a uuid derived from drover's message id, so a retry names the same line
and the holder, finding it in the stream, does not write it again.  Delivered and verified = the stream's own
acknowledgement of that uuid (`command_lifecycle` started/completed, or the `isReplay` echo); `queued` alone is
P.QUEUED, unverified (claude's queue is in its memory).

Stdlib only and Python 3.6+: shipped to every host inside the helper bundle.
"""

import json
import os
import socket as socketlib
import stat
import struct
import uuid as uuidlib
from typing import Any, Dict, List, Optional

from . import own_record
from . import protocol as P
from .protocol import HelperError

Session = Dict[str, Any]
# The uuid of drover's message MSG_ID in a headless stream: uuid5 of it in this namespace (stable across retries).
NAMESPACE = uuidlib.UUID("6f2d1c1e-4b1a-5d3e-9a47-2f0c8e1d7b55")
ASK_TIMEOUT_S = 5.0
REQUEST_MAX = 8 << 20  # the holder's own bound (headless_holder.REQUEST_MAX): a bigger request is refused unsent
BUSY_DETAIL = (
    "the session was busy: Claude takes it at its next tool-call boundary and answers it within that turn (a "
    "text-only turn: as a turn of its own once this one ends)"
)

STEERED_DETAIL = "the thread was busy: Codex took it into the running turn (turn/steer), which answers it before it ends"


def root() -> str:
    return os.path.join(own_record.home(), "headless")


def line_uuid(msg_id: str) -> str:
    return str(uuidlib.uuid5(NAMESPACE, msg_id)) if msg_id else str(uuidlib.uuid4())


def unsafe(path: str, kind: str, others: int = 0o077) -> Optional[str]:
    """Why `path` must not be used (a link, not ours, group/world accessible, not a KIND), or None."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return "%s: %s" % (path, exc.strerror)
    if stat.S_ISLNK(st.st_mode):
        return "%s is a symbolic link" % path
    wanted = stat.S_ISDIR if kind == "directory" else stat.S_ISSOCK
    if not wanted(st.st_mode):
        return "%s is not a %s" % (path, kind)
    if st.st_uid != os.geteuid():
        return "%s belongs to uid %d, not to this user" % (path, st.st_uid)
    if st.st_mode & others:
        return "%s is accessible to others (mode %o)" % (path, stat.S_IMODE(st.st_mode))
    return None


def _json(path: str) -> Optional[Dict[str, Any]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _peer(conn: socketlib.socket) -> Any:
    creds = conn.getsockopt(socketlib.SOL_SOCKET, getattr(socketlib, "SO_PEERCRED", 17), struct.calcsize("3i"))
    return struct.unpack("3i", creds)  # pid, uid, gid


def ask(folder: str, req: Dict[str, Any], timeout: float = ASK_TIMEOUT_S) -> Dict[str, Any]:
    """One request to the holder of `folder`: refused (SOCKET_FOREIGN) before anything is written when the
    directory, the socket or the listener is not this user's own holder; SOCKET_MISSING when nobody listens."""
    why = unsafe(folder, "directory") or unsafe(os.path.join(folder, "sock"), "socket")
    if why:
        code = P.SOCKET_MISSING if why.endswith("No such file or directory") else P.SOCKET_FOREIGN
        raise HelperError(code, "the headless holder's socket cannot be used: %s; nothing was sent" % why)
    # UTF-8, not \u escapes: a non-ASCII character is 2-4 bytes, not 6 (a message under max_chars fits the bound).
    line = (json.dumps(req, ensure_ascii=False) + "\n").encode("utf-8")
    if len(line) > REQUEST_MAX:
        why = "the request is %d bytes, over the headless holder's %d: nothing was sent" % (len(line), REQUEST_MAX)
        raise HelperError(P.TOO_LARGE, why)
    holder = _json(os.path.join(folder, "holder.json")) or {}
    conn = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        try:
            conn.connect(os.path.join(folder, "sock"))
        except OSError as exc:
            raise HelperError(
                P.SOCKET_STALE, "nobody listens on %s/sock (%s): its holder is gone" % (folder, exc.strerror)
            ) from None
        pid, uid, _gid = _peer(conn)
        if uid != os.geteuid() or pid != holder.get("pid"):
            raise HelperError(
                P.SOCKET_FOREIGN,
                "the listener on %s/sock is pid %d (uid %d), not the session's holder (pid %s): nothing was sent"
                % (folder, pid, uid, holder.get("pid")),
            )
        try:
            conn.sendall(line)
        except socketlib.timeout:
            raise
        except OSError:
            pass  # the holder closed on us mid-request: whatever it answered says why
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    except socketlib.timeout:
        raise HelperError(P.INBOX_TIMEOUT, "the headless holder at %s did not answer in %gs" % (folder, timeout)) from None
    except OSError as exc:
        raise HelperError(P.INBOX_ERROR, "the headless holder at %s broke off (%s)" % (folder, exc.strerror)) from None
    finally:
        conn.close()
    try:
        answer = json.loads(data.decode("utf-8"))
    except ValueError:
        raise HelperError(P.INBOX_ERROR, "the headless holder at %s answered %r" % (folder, data[:200])) from None
    return answer if isinstance(answer, dict) else {}


def _alive(pid: Any) -> bool:
    """Is that process running (a zombie is not: nothing may reap a holder killed under a container's init)?"""
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError):
        return False
    try:
        with open("/proc/%d/stat" % int(pid)) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True  # no /proc to ask: the signal's word


def _holder_dir(pid: Any) -> Optional[str]:
    """The folder a live holder process holds (its argv: `python3 DIR/holder.py DIR`), or None (gone, or no /proc)."""
    if not _alive(pid):
        return None
    try:
        with open("/proc/%d/cmdline" % int(pid), "rb") as f:
            argv = f.read().split(b"\0")
    except (OSError, ValueError):
        return None
    argv = [a for a in argv if a]
    if len(argv) < 2 or not argv[-2].endswith(b"holder.py"):
        return None  # not a holder (its pid reused): the socket's SO_PEERCRED check refuses it
    return argv[-1].decode("utf-8", "replace")


def session_at(folder: str, warnings: List[str]) -> Optional[Session]:
    """The session held in `folder`, with its state: the holder's word, else what its files say."""
    why = unsafe(folder, "directory")
    if why:
        warnings.append("headless session skipped: %s" % why)
        return None
    spec = _json(os.path.join(folder, "spec.json"))
    if spec is None:
        return None
    holder = _json(os.path.join(folder, "holder.json")) or {}
    held = _holder_dir(holder.get("pid"))
    if held is not None and os.path.realpath(held) != os.path.realpath(folder):
        # A copy of another session's folder (its holder.json names that live holder): not a second session.
        warnings.append("headless folder %s skipped: its holder (pid %s) holds %s" % (folder, holder.get("pid"), held))
        return None
    exited = _json(os.path.join(folder, "exit.json"))
    engine = str(spec.get("engine") or "claude")
    # A Codex thread's id is known once its holder started it (thread.json); a Claude session's before it starts.
    sid = str(spec.get("session_id") or (_json(os.path.join(folder, "thread.json")) or {}).get("session_id") or "")
    if not sid:
        return None  # a Codex holder still starting its thread: not a session yet
    name = str(spec.get("name"))
    out = {
        "id": sid,
        "name": name,
        "engine": engine,
        "server": None,
        "target": None,
        "pid": holder.get("pid"),
        "engine_pid": holder.get("child_pid"),
        "command": "%s (headless)" % engine,
        "cwd": spec.get("cwd"),
        "title": "",
        "since": None,
        "dead": False,
        "in_mode": False,
        "input_off": False,
        "lanes": ["headless"],
        "headless": True,
        # Not its bare name: that is matched beside the tmux sessions' names, so a tmux session of the same name
        # makes it ambiguous (both listed) instead of the headless one winning silently; headless/NAME is its own.
        "aliases": [sid, "headless/" + name],
        "_headless": folder,
    }  # type: Session
    state = None
    if holder and _alive(holder.get("pid")) and not exited:
        try:
            state = ask(folder, {"op": "state"}, 3.0)
        except HelperError as exc:
            if exc.code != P.SOCKET_STALE:  # nobody listening is a holder gone: said below
                warnings.append("headless session %s: %s" % (name, exc.message))
                out.update(state="unknown", reason=exc.message)
                return out
    if state is not None and state.get("alive"):
        busy = bool(state.get("busy"))
        out.update(state="busy" if busy else "idle", since=state.get("last_event") or state.get("started"))
        out["reason"] = "its stream says a turn runs" if busy else "its stream says no turn runs"
        return out
    exit_info = (state or {}).get("exit") or exited
    if not exit_info and _alive(holder.get("child_pid")):
        # Its holder was killed mid-turn: claude ends only at EOF when idle, so it may run on (and write) a while.
        why = "its holder (pid %s) is gone but %s (pid %s) still runs: it ends once its turn does; --resume waits for that"
        out.update(state="unknown", reason=why % (holder.get("pid"), engine, holder.get("child_pid")))
        return out
    if exit_info:
        out.update(state="gone", reason="%s exited (%s)" % (engine, _exit_words(exit_info)), exit=exit_info)
    else:
        how = "`drover spawn HOST --engine %s --headless --resume %s`" % (engine, name)
        out.update(state="gone", reason="its holder is gone (pid %s): %s starts a new one" % (holder.get("pid"), how))
    out["dead"] = True
    return out


def _exit_words(info: Dict[str, Any]) -> str:
    if info.get("signal"):
        return "killed by signal %s" % info["signal"]
    return "exit status %s" % info.get("code")


def sessions(warnings: List[str]) -> List[Session]:
    base = root()
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    why = unsafe(base, "directory")
    if why:
        warnings.append("headless sessions not read: %s" % why)
        return []
    found = [session_at(os.path.join(base, n), warnings) for n in names]
    return [s for s in found if s is not None]


def deliver(session: Session, payload: str, args: Dict[str, Any]) -> Dict[str, Any]:
    from .faults import fault

    uid = line_uuid(str(args.get("msg_id") or ""))
    base = {"lane": "headless", "uuid": uid}
    try:
        answer = ask(session["_headless"], {"op": "send", "uuid": uid, "text": payload, "wait_s": 10.0}, 20.0)
    except HelperError as exc:
        return dict(base, outcome=P.FAILED, code=exc.code, detail=exc.message)
    if not answer.get("ok"):
        code = str(answer.get("code") or P.INBOX_ERROR)
        how = "`drover spawn HOST --engine %s --headless --resume %s`" % (session["engine"], session["name"])
        detail = "%s: nothing was sent; %s starts it again" % (answer.get("detail"), how)
        return dict(base, outcome=P.FAILED, code=code, detail=detail)
    fault("after_headless_send")
    ack = answer.get("ack")
    if not ack and not answer.get("busy"):
        # An idle session that took no turn for it within the holder's wait: said with what the engine said.
        base["stderr_tail"] = stderr_tail(session["_headless"])
    if ack == "queued":
        # In claude's in-memory queue only: lost if it dies before the turn runs it, so not yet verified.
        out = dict(base, outcome=P.QUEUED, enveloped=True, verified=False)
        out["verification"] = "queued in the session (%s), not started yet: `drover verify` confirms it once it runs" % uid
    else:
        out = dict(base, outcome=P.DELIVERED, enveloped=True, verified=bool(ack))
        out["verification"] = (
            "the session's stream acknowledged %s (%s)" % (uid, ack) if ack else "written to the session; no acknowledgement yet"
        )
    if answer.get("already"):
        out["detail"] = "already in the session's stream (%s): not written again" % uid
    elif ack == "steered":
        out["detail"] = STEERED_DETAIL
    elif answer.get("busy"):
        out["detail"] = BUSY_DETAIL
    return out


# What proves a line reached the session: claude took it into a turn (`started`/`completed`) or echoed it
# (`replayed`), or Codex's server accepted it (`started`/`steered`).  `queued` is not: it sits in claude's memory
# and dies with it.
ARRIVED = ("started", "completed", "replayed", "steered")


def acks(path: str, uid: str) -> List[str]:
    """The stream's own acknowledgements of `uid`, oldest first: only the events that name it in their own
    field, never a line whose text merely quotes it (a message may quote another's uuid)."""
    out = []  # type: List[str]
    needle = uid.encode()
    with open(path, "rb") as f:
        for raw in f:
            if needle not in raw:
                continue  # cheap: most lines are not about it
            try:
                ev = json.loads(raw.decode("utf-8", "replace"))
            except ValueError:
                continue
            if not isinstance(ev, dict):
                continue
            kind = ev.get("type")
            if kind == "command_lifecycle" and ev.get("command_uuid") == uid:
                out.append(str(ev.get("state")))
            elif kind == "user" and ev.get("isReplay") and ev.get("uuid") == uid:
                out.append("replayed")
            elif kind == "drover_sent" and ev.get("uuid") == uid:  # the Codex holder's own record of its answer
                out.append(str(ev.get("ack")))
    return out


def stderr_tail(folder: str) -> str:
    """The last words of the engine's stderr (FOLDER/stderr.log), for a failure to quote."""
    try:
        with open(os.path.join(folder, "stderr.log"), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 400))
            text = f.read().decode("utf-8", "replace")
        return repr(text) if text else "(none)"
    except OSError:
        return "(none)"


def seen(session: Session, args: Dict[str, Any]) -> Dict[str, Any]:
    """verify: did drover's message reach the session (the stream's own event for its uuid says it ran)?"""
    uid = line_uuid(str(args.get("msg_id") or ""))
    path = os.path.join(session["_headless"], "stream.jsonl")
    try:
        states = acks(path, uid)
    except OSError as exc:
        return {"found": None, "how": "the stream %s cannot be read: %s" % (path, exc.strerror)}
    arrived = [s for s in states if s in ARRIVED]
    if arrived:
        return {"found": True, "how": "the session's stream acknowledged %s (%s)" % (uid, arrived[-1])}
    if states:
        how = "the stream shows %s only %s, never started: it may still run, or be lost with its claude"
        return {"found": False, "how": how % (uid, "/".join(states))}
    return {"found": False, "how": "no acknowledgement of %s in %s" % (uid, path)}
