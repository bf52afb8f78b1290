"""tmux: every server of this user, its panes, and the few commands the lanes need."""

import os
import re
import shutil
import socket as socketlib
import subprocess
import time
from typing import Dict, List, Optional, Tuple

from .protocol import NO_TMUX, PANE_GONE, TMUX_ERROR, TMUX_TIMEOUT, HelperError

TMUX_TIMEOUT_S = 10.0
Pane = Dict[str, str]
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
FORMAT = SEP.join("#{%s}" % f for f in FIELDS)
# Fields that must look like what tmux makes of them: a row that does not is not trusted (a directory, a title or a
# session name is anybody's text, and tmux prints it raw, newlines and separators included).
NUMERIC = ("window_index", "pane_index", "pane_pid", "window_activity", "window_panes", "session_windows")
LAX = ("pane_pid", "window_activity")
FLAGS = ("pane_dead", "pane_in_mode", "pane_input_off")


def _format() -> Tuple[str, str, str]:
    """(format, row marker, field separator) for one listing, each carrying a fresh random nonce: no directory
    name, title or session name can forge a row or a field boundary it cannot know."""
    nonce = os.urandom(8).hex()
    start, sep = "\x1e%s\x1e" % nonce, "\x1f%s\x1f" % nonce
    return start + sep.join("#{%s}" % f for f in FIELDS), start, sep


def _valid(pane: Pane) -> bool:
    if not pane["pane_id"].startswith("%") or not pane["pane_id"][1:].isdigit():
        return False
    # A pid or an activity time may be empty (tmux leaves them so at times); an index never is.
    if any(not (pane[f].isdigit() or (f in LAX and not pane[f])) for f in NUMERIC):
        return False
    return all(pane[f] in ("0", "1", "") for f in FLAGS)


def parse_rows(out: str, start: str, sep: str, warnings: List[str], where: str) -> List[Pane]:
    """The panes of one list-panes answer: each row begins with the listing's marker, its fields split by the
    listing's separator (a field may hold a newline: a directory named so).  A row that does not parse is dropped,
    and so is every row of a pane id seen twice (one of them is forged, and which one is unknowable), each with a
    warning."""
    panes: List[Pane] = []
    chunks = out.split(start)
    if chunks[0].strip():
        warnings.append("tmux server %s: dropped output outside any pane's row" % where)
    for chunk in chunks[1:]:
        if chunk.endswith("\n"):
            chunk = chunk[:-1]
        parts = chunk.split(sep)
        pane = dict(zip(FIELDS, parts))
        if len(parts) != len(FIELDS) or not _valid(pane):
            warnings.append("tmux server %s: dropped a pane row that does not parse (%r)" % (where, chunk[:80]))
            continue
        panes.append(pane)
    count: Dict[str, int] = {}
    for pane in panes:
        count[pane["pane_id"]] = count.get(pane["pane_id"], 0) + 1
    for pane_id in sorted(p for p, n in count.items() if n > 1):
        warnings.append(
            "tmux server %s: pane %s listed %d times: dropped, which row is real is unknown" % (where, pane_id, count[pane_id])
        )
    return [p for p in panes if count[p["pane_id"]] == 1]


def servers() -> List[str]:
    """Socket paths of every tmux server this user may have: the default socket directory, plus $TMUX's."""
    paths = []
    current = os.environ.get("TMUX", "").split(",")[0]
    if current:
        paths.append(current)
    seen = {os.path.realpath(p) for p in paths}  # each path resolved once: a full directory is not n^2 realpaths
    base = os.path.join(os.environ.get("TMUX_TMPDIR") or "/tmp", "tmux-%d" % os.getuid())
    try:
        for name in sorted(os.listdir(base)):
            path = os.path.join(base, name)
            # One server however its path is spelt ($TMUX through a symlinked directory): listed once.
            real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                paths.append(path)
    except OSError:
        pass
    return paths


