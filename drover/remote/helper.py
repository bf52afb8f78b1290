"""drover's host helper: one stdlib-only file that does a host's work.

It runs on every host drover talks to -- in-process for ``local``, as ``python3 -I`` over SSH for the others --
so that local and remote behave the same.  It reads one JSON request on stdin and writes one JSON answer on
stdout.  It must stay importable and runnable on Python 3.8+ with nothing but the standard library: the remote
host has nothing installed for drover.

Request:  {"helper": 1, "op": "list" | "status" | "deliver" | "classify" | "hello", "args": {...},
           "profiles": {ENGINE: {...overrides}}}
Answer:   {"helper": 1, "ok": true, "data": ...}
          {"helper": 1, "ok": false, "error": {"code": "...", "message": "...", ...}}
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import socket as socketlib
import subprocess
import sys
import threading
import time
import unicodedata
import uuid
from collections import deque
from datetime import datetime
from typing import Any

PROTOCOL = 1

# ---------------------------------------------------------------------------------------------------------------
# Engine profiles: how to recognise an engine in a pane's process tree and how to read its screen.
# Kept as data so users can override them in fleet.toml ([engines.NAME]) and check them against their own
# captures with `drover guard check`.  Patterns are Python regular expressions searched line by line.
# ---------------------------------------------------------------------------------------------------------------

BUILTIN_PROFILES: dict = {
    "claude": {
        "commands": ["claude"],
        "scripts": [r"@anthropic-ai/claude-code(-[a-z0-9-]+)?/"],
        # A `❯` cursor on a choice line, or any of the footers Claude draws under a menu: Enter here answers it.
        "dialog": [
            r"Enter to confirm",
            r"Esc to cancel",
            r"Do you want to proceed\?",
            r"Do you want to (use|make|create|allow|run)\b",
            r"Held message from another session",
            r"Quick safety check",
            r"Yes, I (trust|accept)",
            r"^\s*❯\s*\d+\.\s",
            r"^\s*❯\s*(Yes|No|Deny|Allow)\b",
            r"Select login method",
            r"Press Enter to continue",
        ],
        "busy": [r"esc to interrupt"],
        "idle": [r"^\s*❯\s*$"],
        "dialog_scope": "screen",
        "default_state": "unknown",
        "queues_when_busy": True,
        "envelope": True,
    },
    "codex": {
        "commands": ["codex"],
        "scripts": [r"@openai/codex/"],
        "dialog": [
            r"Press enter to continue",
            r"enter continue",
            r"Trust this folder\?",
            r"Sign in with",
            r"^\s*[›>]\s*\d+\.\s",
            r"Allow command\?",
            r"Would you like to (run|make|apply)",
            r"Yes, proceed",
        ],
        "busy": [r"esc to interrupt"],
        "idle": [r"\? for shortcuts"],
        "dialog_scope": "screen",
        "default_state": "unknown",
        "queues_when_busy": True,
        "envelope": True,
    },
    "gemini": {
        "commands": ["gemini"],
        "scripts": [r"@google/gemini-cli/"],
        "dialog": [
            r"Allow execution",
            r"Waiting for user confirmation",
            r"Do you want to proceed",
            r"^\s*●\s*\d+\.\s",
            r"Enter to select",
        ],
        "busy": [r"esc to cancel"],
        "idle": [r"Type your message"],
        "dialog_scope": "screen",
        "default_state": "unknown",
        "queues_when_busy": False,
        "envelope": True,
    },
    # The agent-like REPL that `drover demo` and the tests run (drover/demo_agent.py).
    "demo": {
        "commands": ["drover-demo-agent"],
        "scripts": [r"drover[/.]demo_agent"],
        "dialog": [r"Do you want to proceed\?", r"Enter to confirm"],
        "busy": [r"esc to interrupt"],
        "idle": [r"^\s*❯\s*$"],
        "dialog_scope": "screen",
        "default_state": "unknown",
        "queues_when_busy": True,
        "envelope": True,
    },
    # Anything else in a pane: a shell or a TUI drover knows nothing about.  Raw text, no envelope.  Only the
    # line the program is asking on counts: a shell's old "Password:" line further up is history, not a prompt.
    "shell": {
        "commands": [],
        "scripts": [],
        "dialog": [
            r"[Pp]assword[^\n]*:\s*$",
            r"[Pp]assphrase[^\n]*:\s*$",
            r"\(yes/no(/\[fingerprint\])?\)\??\s*$",
            r"\[[yY]/[nN]\]\s*\??\s*$",
            r"\([yY]/[nN]\)\s*\??\s*$",
            r"Are you sure",
            r"Press (any key|ENTER|RETURN|Enter)",
        ],
        "busy": [],
        "idle": [],
        "dialog_scope": "last_line",
        "default_state": "idle",
        "queues_when_busy": False,
        "envelope": False,
    },
}

ENGINE_ORDER = ["claude", "codex", "gemini", "demo"]
INTERPRETERS = re.compile(r"^(node|nodejs|bun|deno|npx|python[0-9.]*|pypy[0-9.]*)$")
PROFILE_KEYS = {
    "commands": list,
    "scripts": list,
    "dialog": list,
    "busy": list,
    "idle": list,
    "dialog_scope": str,
    "default_state": str,
    "queues_when_busy": bool,
    "envelope": bool,
}


class HelperError(Exception):
    """An error with a stable code, reported in the answer instead of a traceback."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra


def merge_profiles(overrides: dict | None) -> dict:
    """Built-in profiles with the fleet's overrides laid over them, key by key."""
    profiles = {name: dict(p) for name, p in BUILTIN_PROFILES.items()}
    for name, over in (overrides or {}).items():
        base = profiles.get(name, dict(BUILTIN_PROFILES["shell"], commands=[], scripts=[]))
        for key, value in over.items():
            if key not in PROFILE_KEYS:
                raise HelperError("bad_profile", "engine profile %r has an unknown key %r" % (name, key))
            base[key] = value
        profiles[name] = base
    for name, prof in profiles.items():
        for key in ("dialog", "busy", "idle", "scripts"):
            for pattern in prof.get(key, []):
                try:
                    re.compile(pattern)
                except re.error as exc:
                    raise HelperError(
                        "bad_profile", "engine %r: %s pattern %r is not a valid regex: %s" % (name, key, pattern, exc)
                    ) from None
    return profiles


def engine_order(profiles: dict) -> list:
    extra = [n for n in profiles if n not in ENGINE_ORDER and n != "shell"]
    return [n for n in ENGINE_ORDER if n in profiles] + sorted(extra)


