"""Starting a headless Claude Code session on this host (`drover spawn HOST --engine claude --headless`), or a new
holder for one whose holder is gone (`--resume NAME`: `claude --resume=ID` on the same session id).

The holder (headless_holder.py) is written into the session's own 0700 directory and started detached (a double
fork under a new session: it belongs to no SSH connection and to no helper, and is nobody's zombie), stdio on
/dev/null.  The spawn waits until it answers on its socket with claude running.

Stdlib only and Python 3.6+: shipped to every host inside the helper bundle.
"""

import errno
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid as uuidlib
from typing import Any, Dict

from . import headless
from . import spawn as tmux_spawn
from .protocol import BAD_REQUEST, ENGINE_EXITED, NAME_TAKEN, SESSION_NOT_FOUND, SOCKET_FOREIGN, SPAWN_TIMEOUT, HelperError

# claude as the official SDK runs it: `--flag=value` where a value follows, so no value can pass for a flag.
STREAM_FLAGS = ["--input-format", "stream-json", "--output-format", "stream-json", "--verbose", "--replay-user-messages"]
# A claude that dies at once (no binary, a bad flag) has done so by then; a slower death is seen by ls and send.
SETTLE_S = 1.5
DETACH = (
    "import subprocess,sys;d=subprocess.DEVNULL;"
    "subprocess.Popen(sys.argv[1:],stdin=d,stdout=d,stderr=d,start_new_session=True,close_fds=True)"
)


def holder_source() -> str:
    """This bundle's own copy of headless_holder.py: read from the file, or from the bundle's in-memory modules."""
    from . import headless_holder

    path = getattr(headless_holder, "__file__", None)
    if path and os.path.isfile(path):
        with open(path) as f:
            return f.read()
    loader = getattr(headless_holder, "__loader__", None)
    run = getattr(type(loader), "exec_module", None)
    modules = getattr(run, "__globals__", {}).get("MODULES") or {}
    source = modules.get("headless_holder")
    if not isinstance(source, str):
        raise HelperError(BAD_REQUEST, "this helper carries no headless holder to start")
    return source


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def _own_dir(path: str, strict: bool = True) -> None:
    """`path` as a directory of ours that only we can enter: made so, or refused as it is.  Not `strict` (the drover
    home above): ours, no link, and nobody else may write in it."""
    if not os.path.lexists(path):
        os.makedirs(path, 0o700)
    why = headless.unsafe(path, "directory", 0o077 if strict else 0o022)
    if why:
        raise HelperError(SOCKET_FOREIGN, "refused: %s; drover keeps headless sessions only in a 0700 directory of its own" % why)


def _retire(folder: str, name: str) -> None:
    """Before a resume: the old holder must be gone, or hold a claude that has exited (then it is told to quit)."""
    holder = headless._json(os.path.join(folder, "holder.json")) or {}
    if not headless._alive(holder.get("pid")):
        child = holder.get("child_pid")
        if child and not headless._json(os.path.join(folder, "exit.json")) and headless._alive(child):
            why = "headless session %s: its holder is gone but its engine (pid %s) still runs its last turn; resume once it ends"
            raise HelperError(NAME_TAKEN, why % (name, child))
        return
    state = headless.ask(folder, {"op": "state"}, 3.0)
    if state.get("alive"):
        raise HelperError(NAME_TAKEN, "headless session %s still runs (holder pid %s): nothing to resume" % (name, holder["pid"]))
    headless.ask(folder, {"op": "quit"}, 3.0)
    deadline = time.monotonic() + 30
    while headless._alive(holder.get("pid")) and time.monotonic() < deadline:
        time.sleep(0.1)


