"""A session's last words, once it is gone: what `drover watch run` tells a parent about a delegate that exited.

Asked only about a session the listing no longer shows live.  Its pane, when tmux still keeps it (remain-on-exit:
the pane is dead but its screen and exit status are there), is the best witness; else its transcript's last
entries: Claude's by its session id, the demo agent's log by the path its command line gave.  Each part that cannot
be had is None with the reason in `why`: a gone session is described as far as the host can, never guessed at.
"""

import os
from typing import Any, Dict, List, Optional

from .protocol import NO_TRANSCRIPT, HelperError

Profiles = Dict[str, Dict[str, Any]]

TAIL = 12  # lines of a dead pane's screen, entries of a transcript


def _socket(server: str) -> str:
    base = os.path.join(os.environ.get("TMUX_TMPDIR") or "/tmp", "tmux-%d" % os.getuid())
    return os.path.join(base, server)


def _pane(server: str, pane: str, pid: Any) -> Optional[Dict[str, Any]]:
    """The dead pane's screen and exit status, if tmux still holds that very pane (same pid): else None."""
    from . import tmux
    from .screen import lines_of

    socket = _socket(server)
    if not server or not pane.startswith("%") or not os.path.exists(socket):
        return None
    try:
        fmt = "#{pane_dead}|#{pane_dead_status}|#{pane_pid}|#{pane_dead_signal}"
        flags = tmux.tmux(socket, ["display-message", "-p", "-t", pane, fmt], timeout=5)
    except HelperError:
        return None
    parts = (flags.strip().split("|") + [""])[:4]  # pane_dead_signal: tmux 3.3 and later (else empty)
    if parts[0] != "1":
        return None  # gone, or a live pane: the listing's word on liveness stands, not this one
    if pid not in (None, "") and parts[2] and parts[2] != str(pid):
        return None  # a newer pane that took the id on a restarted server: not this session's screen
    try:
        screen = tmux.capture(socket, pane)
    except HelperError:
        screen = ""
    lines = [line for line in lines_of(screen) if line.strip()][-TAIL:]
    status = int(parts[1]) if parts[1].lstrip("-").isdigit() else None
    signal = int(parts[3]) if parts[3].isdigit() else None  # killed: no status, the signal (9 for kill -9)
    return {"tail": lines, "exit_status": status, "exit_signal": signal}


def _log_of(command: List[str]) -> Optional[str]:
    if "--log" in command and command.index("--log") + 1 < len(command):
        return command[command.index("--log") + 1]
    return None


def _transcript(engine: str, session_id: str, command: List[str]) -> Any:
    from . import claude, transcripts

    if engine == "claude" and session_id:
        hits = claude.transcripts(session_id)
        if not hits:
            raise HelperError(NO_TRANSCRIPT, "Claude session %s left no transcript" % session_id)
        path = max(hits, key=os.path.getmtime)
    elif engine == "demo" and _log_of(command):
        path = os.path.expanduser(str(_log_of(command)))
        if not os.path.isfile(path):
            raise HelperError(NO_TRANSCRIPT, "the demo agent's log %s is not there" % path)
    else:
        raise HelperError(NO_TRANSCRIPT, "drover reads a gone %s session's transcript only for claude and demo" % engine)
    return transcripts.read(path, engine, {"last": TAIL, "max_chars": 500})["events"]


def last_words(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    """{"tail": [lines] | None, "exit_status": int | None, "exit_signal": int | None, "transcript": [events] | None,
    "why": [reasons]}."""
    why = []  # type: List[str]
    out = {"tail": None, "exit_status": None, "exit_signal": None, "transcript": None, "why": why}  # type: Dict[str, Any]
    dead = _pane(str(args.get("server") or ""), str(args.get("pane") or ""), args.get("pid"))
    if dead is not None:
        out.update(dead)
    else:
        why.append("its pane is gone (no remain-on-exit): no screen, no exit status")
    try:
        out["transcript"] = _transcript(
            str(args.get("engine") or ""), str(args.get("session_id") or ""), list(args.get("command") or [])
        )
    except HelperError as exc:
        why.append(exc.message)
    except (OSError, ValueError) as exc:
        why.append("its transcript could not be read: %s" % exc)
    return out