# ---------------------------------------------------------------------------------------------------------------
# Screens
# ---------------------------------------------------------------------------------------------------------------


def _lines(screen: str) -> list:
    return [line.rstrip() for line in screen.replace("\r\n", "\n").split("\n")]


def _search(patterns: list, lines: list, ignore: str = "") -> str | None:
    """The first line that matches any pattern.

    With `ignore` (the text we just pasted), a match whose matched words occur in that text doesn't count: the
    program may be echoing our own text, wrapped and prefixed in its input box, and our text may quote a dialog.
    """
    for line in lines:
        for pattern in patterns:
            m = re.search(pattern, line)
            if m is None:
                continue
            if ignore and m.group(0).strip() and m.group(0).strip() in ignore:
                continue
            return line
    return None


def classify(screen: str, profile: dict, ignore_text: str = "") -> dict:
    """Read a captured screen: idle, busy, dialog or unknown, with the line that decided it."""
    lines = _lines(screen)
    nonempty = [line for line in lines if line.strip()]
    if profile.get("dialog_scope") == "last_line":
        scope = nonempty[-1:]
    else:
        scope = lines
    hit = _search(profile.get("dialog", []), scope, ignore_text)
    if hit is not None:
        return {"state": "dialog", "reason": "dialog on screen: %r" % hit.strip()[:120]}
    hit = _search(profile.get("busy", []), lines)
    if hit is not None:
        return {"state": "busy", "reason": "busy: %r" % hit.strip()[:120]}
    hit = _search(profile.get("idle", []), lines)
    if hit is not None:
        return {"state": "idle", "reason": "idle: input prompt %r" % hit.strip()[:120]}
    default = profile.get("default_state", "unknown")
    if default == "idle":
        return {"state": "idle", "reason": "no prompt asking for input"}
    return {"state": default, "reason": "screen not recognised: no idle prompt, no busy or dialog marker"}


def last_line(screen: str) -> str:
    """The last line that says something (rules and box drawing skipped)."""
    for line in reversed(_lines(screen)):
        text = line.strip()
        if text and not re.match(r"^[\u2500-\u259f\s]+$", text):
            return text[:200]
    return ""


# ---------------------------------------------------------------------------------------------------------------
# Text: neutralising control characters and building the envelope
# ---------------------------------------------------------------------------------------------------------------

CLOSING_TAG = "</cross-session-message"


def neutralise(text: str) -> str:
    """Make text safe to paste: no byte of it can act as a key or a terminal control sequence.

    CRLF becomes LF; C0 controls other than tab and newline become their Unicode Control Pictures
    (ESC -> U+241B, Ctrl-C -> U+2403, CR -> U+240D), DEL becomes U+2421 and C1 controls become U+FFFD.
    So an ``ESC[201~`` in the text cannot end a bracketed paste, and nothing in it can press a key.
    """
    text = text.replace("\r\n", "\n")
    out = []
    for ch in text:
        code = ord(ch)
        if ch == "\n" or ch == "\t":
            out.append(ch)
        elif code < 0x20:
            out.append(chr(0x2400 + code))
        elif code == 0x7F:
            out.append("\u2421")
        elif 0x80 <= code <= 0x9F:
            out.append("\ufffd")
        else:
            out.append(ch)
    return "".join(out)


def sanitise_name(name: str) -> str:
    """from-name as Claude Code requires: no quotes or angle brackets, no control/format chars, <= 64 chars."""
    kept = [ch for ch in name if ch not in '"<>' and unicodedata.category(ch) not in ("Cc", "Cf")]
    return "".join(kept).strip()[:64].strip()


def envelope(body: str, actor: str, mode: str = "prompting", from_addr: str = "", session: str = "") -> str:
    """The <cross-session-message> wrapping Claude Code's own sender writes, with a fixed attribute order."""
    if mode not in ("prompting", "bypass"):
        raise HelperError("bad_request", "from-mode must be 'prompting' or 'bypass', not %r" % mode)
    attrs = []
    if from_addr:
        attrs.append('from="%s"' % from_addr)
    if session:
        attrs.append('from-session="%s"' % session)
    attrs.append('from-name="%s"' % sanitise_name("drover (%s)" % actor))
    attrs.append('from-mode="%s"' % mode)
    safe_body = body.replace(CLOSING_TAG, "<\\/cross-session-message")
    return "<cross-session-message %s>\n%s\n</cross-session-message>" % (" ".join(attrs), safe_body)


# ---------------------------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------------------------


def proc_table() -> dict:
    """pid -> (ppid, argv) for every process we can see, read once per request."""
    table: dict = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as f:
                stat = f.read().decode("utf-8", "replace")
            with open("/proc/%s/cmdline" % name, "rb") as f:
                argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[-1].split()
        comm = stat[stat.find("(") + 1 : stat.rfind(")")]
        table[int(name)] = (int(rest[1]), argv or [comm])
    return table


def _engine_of(argv: list, profiles: dict, order: list) -> str | None:
    base = os.path.basename(argv[0]) if argv else ""
    scripts = []
    if INTERPRETERS.match(base):
        args = argv[1:]
        if base.startswith(("python", "pypy")) and "-m" in args:
            i = args.index("-m")
            if i + 1 < len(args):
                scripts.append(args[i + 1])
        first = [a for a in args if not a.startswith("-")]
        if first:
            scripts.append(first[0])
    # npm installs agents as scripts run by node (`node /usr/bin/codex`): the script's name counts as a command.
    names = [base] + [os.path.basename(s) for s in scripts]
    for name in order:
        prof = profiles[name]
        if any(n in prof.get("commands", []) for n in names):
            return name
        for pattern in prof.get("scripts", []):
            if any(re.search(pattern, s) for s in scripts):
                return name
    return None


def detect_engine(pid: int, table: dict, profiles: dict) -> tuple:
    """The engine nearest the pane's root process, walking its process tree breadth-first; and that pid."""
    children: dict = {}
    for child, (ppid, _argv) in table.items():
        children.setdefault(ppid, []).append(child)
    order = engine_order(profiles)
    queue = [pid]
    seen: set = set()
    while queue and len(seen) < 512:
        current = queue.pop(0)
        if current in seen or current not in table:
            continue
        seen.add(current)
        engine = _engine_of(table[current][1], profiles, order)
        if engine:
            return engine, current
        queue.extend(sorted(children.get(current, [])))
    return "shell", pid


