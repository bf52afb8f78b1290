"""Starting a new agent session on this host: a tmux session of its own, the engine in it, and waiting until it is
ready -- or until it shows a dialog, which drover never answers.

The client sends the engine's command line as a template (`{cwd}` and `{name}` are filled in here, shell-quoted,
after `~` is expanded on this host), the tmux server to use, how long to wait, and the folders the fleet
pre-trusts.  A pre-trusted folder is written into the engine's own settings file (Claude's `~/.claude.json`,
Codex's `$CODEX_HOME/config.toml`) before the engine starts, so it never asks; any other folder the engine does
not trust yet stops at its trust dialog, and the answer says so (`state: waiting`).

A spawn may carry arguments of its own for the engine (`drover spawn ... -- --model X`): appended to the template's
command line for that spawn only, as argv (see pane_command), never through a shell's parsing.

Stdlib only and Python 3.6+: shipped to every host inside the helper bundle.
"""

import json
import os
import re
import shlex
import stat
import string
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional

from . import discovery, tmux
from .protocol import (
    BAD_REQUEST,
    CWD_NOT_FOUND,
    ENGINE_EXITED,
    NAME_TAKEN,
    SHARED_CWD,
    SPAWN_TIMEOUT,
    TRUST_FILE_ERROR,
    UNKNOWN_ENGINE,
    HelperError,
)
from .screen import classify, lines_of

Profiles = Dict[str, Dict[str, Any]]

# A tmux session name that every later command can name exactly: no ':' or '.', which tmux reads as separators.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")  # \Z, not $: `$` lets a final newline through
# Control characters (C0, DEL, C1) and Unicode line breaks: a directory holding one is refused.
CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
PLACEHOLDERS = ("cwd", "name")
GIT_TIMEOUT_S = 5.0
POLL_S = 0.25
# A dialog must be seen on two looks in a row: a screen caught mid-redraw can show a fragment of one.
DIALOG_LOOKS = 2
# A Claude screen that is idle with no registry record for this long is taken as ready (an older Claude that
# keeps no registry); the record normally follows the idle screen within a second.
CLAUDE_RECORD_GRACE_S = 8.0
# A Claude is briefed only once its record has said idle, with no dialog on its screen, for this long: at start-up
# its record goes idle before a dialog it is about to show is drawn (the "Make auto mode your default?" dialog,
# measured on 2.1.328: drawn 14-48 ms after the record said idle, its record saying `waiting` 7-26 ms later), and a
# brief sent into that gap dismisses the dialog.  Twenty times the widest gap measured, for a loaded machine.
CLAUDE_SETTLE_S = 1.0


def fill(template: str, cwd: str, name: str) -> str:
    """The engine's command line: the template with {cwd} and {name} shell-quoted; any other field is an error."""
    values = {"cwd": shlex.quote(cwd), "name": shlex.quote(name)}
    try:
        for _text, field, _spec, _conv in string.Formatter().parse(template):
            if field is not None and field not in values:
                raise HelperError(BAD_REQUEST, "the command template names {%s}: only {cwd} and {name} are filled in" % field)
        return template.format(**values)
    except (ValueError, IndexError) as exc:
        raise HelperError(BAD_REQUEST, "the command template %r is not valid: %s" % (template, exc)) from None


def _cwd(raw: str) -> str:
    if CONTROL_CHARS.search(raw or ""):
        raise HelperError(BAD_REQUEST, "the directory %r holds a control character (a newline, CR, ESC, ...)" % raw)
    path = os.path.expanduser(raw or "")
    if not os.path.isabs(path):
        raise HelperError(CWD_NOT_FOUND, "the directory %r is not an absolute path (give /path or ~/path)" % raw)
    if not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist on this host"
        raise HelperError(CWD_NOT_FOUND, "the directory %s %s" % (path, what))
    real = os.path.realpath(path)
    if CONTROL_CHARS.search(real):  # a symlink on the way may lead somewhere whose name holds one
        raise HelperError(BAD_REQUEST, "the directory %r holds a control character (a newline, CR, ESC, ...)" % real)
    return real


def engine_args(raw: Any) -> List[str]:
    """The spawn's own arguments for the engine (`drover spawn ... -- ARGS`): a list of strings, each one argv
    element.  A NUL cannot be in an argv element at all, so it is refused rather than cut."""
    if raw is None:
        return []
    if not isinstance(raw, list) or not all(isinstance(a, str) for a in raw):
        raise HelperError(BAD_REQUEST, "the engine's arguments must be a list of strings")
    for a in raw:
        if "\x00" in a:
            raise HelperError(BAD_REQUEST, "an engine argument holds a NUL byte, which no argv element can: %r" % a)
    return list(raw)


