"""The queue lane: `codex queue --thread ID --message TEXT`, Codex's own way in (0.169).

Measured on the real Codex 0.169: Enter while a turn runs makes Codex drop its in-flight model request and answer
the running prompt and the new text together; `codex queue` runs the message as its own turn -- at once when the
thread is idle, after the running turn when it is active -- and leaves an open approval dialog alone.  Its exit 0
only means "enqueued": a thread the daemon has not loaded (its app-server restarted, or none runs), or a
`codex exec` thread, takes the message into its queue and never runs it.  So those are refused here, and what did
run is verified in the thread's rollout by the caller.

`codex queue` reaches the daemon through the thread's own CODEX_HOME, so it runs with the TUI's HOME, CODEX_HOME
and PATH.  It gets no `--config` override (one makes it start an app-server of its own).  Its text is one argument:
Linux takes at most 128 KiB per argument, so a longer text is refused before anything runs.  It is bounded by a
timeout and killed with its process group when that runs out.
"""

import os
import re
import signal
import subprocess
from typing import Any, Dict, Optional

from . import codex
from . import protocol as P
from .discovery import Session, public

Outcome = Dict[str, Any]
# MAX_ARG_STRLEN (32 pages): the longest single argument execve takes, its terminating NUL included.
ARG_MAX_BYTES = 131072
FLAG = "--message="
QUEUED_LINE = re.compile(r"Queued message (\S+) for thread (\S+?)\.?\s*$", re.M)


def _outcome(outcome: str, code: Optional[str], detail: str, session: Session, **extra: Any) -> Outcome:
    out = {"outcome": outcome, "lane": "queue", "detail": detail, "session": public(session), "thread": session.get("thread")}
    if code:
        out["code"] = code
    out.update(extra)
    return out


def refusal(code: str, detail: str, session: Session) -> Outcome:
    return _outcome(P.REFUSED, code, detail, session)


def fits(payload: str) -> bool:
    return len((FLAG + payload).encode("utf-8")) < ARG_MAX_BYTES


def find_codex(env: Dict[str, str]) -> Optional[str]:
    """`codex` on the TUI's own PATH (where a person's npm-installed codex lives), else on the helper's."""
    import shutil

    for path in (env.get("PATH"), os.environ.get("PATH")):
        if path:
            found = shutil.which("codex", path=path)
            if found:
                return found
    return None


def check(session: Session, thread: Dict[str, Any]) -> Optional[Outcome]:
    """Would `codex queue` ever run a message on this thread?  A refusal, or None."""
    tid = session.get("thread")
    if thread.get("source") == "exec":
        detail = "thread %s is a `codex exec` run: its queue is never read, so a queued message would never run" % tid
        return refusal(P.EXEC_THREAD, detail, session)
    status = codex.status_of(thread)
    if status == "notLoaded":
        why = thread.get("error") or "its app-server has not loaded it"
        detail = (
            "thread %s is not loaded (%s): `codex queue` would accept the message and never run it; resume the "
            "thread in Codex (codex resume %s) and send again" % (tid, why, tid)
        )
        return refusal(P.THREAD_NOT_LOADED, detail, session)
    if status == "systemError":
        detail = "thread %s is in Codex's systemError state: it runs no turns until it is restarted" % tid
        return refusal(P.THREAD_ERROR, detail, session)
    if status not in ("idle", "active"):
        return refusal(P.THREAD_ERROR, "thread %s has a status drover does not know: %r" % (tid, status), session)
    return None


def deliver(session: Session, payload: str, args: Dict[str, Any]) -> Outcome:
    """Queue the payload (neutralised and enveloped) on the session's Codex thread."""
    tid = str(session.get("thread") or "")
    home = session.get("_codex_home") or codex.default_home()
    if not fits(payload):
        detail = (
            "the message is %d bytes enveloped; `codex queue` takes its text as one argument, at most %d bytes: "
            "send it shorter (put the long part in a file and send its path)"
            % (len(payload.encode("utf-8")), ARG_MAX_BYTES - len(FLAG) - 1)
        )
        return refusal(P.TOO_LARGE, detail, session)
    # The status right now, not the listing's: a turn may have started or ended since.
    thread = codex.read_thread(home, tid) or {"id": tid, "status": {"type": "notLoaded"}, "error": "no app-server answers"}
    thread.setdefault("source", (session.get("_thread") or {}).get("source"))
    refused = check(session, thread)
    if refused is not None:
        return refused
    env = session.get("_codex_env") or {}
    binary = find_codex(env)
    if binary is None:
        detail = "no `codex` on the TUI's PATH or the helper's on this host: nothing was queued"
        return _outcome(P.FAILED, P.QUEUE_UNAVAILABLE, detail, session)
    # An idle thread whose queue already holds messages (a turn declined with Esc leaves them there) does not run
    # a new one at once: it waits behind them for the thread's next turn to end.
    pending = codex.queued(home, tid) or []
    run_env = dict(os.environ)
    for key in ("HOME", "PATH"):
        if env.get(key):
            run_env[key] = env[key]
    run_env["CODEX_HOME"] = home
    timeout = float(args.get("queue_timeout_s", 15.0))
    argv = [binary, "queue", "--thread", tid, FLAG + payload]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=run_env,
            cwd=home if os.path.isdir(home) else "/",
            start_new_session=True,
        )
    except OSError as exc:
        return _outcome(P.FAILED, P.QUEUE_UNAVAILABLE, "could not run %s: %s" % (binary, exc), session)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        detail = (
            "`codex queue` did not finish within %.0fs and was killed: the message may or may not be queued "
            "(`drover retry ID` looks for it in the rollout before sending again)" % timeout
        )
        return _outcome(P.FAILED, P.QUEUE_TIMEOUT, detail, session, indeterminate=True)
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    said = [line for line in stderr.splitlines() if line.strip() and not line.startswith("WARNING:")]
    if proc.returncode != 0:
        if re.search(r"unrecognized subcommand|unexpected argument", stderr):
            detail = "%s has no `codex queue` (an older Codex?): nothing was queued" % binary
            return _outcome(P.FAILED, P.QUEUE_UNAVAILABLE, detail, session)
        detail = "`codex queue` exited %d: %s" % (proc.returncode, (said[-1] if said else stderr.strip())[-300:])
        return _outcome(P.FAILED, P.QUEUE_FAILED, detail, session)
    queued = QUEUED_LINE.search(stdout)
    status = codex.status_of(thread)
    flags = codex.flags_of(thread)
    extra = {"state": "idle" if status == "idle" else "busy", "queue_id": queued.group(1) if queued else None}
    if status == "idle" and pending:
        detail = (
            "queued with `codex queue` behind %d message(s) already waiting in Codex's queue for the idle thread %s "
            "(a turn declined with Esc leaves them there): they run when the thread's next turn ends" % (len(pending), tid)
        )
        return _outcome(P.QUEUED, None, detail, session, **extra)
    if status == "idle":
        detail = "queued with `codex queue` on the idle thread %s: it runs at once" % tid
        return _outcome(P.DELIVERED, None, detail, session, **extra)
    waiting = [f for f in flags if f.startswith("waitingOn")]
    if waiting:
        detail = (
            "the thread waits on its human (%s): queued with `codex queue`, it runs as its own turn once the turn "
            "ends (declined with Esc, it waits for the next turn to end); the dialog was left alone" % ", ".join(waiting)
        )
    else:
        detail = "a turn is running: queued with `codex queue`, it runs as its own turn after this one"
    return _outcome(P.QUEUED, None, detail, session, **extra)