# ---------------------------------------------------------------------------------------------------------------
# tmux
# ---------------------------------------------------------------------------------------------------------------

TMUX_TIMEOUT = 10.0
FIELDS = [
    "pane_id",
    "session_name",
    "window_index",
    "pane_index",
    "pane_pid",
    "pane_current_command",
    "pane_current_path",
    "pane_title",
    "pane_dead",
    "pane_in_mode",
    "pane_input_off",
    "window_activity",
    "window_panes",
    "session_windows",
]
SEP = "\x1f"


def tmux_servers() -> list:
    """Socket paths of every tmux server this user may have: the default socket directory, plus $TMUX's."""
    paths = []
    current = os.environ.get("TMUX", "").split(",")[0]
    if current:
        paths.append(current)
    base = os.path.join(os.environ.get("TMUX_TMPDIR") or "/tmp", "tmux-%d" % os.getuid())
    try:
        for name in sorted(os.listdir(base)):
            path = os.path.join(base, name)
            if path not in paths:
                paths.append(path)
    except OSError:
        pass
    return paths


def tmux(socket: str, args: list, data: bytes | None = None, timeout: float = TMUX_TIMEOUT) -> str:
    cmd = ["tmux", "-S", socket] + args
    try:
        proc = subprocess.run(cmd, input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except FileNotFoundError:
        raise HelperError("no_tmux", "tmux is not installed on this host") from None
    except subprocess.TimeoutExpired:
        raise HelperError(
            "tmux_timeout", "tmux did not answer within %.0fs (%s): is its server stuck?" % (timeout, args[0])
        ) from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()
        raise HelperError("tmux_error", "tmux %s failed: %s" % (args[0], err or "exit %d" % proc.returncode))
    return proc.stdout.decode("utf-8", "replace")


def tmux_version() -> str | None:
    try:
        proc = subprocess.run(["tmux", "-V"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.decode().strip() or None


def list_panes(warnings: list) -> list:
    panes: list = []
    if shutil.which("tmux") is None:
        warnings.append("tmux is not installed on this host, so no tmux panes are listed")
        return panes
    fmt = SEP.join("#{%s}" % f for f in FIELDS)
    for socket in tmux_servers():
        try:
            out = tmux(socket, ["list-panes", "-a", "-F", fmt], timeout=5)
        except HelperError as exc:
            # A socket with no server behind it is what tmux leaves after a crash: not worth a word unless the
            # server exists but misbehaves.
            if exc.code == "tmux_error" and ("no server running" in exc.message or "error connecting" in exc.message):
                continue
            if exc.code == "no_tmux":
                warnings.append("tmux is not installed on this host, so no tmux panes are listed")
                return panes
            warnings.append("tmux server %s: %s" % (socket, exc.message))
            continue
        for row in out.splitlines():
            parts = row.split(SEP)
            if len(parts) != len(FIELDS):
                continue
            pane = dict(zip(FIELDS, parts))
            pane["socket"] = socket
            panes.append(pane)
    return panes


def capture(socket: str, pane_id: str) -> str:
    return tmux(socket, ["capture-pane", "-p", "-t", pane_id])


def pane_flags(socket: str, pane_id: str) -> dict:
    fmt = SEP.join("#{%s}" % f for f in FIELDS)
    out = tmux(socket, ["display-message", "-p", "-t", pane_id, fmt]).rstrip("\n")
    parts = out.split(SEP)
    if len(parts) != len(FIELDS):
        raise HelperError("pane_gone", "pane %s is gone" % pane_id)
    return dict(zip(FIELDS, parts))


# ---------------------------------------------------------------------------------------------------------------
# Sessions: every pane of every tmux server, with its engine
# ---------------------------------------------------------------------------------------------------------------


def _server_name(socket: str) -> str:
    return os.path.basename(socket)


def _session_from_pane(pane: dict, table: dict, profiles: dict) -> dict:
    server = _server_name(pane["socket"])
    target = "%s:%s.%s" % (pane["session_name"], pane["window_index"], pane["pane_index"])
    engine, engine_pid = detect_engine(int(pane["pane_pid"] or 0), table, profiles)
    single = pane["window_panes"] == "1" and pane["session_windows"] == "1"
    name = pane["session_name"] if single else target
    try:
        since = int(pane["window_activity"])
    except ValueError:
        since = None
    return {
        "id": pane["pane_id"],
        "server": server,
        "socket": pane["socket"],
        "target": target,
        "name": name,
        "engine": engine,
        "pid": int(pane["pane_pid"] or 0),
        "engine_pid": engine_pid,
        "command": pane["pane_current_command"],
        "cwd": pane["pane_current_path"],
        "title": pane["pane_title"],
        "since": since,
        "dead": pane["pane_dead"] == "1",
        "in_mode": pane["pane_in_mode"] == "1",
        "input_off": pane["pane_input_off"] == "1",
        "lanes": ["tmux"],
        "aliases": [pane["pane_id"], "%s/%s" % (server, pane["pane_id"]), target, "%s/%s" % (server, target)],
    }


def discover(profiles: dict, warnings: list) -> list:
    """Every session on this host: live Claude Code sessions (with their pane, if any), then the other panes."""
    panes = list_panes(warnings)
    table = proc_table() if panes else {}
    pane_sessions = [_session_from_pane(p, table, profiles) for p in panes]
    records, _stale = claude_records(warnings)
    by_pid = {s["engine_pid"]: s for s in pane_sessions if s["engine"] == "claude"}
    sessions, used = [], set()
    for rec in records:
        pane = by_pid.get(rec["pid"])
        if pane is not None:
            used.add(id(pane))
        sessions.append(session_from_record(rec, pane))
    return sessions + [s for s in pane_sessions if id(s) not in used]


def with_state(session: dict, profiles: dict) -> dict:
    """The session's state with its evidence. Claude's own record is authoritative; the screen is evidence."""
    pane = session.get("_pane")
    if session["engine"] == "claude" and "_record" in session:
        if pane is not None and not pane["dead"]:
            try:
                screen = capture(pane["socket"], pane["id"])
            except HelperError:
                screen = ""
            session["_screen"] = screen
            session["last_line"] = last_line(screen)
            session["screen_state"] = classify(screen, profiles["claude"])["state"] if screen else "unknown"
        return session
    if session["dead"]:
        session.update(state="gone", reason="the pane's program has exited (pane is dead)")
        return session
    try:
        screen = capture(session["socket"], session["id"])
    except HelperError as exc:
        session.update(state="unknown", reason=exc.message)
        return session
    session.update(classify(screen, profiles[session["engine"]]))
    if session["in_mode"] and session["state"] != "dialog":
        session.update(state="waiting", reason="pane is in copy mode")
    session["last_line"] = last_line(screen)
    session["_screen"] = screen
    return session


def _brief(session: dict) -> str:
    return "%s (%s, %s)" % (session["id"], session["name"], session["engine"])


def resolve(target: str, sessions: list) -> dict:
    """One session for what the user typed: exact id/alias, then exact name, then a unique prefix."""
    if not target:
        raise HelperError("bad_request", "no session named: give a pane id (%3), session:window.pane, or a name")
    tiers = (
        ("matches", lambda s: target == s["id"] or target in s["aliases"]),
        ("matches", lambda s: target == s["name"]),
        ("is a prefix of", lambda s: s["name"].startswith(target) or s["id"].startswith(target)),
    )
    for how, match in tiers:
        hits = [s for s in sessions if match(s)]
        if len(hits) == 1:
            return hits[0]
        if hits:
            raise HelperError(
                "ambiguous_session",
                "%r %s %d sessions: %s" % (target, how, len(hits), ", ".join(_brief(s) for s in hits[:10])),
                candidates=[{"id": s["id"], "server": s["server"], "name": s["name"]} for s in hits],
            )
    known = ", ".join(_brief(s) for s in sessions[:8]) or "none"
    raise HelperError("session_not_found", "no session %r on this host (sessions here: %s)" % (target, known))


def find(args: dict, profiles: dict, warnings: list) -> dict:
    """The session args["target"] names; when there is none, the host's warnings (no tmux, ...) say why."""
    try:
        return resolve(args.get("target", ""), discover(profiles, warnings))
    except HelperError as exc:
        if exc.code == "session_not_found" and warnings:
            exc.message += "; note: " + "; ".join(warnings)
        raise


def public(session: dict) -> dict:
    return {k: v for k, v in session.items() if not k.startswith("_") and k not in ("aliases", "socket")}


# ---------------------------------------------------------------------------------------------------------------
# Claude Code sessions: the registry in ~/.claude/sessions and each session's inbox socket.
# The facts are in shared/design/claude-code-inbox.md; Anthropic calls these formats internal, so anything
# drover does not understand is skipped with a warning, never guessed at.
# ---------------------------------------------------------------------------------------------------------------

INBOX_MAX_LINE = 1048576
# One reply socket per process (<pid>.sock, as the receiver requires): concurrent sends in one process share it.
_REPLY_LOCK = threading.Lock()


def claude_dir() -> str:
    return os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".claude")


def proc_start(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time in clock ticks): with the pid, it names one process."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def pid_domain() -> str | None:
    try:
        with open("/etc/machine-id") as f:
            machine = f.read().strip()
        return "linux:%s:%s" % (machine, os.readlink("/proc/self/ns/pid"))
    except OSError:
        return None


def _stale_reason(rec: dict, domain: str | None) -> str | None:
    pid = rec["pid"]
    if rec.get("pidDomain") and domain and rec["pidDomain"] != domain:
        return "recorded in another pid namespace or machine (%s): its pid cannot be checked here" % rec["pidDomain"]
    started = proc_start(pid)
    if started is None:
        return "pid %d is gone" % pid
    if rec.get("procStart") is not None and str(rec["procStart"]) != started:
        return "pid %d now belongs to another process (procStart differs)" % pid
    return None


def claude_records(warnings: list) -> tuple:
    """(live records, stale records) from the registry; unreadable records are skipped with a warning."""
    folder = os.path.join(claude_dir(), "sessions")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return [], []
    live, stale = [], []
    domain = pid_domain()
    for name in names:
        if not re.match(r"^\d+\.json$", name):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                rec = json.load(f)
        except (OSError, ValueError) as exc:
            warnings.append("skipped Claude session record %s: %s" % (path, exc))
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("pid"), int) or not isinstance(rec.get("sessionId"), str):
            warnings.append("skipped Claude session record %s: no pid or sessionId" % path)
            continue
        reason = _stale_reason(rec, domain)
        if reason:
            stale.append({"pid": rec["pid"], "id": rec["sessionId"], "name": rec.get("name"), "reason": reason, "record": path})
        else:
            rec["_path"] = path
            live.append(rec)
    return live, stale


def _claude_state(rec: dict) -> tuple:
    status = rec.get("status")
    if status == "idle":
        return "idle", "Claude reports idle"
    if status == "busy":
        return "busy", "a turn is running"
    if status == "waiting":
        return "waiting", "waiting for %s" % (rec.get("waitingFor") or "something")
    return "unknown", "Claude reports status %r" % status


def session_from_record(rec: dict, pane: dict | None) -> dict:
    former = [n for n in rec.get("formerNames") or [] if isinstance(n, str)]
    state, reason = _claude_state(rec)
    lanes = (["inbox"] if rec.get("messagingSocketPath") else []) + (["tmux"] if pane else [])
    updated = rec.get("statusUpdatedAt") or rec.get("updatedAt") or rec.get("startedAt")
    session = {
        "id": rec["sessionId"],
        "server": pane["server"] if pane else None,
        "target": pane["target"] if pane else None,
        "pane": pane["id"] if pane else None,
        "name": rec.get("name") or rec["sessionId"][:8],
        "former_names": former,
        "engine": "claude",
        "pid": rec["pid"],
        "engine_pid": rec["pid"],
        "command": "claude",
        "cwd": rec.get("cwd") or "",
        "title": pane["title"] if pane else "",
        "since": int(updated / 1000) if isinstance(updated, (int, float)) else None,
        "dead": False,
        "in_mode": pane["in_mode"] if pane else False,
        "input_off": pane["input_off"] if pane else False,
        "lanes": lanes,
        "state": state,
        "reason": reason,
        "waiting_for": rec.get("waitingFor"),
        "kind": rec.get("kind"),
        "version": rec.get("version"),
        "aliases": [rec["sessionId"], str(rec["pid"])] + former + (pane["aliases"] if pane else []),
        "_record": rec,
        "_pane": pane,
    }
    return session


def _uds_address(path: str) -> str:
    return "uds:" + "".join(ch if re.match(r"[A-Za-z0-9:_/.\-]", ch) else "%%%02X" % ord(ch) for ch in path)


def _peer_token(rec: dict) -> str | None:
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
        self.sock: socketlib.socket | None = None

    def __enter__(self) -> "ReplySocket":
        _REPLY_LOCK.acquire()
        try:
            if os.path.exists(self.path):
                os.unlink(self.path)  # ours from an earlier crash: the pid is ours now
            sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
            sock.bind(self.path)
            os.chmod(self.path, 0o600)
            sock.listen(16)
            self.sock = sock
        except OSError as exc:
            _REPLY_LOCK.release()
            raise HelperError("reply_socket", "cannot listen for receipts at %s: %s" % (self.path, exc)) from None
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

    def wait_for(self, match: "object", timeout: float) -> dict | None:
        """The first JSON line for which match(line) is true, within timeout; None if none came."""
        assert self.sock is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                conn, _ = self.sock.accept()
            except socketlib.timeout:
                return None
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
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict) and match(msg):  # type: ignore[operator]
                    return msg