def pane_command(command: str, extra: List[str]) -> List[str]:
    """What tmux runs in the new pane.  With no arguments of the spawn's own: the template's command line, run by
    tmux through the user's shell, as always.  With some: `sh -c 'COMMAND "$@"' drover-spawn ARG...`, which tmux
    executes as argv (no shell parses the arguments: each arrives as exactly one argv element, whatever it holds --
    spaces, quotes, `;`, `$(...)`, newlines), and which appends them to the template's command line."""
    if not extra:
        return [command]
    return ["sh", "-c", command + ' "$@"', "drover-spawn"] + extra


def tmux_arg(arg: str) -> str:
    """An argument as tmux takes it in a command list: tmux reads an argument that ends in ';' as the end of a
    command (the ';' dropped), unless the ';' follows a backslash, which it then drops instead."""
    return arg[:-1] + "\\;" if arg.endswith(";") else arg


def socket_path(server: str) -> str:
    """The socket of the tmux server `tmux -L SERVER` would use (where drover's discovery looks for servers)."""
    base = os.path.join(os.environ.get("TMUX_TMPDIR") or "/tmp", "tmux-%d" % os.getuid())
    return os.path.join(base, server)


def _taken(name: str, socket: str, profiles: Profiles) -> Optional[str]:
    """Why `name` cannot be used (a tmux session of that name, or a session drover lists under it), or None."""
    if tmux.alive(socket):
        try:
            tmux.tmux(socket, ["has-session", "-t", "=" + name], timeout=5)
            return "a tmux session named %r already exists" % name
        except HelperError:
            pass
    for s in discovery.discover(profiles, []):
        if s["name"] == name or name in (s.get("former_names") or []):
            return "a %s session is already named %r (%s)" % (s["engine"], name, s["id"])
    return None


# -- pre-trust: the engine's own settings file --------------------------------------------------------------------


