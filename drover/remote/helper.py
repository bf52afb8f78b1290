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

import json
import os
import re
import subprocess
import sys
import time
import unicodedata
import uuid
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
    panes = list_panes(warnings)
    table = proc_table() if panes else {}
    return [_session_from_pane(p, table, profiles) for p in panes]


def with_state(session: dict, profiles: dict) -> dict:
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
    for key in (lambda s: [s["id"]] + s["aliases"], lambda s: [s["name"]]):
        hits = [s for s in sessions if target in key(s)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise HelperError(
                "ambiguous_session",
                "%r matches %d sessions: %s" % (target, len(hits), ", ".join(_brief(s) for s in hits[:10])),
                candidates=[{"id": s["id"], "server": s["server"], "name": s["name"]} for s in hits],
            )
    hits = [s for s in sessions if s["name"].startswith(target) or s["id"].startswith(target)]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise HelperError(
            "ambiguous_session",
            "%r is a prefix of %d sessions: %s" % (target, len(hits), ", ".join(_brief(s) for s in hits[:10])),
            candidates=[{"id": s["id"], "server": s["server"], "name": s["name"]} for s in hits],
        )
    known = ", ".join(_brief(s) for s in sessions[:8]) or "none"
    raise HelperError("session_not_found", "no session %r on this host (sessions here: %s)" % (target, known))


def public(session: dict) -> dict:
    return {k: v for k, v in session.items() if not k.startswith("_") and k not in ("aliases", "socket")}


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
        tmux(socket, ["paste-buffer", "-p", "-r", "-d", "-b", buffer, "-t", pane_id])
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
    return {
        "protocol": PROTOCOL,
        "python": "%d.%d.%d" % sys.version_info[:3],
        "platform": sys.platform,
        "user": os.environ.get("USER") or str(os.getuid()),
        "tmux": tmux_version(),
        "engines": engines,
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
    session = with_state(resolve(args.get("target", ""), discover(profiles, warnings)), profiles)
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
    session = resolve(args.get("target", ""), discover(profiles, warnings))
    lane = args.get("lane") or "auto"
    if lane not in ("auto", "tmux"):
        raise HelperError("bad_lane", "lane %r is not available for %s here" % (lane, session["id"]))
    return deliver_tmux(session, text, args, profiles)


def op_classify(args: dict, profiles: dict) -> dict:
    engine = args.get("engine", "shell")
    if engine not in profiles:
        raise HelperError("unknown_engine", "no profile for engine %r (known: %s)" % (engine, ", ".join(sorted(profiles))))
    return classify(args.get("screen", ""), profiles[engine])


OPS = {"hello": op_hello, "list": op_list, "status": op_status, "deliver": op_deliver, "classify": op_classify}


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