def inbox_send(rec: dict, line: str) -> dict | None:
    """Write one line to the session's inbox, after the auth line when its peer token is readable.

    None when sent; else a failed outcome (stale or missing socket).
    """
    token = _peer_token(rec)
    lines = ([json.dumps({"type": "auth", "token": token})] if token else []) + [line]
    path = str(rec.get("messagingSocketPath"))
    conn = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    conn.settimeout(5.0)
    try:
        conn.connect(path)
        conn.sendall(("".join(line + "\n" for line in lines)).encode("utf-8"))
        conn.shutdown(socketlib.SHUT_WR)
        # The receiver never writes back: wait for it to close, so we know it read everything.
        while conn.recv(4096):
            pass
    except ConnectionRefusedError:
        return {
            "outcome": "failed",
            "code": "socket_stale",
            "detail": "the inbox socket %s refuses connections: the session is gone" % path,
        }
    except FileNotFoundError:
        return {"outcome": "failed", "code": "socket_missing", "detail": "the inbox socket %s does not exist" % path}
    except socketlib.timeout:
        return {
            "outcome": "failed",
            "code": "inbox_timeout",
            "detail": "the inbox at %s did not read the message within 5s" % path,
        }
    except OSError as exc:
        return {"outcome": "failed", "code": "inbox_error", "detail": "cannot write to the inbox at %s: %s" % (path, exc)}
    finally:
        conn.close()
    return None


