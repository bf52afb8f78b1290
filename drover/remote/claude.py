"""Claude Code sessions: the registry in ~/.claude/sessions, liveness, and the permission class a session runs in.

The facts are in shared/design/claude-code-inbox.md; Anthropic calls these formats internal, so anything drover
does not understand is skipped with a warning, never guessed at.
"""

import glob
import json
import os
import re
from typing import Any, Dict, List, Optional, Tuple

from . import procs, tmux
from .protocol import HelperError
from .screen import lines_of

Record = Dict[str, Any]


claude_dir = procs.claude_dir


def stale_reason(rec: Record, domain: Optional[str]) -> Optional[str]:
    """Why a record no longer names a live session (None: it does).  The pid alone is not enough: pids are reused."""
    pid = rec["pid"]
    if rec.get("pidDomain") and domain and rec["pidDomain"] != domain:
        return "recorded in another pid namespace or machine (%s): its pid cannot be checked here" % rec["pidDomain"]
    started = procs.proc_start(pid)
    if started is None:
        return "pid %d is gone" % pid
    if rec.get("procStart") is not None and str(rec["procStart"]) != started:
        return "pid %d now belongs to another process (procStart differs)" % pid
    return None


def records(warnings: List[str], extra_dirs: Optional[List[str]] = None) -> Tuple[List[Record], List[Dict[str, Any]]]:
    """(live records, stale records) from the registries -- the helper's own config dir's and every one a running
    Claude was seen to use (`extra_dirs`); unreadable records are skipped with a warning."""
    live, stale = [], []  # type: List[Record], List[Dict[str, Any]]
    seen = set()  # type: set
    for config in procs.claude_dirs(extra_dirs):
        for rec in _records_in(config, warnings, stale):
            # One record per process, not per sessionId: `claude --resume ID` beside the running session is a
            # second live process with its own socket, and dropping its record left its pane to look inbox-less.
            key = (rec["sessionId"], rec["pid"])
            if key not in seen:
                seen.add(key)
                live.append(rec)
    return live, stale


def _records_in(config: str, warnings: List[str], stale: List[Dict[str, Any]]) -> List[Record]:
    folder = os.path.join(config, "sessions")
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    live = []
    domain = procs.pid_domain()
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
        reason = stale_reason(rec, domain)
        if reason:
            stale.append({"pid": rec["pid"], "id": rec["sessionId"], "name": rec.get("name"), "reason": reason, "record": path})
        else:
            rec["_path"] = path
            rec["_config"] = config
            live.append(rec)
    return live


def record_now(rec: Record) -> Optional[Record]:
    """The record as it is on disk now, if it still names the same session."""
    try:
        with open(rec["_path"], encoding="utf-8") as f:
            now = json.load(f)
    except (OSError, ValueError):
        return None
    return now if isinstance(now, dict) and now.get("sessionId") == rec["sessionId"] else None


def alive(rec: Record) -> bool:
    return stale_reason(rec, procs.pid_domain()) is None


def _state(rec: Record) -> Tuple[str, str]:
    status = rec.get("status")
    if status == "idle":
        return "idle", "Claude reports idle"
    if status == "busy":
        return "busy", "a turn is running"
    if status == "waiting":
        return "waiting", "waiting for %s" % (rec.get("waitingFor") or "something")
    return "unknown", "Claude reports status %r" % status


