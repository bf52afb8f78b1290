"""The holder of one headless Claude Code session: a small long-lived process that owns claude's stdin and stdout.

The helper copies this file into the session's own 0700 directory (DIR) and starts it under `setsid`, stdio
detached, so it outlives the helper and the SSH connection that started it:

    python3 DIR/holder.py DIR

DIR/spec.json (written by the helper) says what to run: {"argv": [...], "cwd": ..., "session_id": ...}.  The holder
runs it with stdin and stdout as pipes, appends every stdout line to DIR/stream.jsonl, writes DIR/holder.json (its
pid, claude's pid), and answers one JSON line per connection on DIR/sock (0600):

    {"op": "state"}                      -> {"alive", "busy", "pid", "child_pid", "exit", ...}
    {"op": "send", "uuid", "text", "wait_s"} -> {"ok", "ack": "queued"|"started"|..., "busy", "already"}
    {"op": "quit"}                       -> closes claude's stdin (it ends gracefully), then the holder exits

Busy and idle come from the stream's own events (measured on 2.1.328: `command_lifecycle` queued/started/completed
for each user line's uuid, a `result` per turn; no `session_state_changed` is emitted there).  A uuid already in
the stream (this holder's or an earlier one's: a resumed session) is never written again: a retry is a no-op.

When claude ends, its exit goes to DIR/exit.json; the holder stays a while to say so.  SIGTERM: a stop (see quit).

Stdlib only and Python 3.6+; imports nothing of drover's (it runs from its own copy, outside the bundle).
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Set

LINGER_S = 600.0  # how long a holder whose claude ended stays to answer with that fact
# Background tasks and scheduled wake-ups would start turns nobody sent (headless.md): off.
QUIET_ENV = {"CLAUDE_CODE_DISABLE_BACKGROUND_TASKS": "1", "CLAUDE_CODE_DISABLE_CRON": "1"}
# The largest request read: the fleet's default max_chars (1,048,576) at up to 6 bytes a character in JSON, + slack.
REQUEST_MAX = 8 << 20
# The states that prove a line reached claude's conversation (`queued` is only its memory: lost if it dies).
ARRIVED = ("started", "completed", "replayed")


def user_line(text: str, uuid: str) -> str:
    msg = {"role": "user", "content": text}
    return json.dumps({"type": "user", "message": msg, "parent_tool_use_id": None, "session_id": "default", "uuid": uuid})


def _write_json(path: str, data: Dict[str, Any]) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.rename(tmp, path)


class Holder:
    def __init__(self, folder: str) -> None:
        self.dir = folder
        with open(os.path.join(folder, "spec.json")) as f:
            self.spec = json.load(f)
        self.cond = threading.Condition()
        self.seen: Dict[str, str] = {}
        # uuid -> the newest acknowledgement the stream gave it
        self.active: Set[str] = set()
        self.queued: Set[str] = set()
        self.written: Set[str] = set()
        self.turns = 0
        self.last_event: Optional[float] = None
        self.exit: Optional[Dict[str, Any]] = None
        self.started = time.time()
        self.proc: Any = None
        self.stream: Any = None
        self.engine = "claude"
        self._load_stream()

    def _load_stream(self) -> None:
        """What an earlier holder of this session already delivered (`--resume`): never sent twice."""
        try:
            with open(os.path.join(self.dir, "stream.jsonl"), "rb") as f:
                for raw in f:
                    self._note(raw, replaying=True)
        except OSError:
            pass
        # Queued by an earlier claude and never started: it died with that claude's memory, so a retry sends it.
        for uid in [u for u, state in self.seen.items() if state == "queued"]:
            del self.seen[uid]

    def _note(self, raw: bytes, replaying: bool = False) -> None:
        try:
            ev = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            return
        if not isinstance(ev, dict):
            return
        kind = ev.get("type")
        if kind == "command_lifecycle" and isinstance(ev.get("command_uuid"), str):
            uid, state = ev["command_uuid"], str(ev.get("state"))
            if not (state == "queued" and self.seen.get(uid) in ARRIVED):  # never back from arrived to queued
                self.seen[uid] = state
            if not replaying:
                self.queued.discard(uid)
                if state == "queued":
                    self.queued.add(uid)
                elif state == "started":
                    self.active.add(uid)
                else:
                    self.active.discard(uid)
        elif kind == "user" and ev.get("isReplay") and isinstance(ev.get("uuid"), str):
            if self.seen.get(ev["uuid"]) not in ARRIVED:
                self.seen[ev["uuid"]] = "replayed"
        elif kind == "result" and not replaying:
            self.turns += 1
        if not replaying:
            self.last_event = time.time()

    def start(self) -> None:
        env = dict(os.environ)
        env.update(QUIET_ENV)
        err = open(os.path.join(self.dir, "stderr.log"), "ab")
        self.proc = subprocess.Popen(
            self.spec["argv"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, cwd=self.spec["cwd"], env=env
        )
        err.close()
        self.stream = open(os.path.join(self.dir, "stream.jsonl"), "ab")
        info = {"pid": os.getpid(), "child_pid": self.proc.pid, "started": self.started, "uid": os.getuid()}
        _write_json(os.path.join(self.dir, "holder.json"), info)
        threading.Thread(target=self._read, daemon=True).start()
        self.waiter = threading.Thread(target=self._wait, daemon=True)
        self.waiter.start()

    def _read(self) -> None:
        for raw in iter(self.proc.stdout.readline, b""):
            with self.cond:
                self._append(raw)
                self._note(raw)
                self.cond.notify_all()

    def _append(self, raw: bytes) -> None:
        self.stream.write(raw if raw.endswith(b"\n") else raw + b"\n")
        self.stream.flush()

    def _wait(self) -> None:
        """claude's exit, by its process, not by its stdout's EOF: a grandchild it left may hold that open."""
        code = self.proc.wait()
        time.sleep(0.2)  # its last lines, already in the pipe, reach the stream first
        with self.cond:
            self.exit = {"code": code, "at": time.time(), "signal": -code if code < 0 else None}
            self.active.clear()
            self.queued.clear()
            self.cond.notify_all()
        _write_json(os.path.join(self.dir, "exit.json"), dict(self.exit, child_pid=self.proc.pid))

    def state(self) -> Dict[str, Any]:
        return {
            "pid": os.getpid(),
            "child_pid": self.proc.pid if self.proc else None,
            "session_id": self.session_id(),
            "alive": self.exit is None,
            "busy": bool(self.active or self.queued),
            "exit": self.exit,
            "started": self.started,
            "turns": self.turns,
            "last_event": self.last_event,
        }

    def session_id(self) -> Optional[str]:
        return self.spec.get("session_id")

    def send(self, req: Dict[str, Any]) -> Dict[str, Any]:
        uid, text = str(req.get("uuid") or ""), req.get("text")
        if not uid or not isinstance(text, str):
            return {"ok": False, "code": "bad_request", "detail": "a send needs a uuid and a text"}
        with self.cond:
            if self.exit is not None:
                code, sig = self.exit["code"], self.exit["signal"]
                how = "killed by signal %s" % sig if sig else "exit status %s" % code
                return {"ok": False, "code": "engine_exited", "detail": "%s has exited (%s)" % (self.engine, how)}
            if uid in self.seen or uid in self.written:
                return {"ok": True, "already": True, "ack": self.seen.get(uid), "busy": bool(self.active or self.queued)}
            busy = bool(self.active or self.queued)
            try:
                self.proc.stdin.write((user_line(text, uid) + "\n").encode("utf-8"))
                self.proc.stdin.flush()
            except (OSError, ValueError) as exc:
                return {"ok": False, "code": "engine_exited", "detail": "%s's stdin is closed (%s)" % (self.engine, exc)}
            self.written.add(uid)
            deadline = time.monotonic() + float(req.get("wait_s") or 10.0)
            # Idle: wait for the turn to take it (`started`); busy: its place in the queue is the answer to give.
            while self.exit is None and time.monotonic() < deadline and not self._answered(uid, busy):
                self.cond.wait(deadline - time.monotonic())
            return {"ok": True, "ack": self.seen.get(uid), "busy": busy, "already": False}

    def _answered(self, uid: str, busy: bool) -> bool:
        state = self.seen.get(uid)
        return state in ARRIVED or state == "cancelled" or (busy and state == "queued")

    def quit(self) -> None:
        try:
            self.proc.stdin.close()
        except (OSError, ValueError):
            pass

    def serve(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(30)
            data = b""
            while not data.endswith(b"\n") and len(data) <= REQUEST_MAX:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
            try:
                req = json.loads(data.decode("utf-8")) if len(data) <= REQUEST_MAX else {"op": "too_large"}
            except ValueError:
                req = {}
            op = req.get("op") if isinstance(req, dict) else None
            if op == "state":
                answer = self.state()
            elif op == "send":
                answer = self.send(req)
            elif op == "quit":
                self.stop_soon()  # its answer is sent well before the holder exits (_end_soon)
                answer = {"ok": True}
            elif op == "too_large":
                answer = {"ok": False, "code": "too_large", "detail": "the request exceeds %d bytes" % REQUEST_MAX}
            else:
                answer = {"ok": False, "code": "bad_request", "detail": "unknown op %r" % (op,)}
            conn.sendall((json.dumps(answer) + "\n").encode("utf-8"))
        except OSError:
            pass
        finally:
            conn.close()

    def stop_soon(self) -> None:
        self.quit()
        threading.Thread(target=self._end_soon, daemon=True).start()

    def _end_soon(self) -> None:
        """After a quit (or SIGTERM): claude ends at EOF when idle; mid-turn it is killed after the grace."""
        try:
            self.proc.wait(timeout=float(self.spec.get("stop_grace_s") or 20))
        except subprocess.TimeoutExpired:
            self.proc.kill()
        time.sleep(0.5)
        os._exit(0)


class CodexHolder(Holder):
    """`codex app-server` on stdio (JSON-RPC lines, no "jsonrpc" member; measured on 0.169.0): initialize,
    initialized, thread/start (or thread/resume); a send is turn/start when idle, turn/steer when a turn runs.  Its
    acknowledgement is the server's answer to that request, written into the stream as a `drover_sent` line."""

    def __init__(self, folder: str) -> None:
        self.replies: Dict[int, Dict[str, Any]] = {}
        self.next_id = 0
        self.turn: Optional[str] = None
        self.thread: Optional[str] = None
        self.done_turns: Set[str] = set()
        Holder.__init__(self, folder)
        self.engine = "codex"

    def session_id(self) -> Optional[str]:
        return self.thread

    def _note(self, raw: bytes, replaying: bool = False) -> None:
        try:
            msg = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            return
        if not isinstance(msg, dict):
            return
        if msg.get("type") == "drover_sent" and isinstance(msg.get("uuid"), str):
            self.seen[msg["uuid"]] = str(msg.get("ack"))
            return
        if replaying:
            return
        self.last_event = time.time()
        method, params = msg.get("method"), msg.get("params") or {}
        if "id" in msg and method:  # a request of the server's (an approval): nobody here may grant it
            error = {"code": -32601, "message": "held headless by drover: no one to approve"}
            self._write({"id": msg["id"], "error": error})
        elif "id" in msg:
            self.replies[msg["id"]] = msg
        elif method == "turn/started":
            self.turn = str((params.get("turn") or {}).get("id") or "") or None
            self.active = {self.turn or "turn"}
        elif method == "turn/completed":
            self.done_turns.add(str((params.get("turn") or {}).get("id") or ""))
            self.turn, self.active = None, set()
            self.turns += 1

    def _write(self, msg: Dict[str, Any]) -> None:
        self.proc.stdin.write((json.dumps(msg) + "\n").encode("utf-8"))
        self.proc.stdin.flush()

    def _request(self, method: str, params: Dict[str, Any], timeout: float = 60.0) -> Dict[str, Any]:
        """Called with the lock held; waits (releasing it) for the answer."""
        self.next_id += 1
        rid = self.next_id
        self._write({"id": rid, "method": method, "params": params})
        deadline = time.monotonic() + timeout
        while rid not in self.replies and self.exit is None and time.monotonic() < deadline:
            self.cond.wait(max(0.01, deadline - time.monotonic()))
        return self.replies.pop(rid, {"error": {"message": "no answer to %s" % method}})

    def handshake(self) -> None:
        with self.cond:
            self._request("initialize", {"clientInfo": {"name": "drover", "version": "1"}})
            self._write({"method": "initialized"})
            old = self.spec.get("resume_thread")
            params = {"cwd": self.spec["cwd"], "approvalPolicy": "never"}
            if old:
                answer = self._request("thread/resume", dict(params, threadId=old))
            else:
                answer = self._request("thread/start", params)
            thread = ((answer.get("result") or {}).get("thread") or {}).get("id")
        if not thread:
            self.quit()
            return
        self.thread = str(thread)
        _write_json(os.path.join(self.dir, "thread.json"), {"session_id": self.thread})

    def send(self, req: Dict[str, Any]) -> Dict[str, Any]:
        uid, text = str(req.get("uuid") or ""), req.get("text")
        if not uid or not isinstance(text, str):
            return {"ok": False, "code": "bad_request", "detail": "a send needs a uuid and a text"}
        with self.cond:
            if self.exit is not None or self.thread is None:
                what = "has exited" if self.exit is not None else "has no thread yet"
                return {"ok": False, "code": "engine_exited", "detail": "codex %s" % what}
            if uid in self.seen or uid in self.written:
                return {"ok": True, "already": True, "ack": self.seen.get(uid), "busy": self.turn is not None}
            self.written.add(uid)
            busy, items = self.turn is not None, [{"type": "text", "text": text}]
            answer: Dict[str, Any] = {"error": {}}
            ack = "steered"
            if busy:
                answer = self._request("turn/steer", {"threadId": self.thread, "input": items, "expectedTurnId": self.turn})
            if "error" in answer:  # idle, or the turn ended meanwhile: a turn of its own
                ack = "started"
                answer = self._request("turn/start", {"threadId": self.thread, "input": items})
            if "error" in answer:
                self.written.discard(uid)
                return {"ok": False, "code": "thread_error", "detail": str(answer["error"].get("message"))}
            started = str(((answer.get("result") or {}).get("turn") or {}).get("id") or "")
            if ack == "started" and started and started not in self.done_turns:
                # Busy from the answer on: its turn/started notification may come a moment after it.
                self.turn, self.active = started, {started}
            self.seen[uid] = ack
            self._append(json.dumps({"type": "drover_sent", "uuid": uid, "ack": ack}).encode("utf-8"))
            return {"ok": True, "ack": ack, "busy": busy, "already": False}


def main(argv: List[str]) -> int:
    folder = argv[1]
    with open(os.path.join(folder, "spec.json")) as f:
        codex = json.load(f).get("protocol") == "codex"
    holder = CodexHolder(folder) if codex else Holder(folder)
    path = os.path.join(folder, "sock")
    try:
        os.unlink(path)
    except OSError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)  # born 0600: no moment when another user could connect
    try:
        listener.bind(path)
    finally:
        os.umask(old)
    listener.listen(16)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: holder.stop_soon())  # `kill HOLDER_PID`: a stop
    holder.start()
    threading.Thread(target=holder.serve, args=(listener,), daemon=True).start()
    if isinstance(holder, CodexHolder):
        holder.handshake()
    holder.waiter.join()
    # Its claude ended: stay a while to say so to senders, then go (the exit stays recorded in exit.json).
    deadline = time.monotonic() + LINGER_S
    while time.monotonic() < deadline:
        time.sleep(1.0)
    try:
        os.unlink(path)
    except OSError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