RECEIPTS = {
    "held": ("held", "held by the receiver for its human (a 'Held message' dialog is on its screen)"),
    "denied": ("refused", "the receiver's human denied it"),
    "delivered": ("delivered", "released by the receiver's human and delivered"),
    "dropped": ("dropped", "the receiver dropped it"),
}


def _receipt_outcome(receipt: dict) -> tuple:
    status = receipt.get("status")
    reason = receipt.get("reason") or ""
    if status == "expired" and receipt.get("status_detail") == "refused":
        return "refused", "the receiver refuses messages from other sessions (crossSessionInbound = refuse)", "refused"
    if status == "expired":
        return "refused", "held, then expired before its human answered", "expired"
    if status == "dropped":
        why = receipt.get("drop_reason") or "unknown"
        return "dropped", "the receiver dropped it: %s" % why, why
    outcome, detail = RECEIPTS.get(str(status), ("delivered", "receipt %r" % status))
    return outcome, detail + (": %s" % reason if reason else ""), status


FOOTER_MODES = [
    ("bypass permissions on", "bypassPermissions"),
    ("accept edits on", "acceptEdits"),
    ("auto mode on", "auto"),
    ("plan mode on", "plan"),
    ("manual mode on", "default"),
]


def _transcript_mode(session_id: str) -> str | None:
    mode = None
    for path in glob.glob(os.path.join(claude_dir(), "projects", "*", "%s.jsonl" % glob.escape(session_id))):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if "ermission" not in line:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                found = rec.get("permissionMode") if isinstance(rec, dict) else None
                if isinstance(found, str):
                    mode = found
    return mode


def _screen_mode(pane: dict | None) -> str | None:
    if pane is None:
        return None
    try:
        screen = capture(pane["socket"], pane["id"])
    except HelperError:
        return None
    for line in reversed(_lines(screen)[-6:]):
        for words, mode in FOOTER_MODES:
            if words in line:
                return mode
    return None


def _argv_mode(pid: int) -> str | None:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0")]
    except OSError:
        return None
    if "--dangerously-skip-permissions" in argv:
        return "bypassPermissions"
    if "--permission-mode" in argv and argv.index("--permission-mode") + 1 < len(argv):
        return argv[argv.index("--permission-mode") + 1]
    return None


def permission_class(session: dict) -> tuple:
    """('bypass' | 'prompting', the mode seen, where it was seen) for a Claude session.

    The transcript's latest permission mode is authoritative (it follows shift+tab), but a session writes its
    transcript only from its first turn; before that, the footer on its screen, then its command line.
    """
    rec = session["_record"]
    for source, finder in (
        ("transcript", lambda: _transcript_mode(rec["sessionId"])),
        ("screen", lambda: _screen_mode(session.get("_pane"))),
        ("command line", lambda: _argv_mode(rec["pid"])),
    ):
        mode = finder()
        if mode:
            return ("bypass" if mode == "bypassPermissions" else "prompting"), mode, source
    return "prompting", None, None


def deliver_inbox(session: dict, text: str, args: dict) -> dict:
    rec = session["_record"]
    mode, seen_mode, seen_in = "prompting", None, None
    if args.get("as_owner"):
        mode, seen_mode, seen_in = permission_class(session)
    with ReplySocket(rec["messagingSocketPath"]) as reply:
        # Not keystrokes here, but the receiver draws the text in a terminal: no control sequences in it either.
        content = envelope(neutralise(text), args.get("actor") or "unknown", mode, from_addr=reply.address)
        msg_id = str(uuid.uuid4())
        line = json.dumps(
            {
                "msgV": 1,
                "msg_id": msg_id,
                "type": "user",
                "message": {"role": "user", "content": content},
                "priority": "next",
                "from": reply.address,
                "session_id": rec["sessionId"],
            },
            ensure_ascii=False,
        )
        base: dict = {"lane": "inbox", "session": public(session), "receiver_msg_id": msg_id, "declared_mode": mode}
        if args.get("as_owner"):
            base["target_permission_mode"] = seen_mode
            base["permission_mode_source"] = seen_in
        if len(line) > INBOX_MAX_LINE:
            detail = "the message line is %d characters; Claude's inbox drops lines over %d" % (len(line), INBOX_MAX_LINE)
            return dict(base, outcome="refused", code="too_large", detail=detail)
        failed = inbox_send(rec, line)
        if failed is not None:
            return dict(base, **failed)
        wait = float(args.get("receipt_wait_s", 1.5))
        receipt = reply.wait_for(lambda m: m.get("action") == "peer_message_status" and m.get("orig_msg_id") == msg_id, wait)
    state = session["state"]
    if receipt is None:
        if state == "idle":
            return dict(base, outcome="delivered", detail="the inbox accepted it and the session was idle", state=state)
        return dict(
            base,
            outcome="queuedBehindTurn",
            detail="the inbox accepted it; it arrives when the turn allows (%s)" % session["reason"],
            state=state,
        )
    outcome, detail, code = _receipt_outcome(receipt)
    return dict(base, outcome=outcome, detail=detail, code=code, receipt=receipt, state=state)