def session_from_record(rec: Record, pane: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    former = [n for n in rec.get("formerNames") or [] if isinstance(n, str)]
    state, reason = _state(rec)
    lanes = (["inbox"] if rec.get("messagingSocketPath") else []) + (["tmux"] if pane else [])
    updated = rec.get("statusUpdatedAt") or rec.get("updatedAt") or rec.get("startedAt")
    return {
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
        # Not the former names: a live session that now bears one of them by name must win (see discovery.resolve).
        "aliases": [rec["sessionId"], str(rec["pid"])] + (pane["aliases"] if pane else []),
        "_record": rec,
        "_pane": pane,
    }


def transcripts(session_id: str) -> List[str]:
    pattern = os.path.join("projects", "*", "%s.jsonl" % glob.escape(session_id))
    return [hit for config in procs.claude_dirs() for hit in glob.glob(os.path.join(glob.escape(config), pattern))]


# -- the permission class a session runs in ---------------------------------------------------------------------

FOOTER_MODES = [
    ("bypass permissions on", "bypassPermissions"),
    ("accept edits on", "acceptEdits"),
    ("auto mode on", "auto"),
    ("plan mode on", "plan"),
    ("manual mode on", "default"),
]


def _transcript_mode(session_id: str) -> Optional[str]:
    mode = None
    for path in transcripts(session_id):
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


def _screen_mode(pane: Optional[Dict[str, Any]]) -> Optional[str]:
    if pane is None:
        return None
    try:
        screen = tmux.capture(pane["socket"], pane["id"])
    except HelperError:
        return None  # no screen is just no evidence
    for line in reversed(lines_of(screen)[-6:]):
        for words, mode in FOOTER_MODES:
            if words in line:
                return mode
    return None


def _argv_mode(pid: int) -> Optional[str]:
    argv = procs.argv_of(pid)
    if argv is None:
        return None
    if "--dangerously-skip-permissions" in argv:
        return "bypassPermissions"
    for i, arg in enumerate(argv):
        if arg == "--permission-mode" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--permission-mode="):
            return arg.split("=", 1)[1]
    return None


def _setting(path: str, key: str) -> Any:
    """One top-level key of a Claude settings file, or None (no file, not JSON, no such key)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data.get(key) if isinstance(data, dict) else None


def _project_settings(cwd: str) -> List[str]:
    return [os.path.join(cwd, ".claude", "settings.local.json"), os.path.join(cwd, ".claude", "settings.json")]


def _settings_mode(cwd: str) -> Optional[str]:
    """permissions.defaultMode from the settings a session starts with: the project's, then the user's."""
    for path in _project_settings(cwd) + [os.path.join(claude_dir(), "settings.json")]:
        permissions = _setting(path, "permissions")
        mode = permissions.get("defaultMode") if isinstance(permissions, dict) else None
        if isinstance(mode, str):
            return mode
    return None


MANAGED_SETTINGS = "/etc/claude-code/managed-settings.json"
INBOUND_RANK = {"accept": 0, "hold": 1, "refuse": 2}


def managed_dropins() -> List[str]:
    """Managed settings drop-ins (/etc/claude-code/managed-settings.d/*.json), which Claude merges and drover does not."""
    return sorted(glob.glob(os.path.join(MANAGED_SETTINGS[: -len(".json")] + ".d", "*.json")))


def inbound_setting(cwd: str, config: Optional[str] = None) -> Tuple[Optional[str], Optional[str]]:
    """(crossSessionInbound as a session in `cwd` reads it, the file that sets it), or (None, None) when unset.

    As Claude Code 2.1.328 reads it (live, without a restart): the managed settings, else the user's; a project's
    own settings (.claude/settings.local.json, .claude/settings.json) can only tighten that (accept < hold < refuse).
    Said to explain a receipt, never to decide one: the receiver decides."""
    value, where = None, None  # type: Optional[str], Optional[str]
    for path in (MANAGED_SETTINGS, os.path.join(config or claude_dir(), "settings.json")):
        found = _setting(path, "crossSessionInbound")
        if found in INBOUND_RANK:
            value, where = found, path
            break
    for path in _project_settings(cwd) if cwd else []:
        found = _setting(path, "crossSessionInbound")
        if found in INBOUND_RANK and INBOUND_RANK[found] > INBOUND_RANK[value or "accept"]:
            value, where = found, path
    return value, where


def permission_class(session: Dict[str, Any]) -> Tuple[str, Optional[str], Optional[str]]:
    """('bypass' | 'prompting', the mode seen, where it was seen) for a Claude session.

    The transcript's latest permission mode is authoritative (it follows shift+tab), but a session writes its
    transcript only from its first turn; before that, the footer on its screen, then its command line.  A Claude
    pane that has no registry record (an older version) is judged by its screen and command line.
    """
    rec = session.get("_record")
    pane = session.get("_pane") if rec is not None else session  # a Claude pane without a registry record
    finders = (
        ("transcript", lambda: _transcript_mode(rec["sessionId"]) if rec is not None else None),
        ("screen", lambda: _screen_mode(pane)),
        ("command line", lambda: _argv_mode(session["engine_pid"])),
        ("settings", lambda: _settings_mode(session.get("cwd") or "")),
    )
    for source, finder in finders:
        mode = finder()
        if mode:
            return ("bypass" if mode == "bypassPermissions" else "prompting"), mode, source
    return "prompting", None, None