def spawn(args: Dict[str, Any], profiles: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
    engine = args.get("engine") or "claude"
    if engine not in ("claude", "codex"):
        raise HelperError(BAD_REQUEST, "--headless starts Claude Code or Codex (engine claude or codex), not %r" % engine)
    resume = args.get("resume")
    name = resume or args.get("name") or ""
    if not tmux_spawn.NAME.match(name):
        raise HelperError(BAD_REQUEST, "the name %r must be letters, digits, '_' or '-' (at most 64)" % name)
    base = headless.root()
    _own_dir(os.path.dirname(base), strict=False)
    _own_dir(base)
    folder = os.path.join(base, name)
    if len(os.path.join(folder, "sock")) > 100:
        raise HelperError(BAD_REQUEST, "%s/sock is too long for a Unix socket: set DROVER_HOME shorter on this host" % folder)
    if resume:
        old = headless._json(os.path.join(folder, "spec.json")) if os.path.isdir(folder) else None
        if old is None:
            raise HelperError(SESSION_NOT_FOUND, "no headless session %r on this host to resume (drover ls lists them)" % name)
        _own_dir(folder)
        lock = _lock(folder, name)  # held (open) until this spawn returns: one resume at a time
        _retire(folder, name)
        engine = str(old.get("engine") or "claude")
        sid = str(old.get("session_id") or (headless._json(os.path.join(folder, "thread.json")) or {}).get("session_id"))
        cwd = str(old["cwd"])
        template = str(old.get("template") or args.get("command") or engine)
        extra = list(old.get("args") or [])
        for stale in ("exit.json", "holder.json", "sock"):
            try:
                os.unlink(os.path.join(folder, stale))
            except OSError:
                pass
    else:
        why = "a headless session %r exists on this host: choose another --name (or --resume it)" % name
        if os.path.lexists(folder):
            raise HelperError(NAME_TAKEN, why)
        taken = tmux_spawn._taken(name, tmux_spawn.socket_path(args.get("server") or "default"), profiles)
        if taken:  # a tmux session (or any session drover lists) of that name: `send HOST:NAME` would be ambiguous
            raise HelperError(NAME_TAKEN, "%s: choose another --name" % taken)
        try:
            os.mkdir(folder, 0o700)  # atomic: of two spawns of one name, the second finds it made
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise HelperError(NAME_TAKEN, why) from None
            raise
        lock = _lock(folder, name)
        cwd = tmux_spawn._cwd(args.get("cwd") or "")
        sid, template, extra = (
            str(uuidlib.uuid4()),
            str(args.get("command") or engine),
            tmux_spawn.engine_args(args.get("args")),
        )
        _own_dir(folder)
    command = tmux_spawn.fill(template, cwd, name)
    spec: Dict[str, Any] = {"name": name, "engine": engine, "cwd": cwd, "template": template, "args": extra}
    if engine == "codex":  # its thread's id comes from its app-server (thread.json); a resume names it
        flags = ["app-server"]
        spec.update(protocol="codex", session_id=None, resume_thread=sid if resume else None)
    else:
        flags = STREAM_FLAGS + ["--resume=" + sid if resume else "--session-id=" + sid]
        spec["session_id"] = sid
    spec["argv"] = ["sh", "-c", command + ' "$@"', "drover-headless"] + flags + extra
    out = {"name": name, "engine": engine, "cwd": cwd, "command": command, "server": None, "headless": True}
    if not resume:
        out.update(tmux_spawn.pretrust(engine, cwd, list(args.get("trusted") or []), args.get("trust_file")))
    out["git"] = tmux_spawn.git_snapshot(cwd)
    _write(os.path.join(folder, "spec.json"), json.dumps(spec))
    holder_py = os.path.join(folder, "holder.py")
    _write(holder_py, holder_source())
    subprocess.run([sys.executable, "-c", DETACH, sys.executable, "-E", "-s", holder_py, folder], timeout=30, check=False)
    try:
        _ready(folder, float(args.get("timeout_s") or 60.0), engine)
    except HelperError:
        if not resume:  # a session that never ran leaves nothing behind, so the same --name can be tried again
            _abandon(folder)
        raise
    holder = headless._json(os.path.join(folder, "holder.json")) or {}
    if engine == "codex":
        sid = str((headless._json(os.path.join(folder, "thread.json")) or {}).get("session_id"))
    out.update(id=sid, identity="%s:%s" % (engine, sid), pid=holder.get("pid"), pane=None, target=None, tail=[])
    out.update(state="ready", reason="held by pid %s on %s/sock" % (holder.get("pid"), folder))
    lock.close()
    return out


def _lock(folder: str, name: str) -> Any:
    """An exclusive flock on FOLDER/lock (the folder is 0700, ours): a second start or resume of NAME is refused
    while one is under way.  The holder does not inherit it (close_fds), so it is freed when this spawn ends."""
    fd = os.open(os.path.join(folder, "lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    f = os.fdopen(fd, "w")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise HelperError(NAME_TAKEN, "another spawn or --resume of headless session %s is under way: refused" % name) from None
    return f


def _abandon(folder: str) -> None:
    holder = headless._json(os.path.join(folder, "holder.json")) or {}
    if headless._alive(holder.get("pid")):
        os.kill(int(holder["pid"]), signal.SIGKILL)  # its claude reads EOF and ends
    shutil.rmtree(folder, ignore_errors=True)


def _ready(folder: str, timeout: float, engine: str) -> None:
    deadline = time.monotonic() + timeout
    settled = None
    while time.monotonic() < deadline:
        exited = headless._json(os.path.join(folder, "exit.json"))
        if exited:
            words = (headless._exit_words(exited), _stderr(folder))
            raise HelperError(ENGINE_EXITED, "%s exited at once (%s); its last words: %s" % ((engine,) + words))
        if os.path.exists(os.path.join(folder, "sock")) and os.path.exists(os.path.join(folder, "holder.json")):
            settled = settled or time.monotonic() + SETTLE_S
            state = headless.ask(folder, {"op": "state"}) if time.monotonic() >= settled else {}
            if state.get("alive") and state.get("session_id"):  # (Codex: once its app-server started the thread)
                return
        time.sleep(0.1)
    said = (folder, timeout, _stderr(folder))
    raise HelperError(SPAWN_TIMEOUT, "the headless holder in %s did not answer within %gs; its stderr: %s" % said)


def _stderr(folder: str) -> str:
    return headless.stderr_tail(folder)