# ---------------------------------------------------------------------------------------------------------------
# Waiting: an idle notice from Claude where it can send one; otherwise watching the host, not polling over SSH
# ---------------------------------------------------------------------------------------------------------------


def _record_now(rec: dict) -> dict | None:
    try:
        with open(rec["_path"], encoding="utf-8") as f:
            now = json.load(f)
    except (OSError, ValueError):
        return None
    return now if isinstance(now, dict) and now.get("sessionId") == rec["sessionId"] else None


def _alive(rec: dict) -> bool:
    return _stale_reason(rec, pid_domain()) is None


def wait_claude(session: dict, until: str, timeout: float) -> dict:
    rec = session["_record"]
    started = time.monotonic()
    if until == "exited":
        while time.monotonic() - started < timeout:
            if not _alive(rec):
                return {"reached": True, "state": "exited", "how": "watched the process on the host"}
            time.sleep(0.2)
        return {"reached": False, "state": session["state"], "how": "watched the process on the host"}
    if rec.get("status") == "idle":
        return {"reached": True, "state": "idle", "how": "already idle"}
    with ReplySocket(rec["messagingSocketPath"]) as reply:
        msg_id = str(uuid.uuid4())
        line = json.dumps(
            {"type": "control", "action": "notify_when_idle", "from": reply.address, "msg_id": msg_id, "from_mode": "prompting"}
        )
        failed = inbox_send(rec, line)
        if failed is not None:
            raise HelperError(failed["code"], failed["detail"])
        # It may have gone idle between our look and the subscription: look once more.
        now = _record_now(rec)
        if now is not None and now.get("status") == "idle":
            return {"reached": True, "state": "idle", "how": "went idle while subscribing"}
        notice = reply.wait_for(
            lambda m: m.get("action") == "peer_idle_notice" and m.get("orig_msg_id") == msg_id,
            timeout - (time.monotonic() - started),
        )
    if notice is None:
        return {"reached": False, "state": session["state"], "how": "notify_when_idle (no notice before the timeout)"}
    state = notice.get("state") or "idle"
    return {
        "reached": state == until or state == "exited",
        "state": state,
        "finished_at": notice.get("finished_at"),
        "how": "notify_when_idle",
    }


def wait_pane(session: dict, until: str, timeout: float, profiles: dict) -> dict:
    started = time.monotonic()
    state = "unknown"
    while True:
        try:
            flags = pane_flags(session["socket"], session["id"])
        except HelperError:
            return {"reached": until == "exited", "state": "exited", "how": "watched the pane on the host"}
        if flags["pane_dead"] == "1":
            return {"reached": until == "exited", "state": "exited", "how": "watched the pane on the host"}
        if until == "idle":
            state = classify(capture(session["socket"], session["id"]), profiles[session["engine"]])["state"]
            if state == "idle":
                return {"reached": True, "state": "idle", "how": "watched the pane on the host"}
        if time.monotonic() - started > timeout:
            return {"reached": False, "state": state, "how": "watched the pane on the host"}
        time.sleep(0.25)


# ---------------------------------------------------------------------------------------------------------------
# Transcripts: filtered on the host, so only what matters crosses the network
# ---------------------------------------------------------------------------------------------------------------