def settings_path(path: str) -> str:
    """Where the settings file `path` really is: a symlink (a dotfile manager's) is followed, so that it is written
    through and stays a link.  What is there must be a regular file of this user (or nothing, not even a dangling
    link); anything else is refused."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except FileNotFoundError:
        if os.path.islink(path):
            raise HelperError(
                TRUST_FILE_ERROR, "%s is a symlink to %s, which does not exist: not touched" % (path, real)
            ) from None
        return real
    except OSError as exc:
        raise HelperError(TRUST_FILE_ERROR, "cannot read %s: %s" % (real, exc)) from None
    shown = path if real == os.path.abspath(path) else "%s (a symlink to %s)" % (path, real)
    if not stat.S_ISREG(st.st_mode):
        raise HelperError(TRUST_FILE_ERROR, "%s is not a regular file: not touched" % shown)
    if st.st_uid != os.geteuid():
        raise HelperError(TRUST_FILE_ERROR, "%s belongs to another user (uid %d): not touched" % (shown, st.st_uid))
    return real


def _atomic_write(path: str, data: bytes) -> None:
    """Replace `path` with `data` in one rename, keeping its mode (0600 for a new file).  A symlink is written
    through: the file it points to is replaced, in its own directory, and the link stays."""
    path = settings_path(path)
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        mode = 0o600
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        os.makedirs(folder, 0o700)
    fd, tmp = tempfile.mkstemp(prefix=".drover-", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _read(path: str) -> Optional[str]:
    path = settings_path(path)  # never open a FIFO or a device, nor another user's file
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise HelperError(TRUST_FILE_ERROR, "cannot read %s: %s" % (path, exc)) from None


def claude_trust_file() -> str:
    # Claude keeps its global config beside its config dir when CLAUDE_CONFIG_DIR is set, else in ~/.claude.json.
    base = os.environ.get("CLAUDE_CONFIG_DIR")
    return os.path.join(base, ".claude.json") if base else os.path.join(os.path.expanduser("~"), ".claude.json")


def trust_claude(cwd: str, path: str) -> bool:
    """projects[cwd].hasTrustDialogAccepted = true, every other key kept.  True when the file was changed."""
    text = _read(path)
    try:
        data = json.loads(text) if text and text.strip() else {}
    except ValueError as exc:
        raise HelperError(TRUST_FILE_ERROR, "%s is not valid JSON (%s): drover will not overwrite it" % (path, exc)) from None
    if not isinstance(data, dict) or not isinstance(data.get("projects", {}), dict):
        raise HelperError(TRUST_FILE_ERROR, "%s is not the Claude config drover expects: not touched" % path)
    project = data.setdefault("projects", {}).setdefault(cwd, {})
    if not isinstance(project, dict):
        raise HelperError(TRUST_FILE_ERROR, "%s: projects[%r] is not an object: not touched" % (path, cwd))
    if project.get("hasTrustDialogAccepted") is True:
        return False
    project["hasTrustDialogAccepted"] = True
    _atomic_write(path, (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
    return True


def codex_trust_file() -> str:
    home = os.environ.get("CODEX_HOME") or os.path.join(os.path.expanduser("~"), ".codex")
    return os.path.join(home, "config.toml")


def _toml_key(text: str) -> str:
    """`text` as a TOML basic string: backslash and quote escaped, and every control character as \\uXXXX (TOML
    allows none raw but tab; a raw newline would end the header's line and break the whole file)."""
    out = []
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("\\u%04X" % ord(ch))
        else:
            out.append(ch)
    return '"%s"' % "".join(out)


def trust_codex(cwd: str, path: str) -> bool:
    """[projects."<cwd>"] trust_level = "trusted", by editing lines (there is no TOML writer in the standard
    library): the table's trust_level is set or added, or the table appended; every other line is kept."""
    text = _read(path) or ""
    # Split at newlines only: splitlines() would also split at characters TOML strings may hold raw (U+2028, C1).
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    header = "[projects.%s]" % _toml_key(cwd)
    literal = "'" not in cwd and not CONTROL_CHARS.search(cwd)
    headers = (header, "[projects.'%s']" % cwd) if literal else (header,)
    start = next((i for i, line in enumerate(lines) if line.strip() in headers), None)
    if start is None:
        block = ["", header, 'trust_level = "trusted"']
        lines = lines + block if lines else block[1:]
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
        setting = next((i for i in range(start + 1, end) if re.match(r"^\s*trust_level\s*=", lines[i])), None)
        if setting is not None:
            if re.match(r'^\s*trust_level\s*=\s*"trusted"\s*(#.*)?$', lines[setting]):
                return False
            lines[setting] = 'trust_level = "trusted"'
        else:
            lines.insert(start + 1, 'trust_level = "trusted"')
    _atomic_write(path, ("\n".join(lines) + "\n").encode("utf-8"))
    return True


TRUSTERS = {"claude": (trust_claude, claude_trust_file), "codex": (trust_codex, codex_trust_file)}


def _covered(cwd: str, folders: List[str]) -> bool:
    for folder in folders:
        expanded = os.path.expanduser(folder)
        if not os.path.isabs(expanded):
            continue  # relative to wherever the helper runs: never a folder the fleet meant (the fleet refuses it)
        real = os.path.realpath(expanded)
        if cwd == real or cwd.startswith(real.rstrip("/") + "/"):
            return True
    return False


def pretrust(engine: str, cwd: str, folders: List[str], trust_file: Optional[str]) -> Dict[str, Any]:
    """Write the folder's trust into the engine's settings, when the fleet lists it; say what was done."""
    if not _covered(cwd, folders):
        return {"pretrusted": False}
    if engine not in TRUSTERS:
        return {"pretrusted": False, "pretrust_note": "drover knows no trust setting for engine %r" % engine}
    writer, default = TRUSTERS[engine]
    path = os.path.expanduser(trust_file) if trust_file else default()
    try:
        changed = writer(cwd, path)
    except OSError as exc:
        raise HelperError(TRUST_FILE_ERROR, "cannot write %s: %s" % (path, exc)) from None
    return {"pretrusted": True, "trust_file": path, "trust_written": changed}


# -- the context snapshot -----------------------------------------------------------------------------------------


def _git(cwd: str, *args: str) -> Optional[str]:
    try:
        proc = subprocess.run(
            ["git", "-C", cwd] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=GIT_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None  # no git, or a repository too slow to ask: no snapshot, not an error
    out = proc.stdout.decode("utf-8", "replace").strip()
    return out if proc.returncode == 0 and out else None


def git_snapshot(cwd: str) -> Optional[Dict[str, Any]]:
    """Branch and short commit of the repository `cwd` is in (None: not a repository, or no git)."""
    if _git(cwd, "rev-parse", "--is-inside-work-tree") != "true":
        return None
    branch = _git(cwd, "symbolic-ref", "--short", "-q", "HEAD")
    return {
        "branch": branch,  # None: a detached HEAD
        "commit": _git(cwd, "rev-parse", "--short", "HEAD"),  # None: no commit yet
        "dirty": bool(_git(cwd, "status", "--porcelain", "--untracked-files=no")),
    }


# -- starting it and waiting ----------------------------------------------------------------------------------------


def _tail(screen: str, n: int = 12) -> List[str]:
    return [line for line in lines_of(screen) if line.strip()][-n:]


def _kill(socket: str, name: str) -> None:
    try:
        tmux.tmux(socket, ["kill-session", "-t", "=" + name], timeout=5)
    except HelperError:
        pass


def _claude_session(pane_id: str, server: str, profiles: Profiles) -> Optional[Dict[str, Any]]:
    for s in discovery.discover(profiles, []):
        if "_record" in s and s.get("pane") == pane_id and s.get("server") == server:
            return s
    return None


def wait_ready(
    socket: str,
    name: str,
    pane_id: str,
    engine: str,
    profile: Dict[str, Any],
    profiles: Profiles,
    timeout: float,
    ready_pattern: Optional[str] = None,
) -> Dict[str, Any]:
    """Watch the new pane until the engine is ready (idle; for Claude, its registry record idle too) or shows a
    dialog.  `ready_pattern`: what the screen must also show (Codex draws an idle composer a few seconds before its
    app-server is up; its footer's `← for agents` says it is).  The pane dying is ENGINE_EXITED (with what it
    printed); running out of time is SPAWN_TIMEOUT."""
    server = os.path.basename(socket)
    deadline = time.monotonic() + timeout
    dialogs = 0
    idle_since = None  # type: Optional[float]
    settled_since = None  # type: Optional[float]
    screen, seen = "", {"state": "unknown", "reason": "nothing on screen yet"}  # type: str, Dict[str, Any]
    while True:
        try:
            flags = tmux.pane_flags(socket, pane_id)
        except HelperError:
            raise HelperError(
                ENGINE_EXITED, "the %s session %r ended at once: its pane is gone" % (engine, name), tail=_tail(screen)
            ) from None
        if flags["pane_dead"] == "1":
            # With history: tmux scrolls a dead pane's screen to write its "Pane is dead" line.
            screen = tmux.tmux(socket, ["capture-pane", "-p", "-S", "-200", "-t", pane_id])
            _kill(socket, name)
            said = [line for line in _tail(screen, 40) if not line.startswith("Pane is dead")]
            status = re.search(r"Pane is dead \(status (\d+)", screen)
            raise HelperError(
                ENGINE_EXITED,
                "the %s command exited at once%s; its last words: %s"
                % (engine, " (status %s)" % status.group(1) if status else "", " | ".join(said[-3:]) or "(nothing)"),
                tail=said[-12:],
            )
        screen = tmux.capture(socket, pane_id)
        seen = classify(screen, profile)
        if engine == "claude":
            found = _claude_session(pane_id, server, profiles)
            if found is not None and found.get("state") == "idle" and seen["state"] != "dialog":
                settled_since = settled_since or time.monotonic()
                if time.monotonic() - settled_since >= CLAUDE_SETTLE_S:
                    reason = "Claude reports idle, with no dialog on its screen for %gs" % CLAUDE_SETTLE_S
                    return {"state": "ready", "reason": reason, "session": found, "tail": _tail(screen)}
            else:
                settled_since = None
        dialogs = dialogs + 1 if seen["state"] == "dialog" else 0
        if dialogs >= DIALOG_LOOKS:
            return {"state": "waiting", "reason": seen["reason"], "session": None, "tail": _tail(screen)}
        shows_ready = not ready_pattern or any(re.search(ready_pattern, line) for line in lines_of(screen))
        if seen["state"] == "idle" and not seen.get("draft") and shows_ready:
            idle_since = idle_since or time.monotonic()
            if engine != "claude" or time.monotonic() - idle_since > CLAUDE_RECORD_GRACE_S:
                return {"state": "ready", "reason": seen["reason"], "session": None, "tail": _tail(screen)}
        else:
            idle_since = None
        if time.monotonic() > deadline:
            raise HelperError(
                SPAWN_TIMEOUT,
                "the %s session %r was not ready after %gs; its screen shows: %s (%s)"
                % (engine, name, timeout, seen["state"], seen["reason"]),
                tail=_tail(screen),
                pane=pane_id,
                server=server,
            )
        time.sleep(POLL_S)


def _alone(cwd: str, profiles: Profiles) -> None:
    """For a nudge's --create-if-missing: no live agent session may work in this directory already (the client's
    look compares the path as given; here `~` is expanded and symlinks resolved on both sides)."""
    sharing = []
    for s in discovery.discover(profiles, []):
        live = "_record" in s or (s.get("engine") not in (None, "shell") and not s.get("dead"))
        if live and isinstance(s.get("cwd"), str) and os.path.realpath(s["cwd"]) == cwd:
            sharing.append({k: s.get(k) for k in ("id", "server", "name", "engine")})
    if sharing:
        names = ", ".join("%s (%s %s)" % (s["name"], s["engine"], s["id"]) for s in sharing[:5])
        raise HelperError(SHARED_CWD, "%s is where %s already works" % (cwd, names), sharing=sharing)


def spawn(args: Dict[str, Any], profiles: Profiles) -> Dict[str, Any]:
    engine = args.get("engine") or ""
    if engine not in profiles:
        raise HelperError(
            UNKNOWN_ENGINE, "no profile for engine %r on this host (known: %s)" % (engine, ", ".join(sorted(profiles)))
        )
    cwd = _cwd(args.get("cwd") or "")
    name = args.get("name") or "%s-%s-%s" % (
        re.sub(r"[^A-Za-z0-9_-]", "-", os.path.basename(cwd) or "root")[:40],
        engine,
        os.urandom(2).hex(),
    )
    if not NAME.match(name):
        raise HelperError(
            BAD_REQUEST, "the name %r must be letters, digits, '_' or '-' (at most 64, starting with a letter or digit)" % name
        )
    command = fill(args.get("command") or "", cwd, name)
    if not command.strip():
        raise HelperError(BAD_REQUEST, "the command template for %s is empty" % engine)
    extra = engine_args(args.get("args"))
    socket = socket_path(args.get("server") or "default")
    why = _taken(name, socket, profiles)
    if why:
        raise HelperError(NAME_TAKEN, "%s: choose another --name" % why)
    if args.get("alone"):
        _alone(cwd, profiles)
    out = {"name": name, "engine": engine, "cwd": cwd, "command": command, "server": os.path.basename(socket)}
    if extra:
        out["args"] = extra
    out.update(pretrust(engine, cwd, list(args.get("trusted") or []), args.get("trust_file")))
    out["git"] = git_snapshot(cwd)
    folder = os.path.dirname(socket)
    if not os.path.isdir(folder):
        os.makedirs(folder, 0o700)
    # One tmux invocation: the session, and remain-on-exit on its window before the server can notice the program
    # exit, so a command that dies at once leaves its last words on screen for the answer.
    created = tmux.tmux(
        socket,
        # Each argument escaped: tmux would end the command at one that ends in ';' (a directory `/w/semi;`).
        [tmux_arg(a) for a in ["new-session", "-d", "-P", "-F", "#{pane_id}", "-s", name, "-x", "160", "-y", "45"]]
        + [tmux_arg(a) for a in ["-c", cwd] + pane_command(command, extra)]
        + [";", "set-option", "-w", "remain-on-exit", "on"],
    )
    pane_id = created.strip().splitlines()[0] if created.strip() else ""
    if not pane_id.startswith("%"):
        _kill(socket, name)
        raise HelperError(BAD_REQUEST, "tmux did not name the new pane (it printed %r)" % created[:200])
    out["pane"] = pane_id
    ready = wait_ready(
        socket, name, pane_id, engine, profiles[engine], profiles, float(args.get("timeout_s") or 60.0), args.get("ready")
    )
    # Once it runs, a program that exits is an exit like any other: tmux closes its pane as usual.
    try:
        tmux.tmux(socket, ["set-option", "-w", "-t", pane_id, "remain-on-exit", "off"], timeout=5)
    except HelperError:
        pass
    session = ready.pop("session")
    if session is None:
        session = next((s for s in discovery.discover(profiles, []) if s["id"] == pane_id and s["server"] == out["server"]), None)
    out.update(ready)
    if session is not None:
        out["id"] = discovery.pin(session)
        out["identity"] = discovery.identity(session)
        out["pid"] = session.get("pid")
        out["target"] = session.get("target")  # NAME:W.P, recorded so `spawns --target` takes what `log` does
    else:
        out["id"] = "%s/%s" % (out["server"], pane_id)
        out["identity"] = None
    return out