def tmux(socket: str, args: List[str], data: Optional[bytes] = None, timeout: float = TMUX_TIMEOUT_S) -> str:
    # -u: UTF-8 whatever the locale.  Python 3.6 does not coerce a C locale to UTF-8 for its children as 3.7+
    # does, and tmux in a C locale prints every control or non-ASCII character of a format or a screen as "_".
    cmd = ["tmux", "-u", "-S", socket] + args
    try:
        proc = subprocess.run(cmd, input=data, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    except FileNotFoundError:
        raise HelperError(NO_TMUX, "tmux is not installed on this host") from None
    except subprocess.TimeoutExpired:
        raise HelperError(
            TMUX_TIMEOUT, "tmux did not answer within %.0fs (%s): is its server stuck?" % (timeout, args[0])
        ) from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()
        raise HelperError(TMUX_ERROR, "tmux %s failed: %s" % (args[0], err or "exit %d" % proc.returncode))
    return proc.stdout.decode("utf-8", "replace")


def version() -> Optional[str]:
    try:
        proc = subprocess.run(["tmux", "-V"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.decode().strip() or None


NO_TMUX_WARNING = "tmux is not installed on this host, so no tmux panes are listed"


def alive(socket_path: str) -> bool:
    """Does a server answer on this socket?  Probed in-process: a crashed server leaves its socket behind, and
    asking tmux about each one costs a process per dead socket on every listing."""
    probe = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(socket_path)
    except (ConnectionRefusedError, FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True  # something else (permissions, a slow server): let tmux say what it is
    finally:
        probe.close()
    return True


# What the last listing saw, so that a listing's screens cost one tmux process per server, not one per pane.
_LISTED = {}  # type: Dict[str, List[str]]
_SCREENS = {}  # type: Dict[Tuple[str, str], str]
_LISTED_AT = [0.0]
FRESH_S = 2.0  # a long-lived helper never hands out a screen captured for a listing older than this


def list_panes(warnings: List[str]) -> List[Pane]:
    panes: List[Pane] = []
    _LISTED.clear()
    _SCREENS.clear()
    _LISTED_AT[0] = time.monotonic()
    if shutil.which("tmux") is None:
        warnings.append(NO_TMUX_WARNING)
        return panes
    for socket in servers():
        if not alive(socket):
            continue
        fmt, start, sep = _format()
        try:
            out = tmux(socket, ["list-panes", "-a", "-F", fmt], timeout=5)
        except HelperError as exc:
            # A socket with no server behind it is what tmux leaves after a crash: not worth a word unless the
            # server exists but misbehaves.
            if exc.code == TMUX_ERROR and ("no server running" in exc.message or "error connecting" in exc.message):
                continue
            if exc.code == NO_TMUX:
                warnings.append(NO_TMUX_WARNING)
                return panes
            warnings.append("tmux server %s: %s" % (socket, exc.message))
            continue
        for pane in parse_rows(out, start, sep, warnings, socket):
            pane["socket"] = socket
            panes.append(pane)
            _LISTED.setdefault(socket, []).append(pane["pane_id"])
    return panes


def screen(socket: str, pane_id: str) -> str:
    """A pane's screen for a listing or a status: the first one asked for on a server captures every pane the
    listing saw there, in one tmux process; each screen is handed out once, and the next listing forgets them.
    Never for the lanes' checks: those capture right before they act (`capture`)."""
    key = (socket, pane_id)
    if time.monotonic() - _LISTED_AT[0] > FRESH_S:
        _LISTED.clear()
        _SCREENS.clear()
    if key not in _SCREENS and pane_id in _LISTED.get(socket, ()):
        _SCREENS.update(_capture_all(socket, _LISTED.pop(socket)))
    if key in _SCREENS:
        return _SCREENS.pop(key)
    return capture(socket, pane_id)


def _capture_all(socket: str, pane_ids: List[str]) -> Dict[Tuple[str, str], str]:
    """Every pane's screen from one tmux command sequence, each after a marker no screen can forge (a random
    nonce).  A pane gone since the listing fails the sequence: then each is captured on its own."""
    nonce = os.urandom(8).hex()
    args: List[str] = []
    for i, pane_id in enumerate(pane_ids):
        say = ["display-message", "-p", "%s %d" % (nonce, i)]
        args += ([";"] if args else []) + say + [";", "capture-pane", "-p", "-t", pane_id]
    try:
        out = tmux(socket, args)
    except HelperError:
        return {}
    screens = {}
    for i, pane_id in enumerate(pane_ids):
        mark = "%s %d\n" % (nonce, i)
        at = out.find(mark)
        if at < 0:
            break
        out = out[at + len(mark) :]
        end = out.find("%s %d\n" % (nonce, i + 1))
        screens[(socket, pane_id)] = out if end < 0 else out[:end]
    return screens


def capture(socket: str, pane_id: str) -> str:
    return tmux(socket, ["capture-pane", "-p", "-t", pane_id])


def pane_flags(socket: str, pane_id: str) -> Pane:
    fmt, start, sep = _format()
    out = tmux(socket, ["display-message", "-p", "-t", pane_id, fmt])
    out = out[:-1] if out.endswith("\n") else out
    parts = out[len(start) :].split(sep) if out.startswith(start) else []
    # tmux 3.3 answers display-message for a pane that no longer exists with exit 0 and empty fields.
    if len(parts) != len(FIELDS) or parts[0] != pane_id:
        raise HelperError(PANE_GONE, "pane %s is gone" % pane_id)
    return dict(zip(FIELDS, parts))


# -- the Enter that lands only on the screen drover looked at ----------------------------------------------------

# What any redraw, key echo or dialog of the program moves, read by tmux itself: the cursor (a program that follows
# its text with the cursor -- Claude Code, Codex, the demo agent -- moves it at every key typed into its box, and to
# a choice line when it draws a dialog), the scrollback a full-screen clear pushes into history, the screen it is
# drawn on, and the pane's own state.  Compared inside the server in the same step as the key (press_if).
WITNESS = (
    "cursor_x",
    "cursor_y",
    "cursor_flag",
    "history_size",
    "history_bytes",
    "alternate_on",
    "pane_width",
    "pane_height",
    "pane_in_mode",
    "pane_input_off",
    "pane_dead",
    "pane_pid",
)


def witness(socket: str, pane_id: str) -> Dict[str, str]:
    """The pane's WITNESS fields now, as press_if compares them."""
    nonce = os.urandom(8).hex()
    out = tmux(socket, ["display-message", "-p", "-t", pane_id, nonce + " " + " ".join("#{%s}" % f for f in WITNESS)])
    fields = out.strip("\n").split(" ")
    # tmux 3.3 answers display-message for a gone pane with empty fields; every witness is a number.
    if fields[0] != nonce or len(fields) != len(WITNESS) + 1 or not all(f.isdigit() for f in fields[1:]):
        raise HelperError(PANE_GONE, "pane %s is gone" % pane_id)
    return dict(zip(WITNESS, fields[1:]))


def press_if(socket: str, pane_id: str, key: str, seen: Dict[str, str]) -> bool:
    """Press `key` in the pane only if every WITNESS field still reads as in `seen`; True if it was pressed.

    tmux evaluates the condition and sends the key in one step of its server loop.  That step is deferred to a
    timer (`run-shell -d 0`): in the loop round that runs it, libevent hands tmux every pane's pending output before
    any timer, so whatever the program had written when drover's request arrived -- a dialog, a person's key
    echoed into the box -- is on tmux's screen by the time the condition is read.  What is left is output written
    in the microseconds between that round's poll and the condition, and a key or dialog the program has not
    drawn yet (no terminal can show those)."""
    # Both go into a tmux command line: a key name from a profile (submit_when_busy) must be a key name, nothing more.
    if not re.match(r"^[A-Za-z0-9-]+$", key) or not re.match(r"^%[0-9]+$", pane_id):
        raise HelperError(TMUX_ERROR, "not a tmux key name or pane id: %r %r" % (key, pane_id))
    nonce = os.urandom(8).hex()
    # `##{` survives run-shell's own expansion of its argument as `#{`, read by if-shell when the timer fires.
    now = "/".join("##{%s}" % f for f in WITNESS)
    then = "/".join(seen[f] for f in WITNESS)
    condition = "##{==:%s,%s}" % (now, then)
    pressed = "send-keys -t %s %s ; display-message -p %s-pressed" % (pane_id, key, nonce)
    skipped = "display-message -p %s-skipped" % nonce
    command = "if-shell -t %s -F '%s' '%s' '%s'" % (pane_id, condition, pressed, skipped)
    out = tmux(socket, ["run-shell", "-t", pane_id, "-C", "-d", "0", command])
    if nonce + "-pressed" in out:
        return True
    if nonce + "-skipped" in out:
        return False
    raise HelperError(TMUX_ERROR, "tmux did not say whether it pressed %s (%r)" % (key, out[-80:]))