def _ts(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        text = value.replace("Z", "+00:00")
        if "." in text:  # Python 3.8 takes 3 or 6 fraction digits only
            head, rest = text.split(".", 1)
            digits = re.match(r"\d+", rest)
            frac = digits.group(0) if digits else ""
            text = head + "." + (frac + "000000")[:6] + rest[len(frac) :]
        return datetime.fromisoformat(text).timestamp()
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


def _claude_event(rec: dict, limit: int) -> dict | None:
    kind = rec.get("type")
    if kind not in ("user", "assistant") or not isinstance(rec.get("message"), dict):
        return None
    origin: dict = rec["origin"] if isinstance(rec.get("origin"), dict) else {}
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


def _codex_event(rec: dict, limit: int) -> dict | None:
    payload: dict = rec["payload"] if isinstance(rec.get("payload"), dict) else rec
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


def transcript_for(session: dict | None, target: str) -> tuple:
    """(path, engine) of the session's transcript: Claude's by sessionId, else a Codex rollout by id."""
    if session is not None and session["engine"] == "claude" and "_record" in session:
        sid = session["_record"]["sessionId"]
        hits = glob.glob(os.path.join(claude_dir(), "projects", "*", "%s.jsonl" % glob.escape(sid)))
        if hits:
            return max(hits, key=os.path.getmtime), "claude"
        raise HelperError("no_transcript", "Claude session %s has no transcript yet" % sid)
    codex_home = os.environ.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")
    if re.match(r"^[A-Za-z0-9-]{6,}$", target):
        hits = glob.glob(os.path.join(codex_home, "sessions", "**", "rollout-*%s*.jsonl" % glob.escape(target)), recursive=True)
        if len(hits) == 1:
            return hits[0], "codex"
        if len(hits) > 1:
            raise HelperError("ambiguous_session", "%r matches %d Codex rollouts" % (target, len(hits)))
    what = "%s (%s)" % (session["id"], session["engine"]) if session else repr(target)
    raise HelperError("no_transcript", "no transcript for %s: drover reads Claude transcripts and Codex rollouts" % what)


def read_transcript(path: str, engine: str, args: dict) -> dict:
    last = max(1, int(args.get("last", 20)))
    roles = set(args.get("roles") or [])
    grep = re.compile(args["grep"], re.I) if args.get("grep") else None
    since = args.get("since")
    raw = bool(args.get("raw"))
    limit = int(args.get("max_chars", 4000))
    kept: deque = deque(maxlen=last)
    total = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            event = (_claude_event if engine == "claude" else _codex_event)(rec, limit)
            if event is None:
                continue
            if roles and event["role"] not in roles:
                continue
            if since is not None:
                ts = _ts(event["time"])
                if ts is None or ts < float(since):
                    continue
            if grep and not grep.search(event["text"]):
                continue
            total += 1
            kept.append(rec if raw else event)
    return {"path": path, "engine": engine, "matched": total, "events": list(kept)}


# ---------------------------------------------------------------------------------------------------------------
# Delivery by guarded paste
# ---------------------------------------------------------------------------------------------------------------


def _refusal(code: str, detail: str, session: dict, state: str = "") -> dict:
    out = {"outcome": "refused", "lane": "tmux", "code": code, "detail": detail, "session": public(session)}
    if state:
        out["state"] = state
    return out


def _check_pane(session: dict, profiles: dict, expect_engine: str) -> tuple:
    """Everything that must hold right before keys go to a pane; returns (refusal or None, screen, state)."""
    socket, pane_id = session["socket"], session["id"]
    flags = pane_flags(socket, pane_id)
    if flags["pane_dead"] == "1":
        return _refusal("pane_dead", "the pane's program has exited", session), "", {}
    if flags["pane_in_mode"] == "1":
        return _refusal("copy_mode", "the pane is in copy mode: a paste would go to tmux, not the program", session), "", {}
    if flags["pane_input_off"] == "1":
        return _refusal("input_off", "input to the pane is turned off (select-pane -d)", session), "", {}
    engine, _pid = detect_engine(int(flags["pane_pid"] or 0), proc_table(), profiles)
    if engine != expect_engine:
        detail = "the pane now runs %s, not the %s that was resolved" % (engine, expect_engine)
        return _refusal("engine_changed", detail, session), "", {}
    screen = capture(socket, pane_id)
    return None, screen, classify(screen, profiles[expect_engine])


def _settle(socket: str, pane_id: str, before: str, max_wait: float) -> str:
    """Wait until the paste has shown on screen and the screen stopped changing (or max_wait passed)."""
    deadline = time.monotonic() + max_wait
    last = before
    changed = False
    while time.monotonic() < deadline:
        time.sleep(0.03)
        now = capture(socket, pane_id)
        if now != before:
            if changed and now == last:
                return now
            changed = True
        last = now
    return last


def _guard_verdict(seen: dict, profile: dict, engine: str) -> tuple:
    """May a paste go to a pane in this state?  (refusal code, detail) or (None, "")."""
    state = seen["state"]
    if state == "dialog":
        return "dialog", "refused: " + seen["reason"]
    if state == "busy" and not profile.get("queues_when_busy"):
        return "busy", "refused: %s, and %s does not queue typed input" % (seen["reason"], engine)
    if state not in ("idle", "busy"):
        return "unrecognised_screen", "refused: " + seen["reason"]
    return None, ""


def _paste(session: dict, payload: str, profiles: dict, expect: str) -> tuple:
    """Load the text, look at the pane one last time, paste.  (refusal or None, screen before, state before)."""
    socket, pane_id = session["socket"], session["id"]
    buffer = "drover-%s" % uuid.uuid4().hex
    # Load first, check last: the gap between the guard's look and the paste is a single tmux call.
    tmux(socket, ["load-buffer", "-b", buffer, "-"], data=payload.encode("utf-8"))
    pasted = False
    try:
        refusal, screen, seen = _check_pane(session, profiles, expect)
        if refusal is not None:
            return refusal, screen, ""
        code, detail = _guard_verdict(seen, profiles[expect], expect)
        if code:
            return _refusal(code, detail, session, seen["state"]), screen, seen["state"]
        try:
            tmux(socket, ["paste-buffer", "-p", "-r", "-d", "-b", buffer, "-t", pane_id])
        except HelperError as exc:
            pasted = True  # or not: tmux did not say; don't touch the buffer either
            raise HelperError(
                "paste_uncertain", "tmux paste-buffer failed (%s): the text may or may not be in the pane" % exc.message
            ) from None
        pasted = True
        return None, screen, seen["state"]
    finally:
        if not pasted:
            try:
                tmux(socket, ["delete-buffer", "-b", buffer])
            except HelperError:
                pass


def deliver_tmux(session: dict, text: str, args: dict, profiles: dict) -> dict:
    engine = session["engine"]
    expect = args.get("expect_engine") or engine
    profile = profiles[engine]
    if expect != engine:
        return _refusal("engine_mismatch", "the pane runs %s, not %s" % (engine, expect), session)
    safe = neutralise(text)
    payload = envelope(safe, args.get("actor") or "unknown", args.get("mode") or "prompting") if profile.get("envelope") else safe
    refusal, before, state = _paste(session, payload, profiles, expect)
    if refusal is not None:
        return refusal
    socket, pane_id = session["socket"], session["id"]
    try:
        _settle(socket, pane_id, before, float(args.get("settle_s", 3.0)) + len(payload) / 200000.0)
        # Re-check before Enter: the pane may have turned into a dialog while the text landed.  Lines of our own
        # text on screen are not a dialog, even if the text quotes one.
        refusal, after, _seen = _check_pane(session, profiles, expect)
        if refusal is None:
            now = classify(after, profile, ignore_text=payload)
            if now["state"] == "dialog":
                detail = "a dialog appeared while the text was landing (%s): Enter was not sent, nothing was submitted"
                refusal = _refusal("dialog_after_paste", detail % now["reason"], session, "dialog")
        if refusal is not None:
            refusal["pasted"] = True
            return refusal
        tmux(socket, ["send-keys", "-t", pane_id, "Enter"])
    except HelperError as exc:
        # The text is in the pane; whether Enter went is unknown. Say so, never "delivered".
        return {
            "outcome": "failed",
            "lane": "tmux",
            "code": exc.code,
            "detail": "the text was pasted, then %s: it may sit unsent in the input" % exc.message,
            "pasted": True,
            "indeterminate": True,
            "session": public(session),
        }
    idle = state == "idle"
    return {
        "outcome": "delivered" if idle else "queuedBehindTurn",
        "lane": "tmux",
        "detail": "pasted and submitted into an idle pane" if idle else "pasted while busy; %s queues it" % engine,
        "state": state,
        "enveloped": bool(profile.get("envelope")),
        "chars": len(payload),
        "session": public(session),
    }


# ---------------------------------------------------------------------------------------------------------------
# Ops
# ---------------------------------------------------------------------------------------------------------------


def op_hello(args: dict, profiles: dict) -> dict:
    warnings: list = []
    sessions = discover(profiles, warnings)
    engines: dict = {}
    for s in sessions:
        engines[s["engine"]] = engines.get(s["engine"], 0) + 1
    _live, stale = claude_records(warnings)
    return {
        "protocol": PROTOCOL,
        "python": "%d.%d.%d" % sys.version_info[:3],
        "platform": sys.platform,
        "user": os.environ.get("USER") or str(os.getuid()),
        "tmux": tmux_version(),
        "engines": engines,
        "stale_claude_sessions": stale,
        "warnings": warnings,
    }


def op_list(args: dict, profiles: dict) -> dict:
    warnings: list = []
    sessions = discover(profiles, warnings)
    if args.get("state", True):
        sessions = [with_state(s, profiles) for s in sessions]
    return {"sessions": [public(s) for s in sessions], "warnings": warnings}


def op_status(args: dict, profiles: dict) -> dict:
    warnings: list = []
    session = with_state(find(args, profiles, warnings), profiles)
    screen = session.get("_screen", "")
    tail = [line for line in _lines(screen) if line.strip()][-int(args.get("tail", 8)) :]
    out = public(session)
    out["tail"] = tail
    return {"session": out, "warnings": warnings}


def op_deliver(args: dict, profiles: dict) -> dict:
    text = args.get("text")
    if not isinstance(text, str) or not text.strip():
        raise HelperError("empty_text", "the message text is empty")
    warnings: list = []
    session = find(args, profiles, warnings)
    lane = args.get("lane") or "auto"
    pane = session.get("_pane") if "_record" in session else session
    expect = args.get("expect_engine")
    if expect and expect != session["engine"]:
        return _refusal("engine_mismatch", "the session runs %s, not %s" % (session["engine"], expect), session)
    if lane == "inbox" or (lane == "auto" and "inbox" in session["lanes"]):
        if "inbox" not in session["lanes"]:
            raise HelperError("bad_lane", "%s has no inbox (only Claude Code sessions do); use --via tmux" % _brief(session))
        outcome = deliver_inbox(session, text, args)
        if lane == "auto" and outcome.get("code") == "socket_missing" and pane is not None:
            fallback = deliver_tmux(pane, text, args, profiles)
            fallback["detail"] = "no inbox socket, so by guarded paste: " + fallback["detail"]
            return fallback
        return outcome
    if lane not in ("auto", "tmux"):
        raise HelperError("bad_lane", "unknown lane %r: auto, inbox or tmux" % lane)
    if pane is None:
        raise HelperError("bad_lane", "%s has no tmux pane to paste into" % _brief(session))
    if "_record" in session and session["state"] == "waiting":
        # Claude says it waits on its human: whatever the screen looks like, an Enter could answer that.
        return _refusal("waiting", "refused: Claude reports it is %s" % session["reason"], pane, "waiting")
    if args.get("as_owner") and pane["engine"] == "claude" and "_record" in session:
        args = dict(args, mode=permission_class(session)[0])
    return deliver_tmux(pane, text, args, profiles)


def op_wait(args: dict, profiles: dict) -> dict:
    until = args.get("until", "idle")
    if until not in ("idle", "exited"):
        raise HelperError("bad_request", "until must be idle or exited, not %r" % until)
    timeout = float(args.get("timeout_s", 600))
    warnings: list = []
    session = find(args, profiles, warnings)
    started = time.monotonic()
    claude = "_record" in session
    if claude and (until == "exited" or "inbox" in session["lanes"]):
        # Exit is watched on the process; idle comes as Claude's own notice through the inbox.
        result = wait_claude(session, until, timeout)
    else:
        pane = session.get("_pane") if claude else session
        if pane is None:
            raise HelperError("bad_request", "%s has neither an inbox nor a pane to watch" % _brief(session))
        result = wait_pane(pane, until, timeout, profiles)
    result["waited_s"] = round(time.monotonic() - started, 3)
    result["session"] = public(session)
    return result


def op_read(args: dict, profiles: dict) -> dict:
    target = args.get("target", "")
    warnings: list = []
    try:
        session = find(args, profiles, warnings)
    except HelperError as exc:
        if exc.code != "session_not_found":
            raise
        session = None  # a Codex rollout id, or an ended Claude session, may still have a transcript
    path, engine = transcript_for(session, target)
    out = read_transcript(path, engine, args)
    out["session"] = public(session) if session else None
    return out


def op_classify(args: dict, profiles: dict) -> dict:
    engine = args.get("engine", "shell")
    if engine not in profiles:
        raise HelperError("unknown_engine", "no profile for engine %r (known: %s)" % (engine, ", ".join(sorted(profiles))))
    return classify(args.get("screen", ""), profiles[engine])


OPS = {
    "hello": op_hello,
    "list": op_list,
    "status": op_status,
    "deliver": op_deliver,
    "wait": op_wait,
    "read": op_read,
    "classify": op_classify,
}


def handle(request: dict) -> dict:
    """Answer one request; every failure becomes an error answer, never an exception."""
    try:
        if not isinstance(request, dict):
            raise HelperError("bad_request", "the request must be a JSON object")
        if request.get("helper") != PROTOCOL:
            raise HelperError(
                "protocol", "helper protocol %r requested, this helper speaks %d" % (request.get("helper"), PROTOCOL)
            )
        op = OPS.get(request.get("op", ""))
        if op is None:
            raise HelperError("bad_request", "unknown helper op %r" % request.get("op"))
        profiles = merge_profiles(request.get("profiles"))
        return {"helper": PROTOCOL, "ok": True, "data": op(request.get("args") or {}, profiles)}
    except HelperError as exc:
        error: dict = {"code": exc.code, "message": exc.message}
        error.update(exc.extra)
        return {"helper": PROTOCOL, "ok": False, "error": error}
    except Exception as exc:  # noqa: BLE001 - the answer must be JSON whatever happened
        return {
            "helper": PROTOCOL,
            "ok": False,
            "error": {"code": "helper_crash", "message": "%s: %s" % (type(exc).__name__, exc)},
        }


def main() -> int:
    raw = sys.stdin.read()
    try:
        request = json.loads(raw)
    except ValueError as exc:
        answer = {"helper": PROTOCOL, "ok": False, "error": {"code": "bad_request", "message": "bad JSON: %s" % exc}}
    else:
        answer = handle(request)
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
