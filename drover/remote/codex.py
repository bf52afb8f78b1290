"""Codex threads: which thread each Codex pane runs, its status in the app-server, and a thread with no pane.

Codex 0.169 keeps a session's state in a daemon per CODEX_HOME (codex_appserver.py), not in the TUI: the TUI
process holds nothing that names its thread.  So a pane is matched to a thread by what both record -- the TUI's
CODEX_HOME (its own environment) and working directory, and time: a TUI's thread is created after the TUI started,
so among the loaded threads of its home and cwd, a pane gets the newest one created since it started and before
the next TUI in that directory did (`/new` makes a newer one; a thread whose TUI quit stays loaded but is older).
`codex resume ID` names its thread on its command line.  What cannot be told apart is left unmatched -- the pane
then keeps the guarded paste -- never guessed.
"""

import glob
import json
import os
import re
from typing import Any, Dict, List, Optional, Set, Tuple

from . import procs
from .codex_appserver import AppServerError, call

Session = Dict[str, Any]
Thread = Dict[str, Any]

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# A thread's creation is stamped in whole seconds; a TUI's start in clock ticks.  Allow for the rounding.
SLACK_S = 2.0


process_env = procs.process_env


def home_of(env: Dict[str, str]) -> str:
    """CODEX_HOME as that process sees it: its own CODEX_HOME, else its HOME's .codex."""
    if env.get("CODEX_HOME"):
        return env["CODEX_HOME"]
    return os.path.join(env.get("HOME") or os.path.expanduser("~"), ".codex")


def default_home() -> str:
    return home_of(dict(os.environ))


def started_at(pid: int) -> Optional[float]:
    """When a process started, as a Unix time (boot time + its start in clock ticks)."""
    ticks = procs.proc_start(pid)
    try:
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
        return boot + int(ticks or "") / float(os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, StopIteration):
        return None


def status_of(thread: Thread) -> str:
    status = thread.get("status")
    return str(status.get("type")) if isinstance(status, dict) else "notLoaded"


def flags_of(thread: Thread) -> List[str]:
    status = thread.get("status")
    flags = status.get("activeFlags") if isinstance(status, dict) else None
    return [str(f) for f in flags] if isinstance(flags, list) else []


def read_thread(home: str, thread_id: str, timeout: float = 3.0) -> Optional[Thread]:
    """The thread as the daemon knows it now; {"status": notLoaded} when it is not loaded; None: no daemon answers."""
    try:
        answer = call(home, [("thread/read", {"threadId": thread_id})], timeout)[0]
    except AppServerError:
        return None
    thread = (answer.get("result") or {}).get("thread")
    if isinstance(thread, dict):
        return thread
    return {"id": thread_id, "status": {"type": "notLoaded"}, "error": (answer.get("error") or {}).get("message")}


# Loaded threads already read once and found to be no pane's (ephemeral title threads, sub-agents, exec runs),
# per CODEX_HOME.  Codex 0.169 starts an ephemeral thread for a title after each prompt and keeps it loaded, and
# the daemon answers each thread/read in ~10-30 ms: reading them all again on every look made a send's two
# discoveries grow with every turn the daemon has served (7 loaded threads: ~85 ms each).  What makes a thread no
# pane's never changes for its id, so a live helper (the daemon's, or a cold send's second look) skips them.
_NOT_USERS: Dict[str, Set[str]] = {}
_NOT_USERS_MAX = 10000  # bounded: a helper that lives for weeks forgets and reads them again


def loaded_threads(home: str, warnings: List[str]) -> Optional[List[Thread]]:
    """Every thread the daemon of this CODEX_HOME has loaded that may be a pane's (is_users), each read now;
    None when no daemon answers (an older Codex)."""
    skip = _NOT_USERS.setdefault(home, set())

    def reads(listed: List[Dict[str, Any]]) -> List[Tuple[str, Dict[str, Any]]]:
        ids = listed[0].get("result", {}).get("data") or []
        return [("thread/read", {"threadId": str(t)}) for t in ids if str(t) not in skip]

    try:  # one connection: the list, then a read of each thread not already known to be no pane's
        answers = call(home, [("thread/loaded/list", {})], then=reads)[1:]
    except AppServerError:
        return None
    except (AttributeError, TypeError):
        warnings.append("the Codex app-server of %s answered in a shape drover does not know" % home)
        return None
    threads = [a["result"]["thread"] for a in answers if isinstance((a.get("result") or {}).get("thread"), dict)]
    if len(skip) > _NOT_USERS_MAX:
        skip.clear()
    skip.update(str(t.get("id")) for t in threads if t.get("id") and not is_users(t))
    return [t for t in threads if is_users(t)]


def is_users(thread: Thread) -> bool:
    """A conversation a person has with a TUI: not an ephemeral helper thread (titles), not a sub-agent."""
    return not thread.get("ephemeral") and not thread.get("parentThreadId") and thread.get("source") != "exec"


def match(panes: List[Dict[str, Any]], threads: List[Thread]) -> Dict[str, Thread]:
    """Pane id -> its thread, for panes of one CODEX_HOME: [{"id", "cwd", "started", "argv"}].  Pure.

    Per directory, panes in the order they started; each gets the newest thread of that directory created in its
    window (from its start to the next pane's).  A window with threads that may be another pane's (a TUI that
    started within the slack of the next one) leaves both unmatched.
    """
    out: Dict[str, Thread] = {}
    users = [t for t in threads if is_users(t)]
    by_id = {str(t.get("id")): t for t in users}
    rest = []
    for pane in panes:
        named = [a for a in pane.get("argv") or [] if UUID.fullmatch(a) and a in by_id]
        if named:  # codex resume ID
            out[pane["id"]] = by_id[named[-1]]
        else:
            rest.append(pane)
    taken = {str(t.get("id")) for t in out.values()}
    for cwd in sorted({p["cwd"] for p in rest}):
        here = sorted((p for p in rest if p["cwd"] == cwd), key=lambda p: p.get("started") or 0.0)
        mine = [t for t in users if t.get("cwd") == cwd and str(t.get("id")) not in taken]
        for i, pane in enumerate(here):
            start = pane.get("started")
            if start is None:
                continue
            until = here[i + 1].get("started") if i + 1 < len(here) else None
            after = here[i - 1].get("started") if i > 0 else None
            if (until is not None and until - start < SLACK_S) or (after is not None and start - after < SLACK_S):
                continue  # two TUIs started together: their threads cannot be told apart
            window = [
                t
                for t in mine
                if float(t.get("createdAt") or 0) >= start - SLACK_S
                and (until is None or float(t.get("createdAt") or 0) < until - SLACK_S)
            ]
            if window:
                out[pane["id"]] = max(window, key=lambda t: (float(t.get("createdAt") or 0), str(t.get("id"))))
    return out


def attach(sessions: List[Session], warnings: List[str]) -> None:
    """Give every live Codex pane its thread, its status and the queue lane, where the app-server says which."""
    homes: Dict[str, List[Session]] = {}
    for s in sessions:
        if s.get("engine") != "codex" or s.get("dead") or "_record" in s:
            continue
        env = process_env(int(s.get("engine_pid") or 0))
        s["_codex_env"] = env
        s["_codex_home"] = home_of(env) if env else default_home()
        homes.setdefault(s["_codex_home"], []).append(s)
    for home, panes in homes.items():
        threads = loaded_threads(home, warnings)
        if threads is None:
            continue  # no daemon: an older Codex whose TUI owns its session; the pane keeps the guarded paste
        described = [
            {"id": s["id"], "cwd": s.get("cwd"), "started": started_at(int(s.get("engine_pid") or 0)), "argv": _argv(s)}
            for s in panes
        ]
        found = match(described, threads)
        for s in panes:
            thread = found.get(s["id"])
            if thread is not None:
                give_thread(s, thread, home)


def _argv(session: Session) -> List[str]:
    """The TUI's own command line and its children's (the npm launcher runs the native binary as its child)."""
    pid = int(session.get("engine_pid") or 0)
    return procs.argv_of(pid) or []


def give_thread(session: Session, thread: Thread, home: str) -> None:
    tid = str(thread.get("id"))
    session["_thread"] = thread
    session["_codex_home"] = home
    session.update(thread=tid, thread_status=status_of(thread), thread_flags=flags_of(thread))
    if "queue" not in session["lanes"]:
        session["lanes"] = ["queue"] + list(session["lanes"])
    session["aliases"] = list(session.get("aliases") or []) + [tid]


def homes(sessions: List[Session]) -> List[str]:
    """Every CODEX_HOME in sight: the live TUIs' own, and this user's default."""
    seen = [s["_codex_home"] for s in sessions if s.get("_codex_home")] + [default_home()]
    return sorted(set(seen), key=seen.index)


def rollouts(home: str, thread_id: str = "") -> List[str]:
    """A thread's rollout files (rollout-TIME-ID.jsonl under sessions/YYYY/MM/DD), or every rollout of the home."""
    name = "rollout-*-%s.jsonl" % glob.escape(thread_id) if thread_id else "rollout-*.jsonl"
    return sorted(glob.glob(os.path.join(glob.escape(home), "sessions", "*", "*", "*", name)))


def records(session: Session) -> List[str]:
    """Where this Codex session records what it receives: its thread's rollout, else its home's rollouts."""
    home = session.get("_codex_home") or default_home()
    thread = session.get("thread") or ""
    return rollouts(home, thread) if thread else rollouts(home)


def _first_line(path: str) -> Dict[str, Any]:
    """The rollout's session_meta payload (id, cwd, source: "exec" for `codex exec` threads)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            row = json.loads(f.readline() or "{}")
    except (OSError, ValueError):
        return {}
    payload = row.get("payload") if isinstance(row, dict) else None
    return payload if isinstance(payload, dict) else {}


def dormant(target: str, sessions: List[Session]) -> Optional[Session]:
    """A Codex thread named by its id (or a unique prefix of 8+ characters) that no live pane runs: found by its
    rollout in one of the CODEX_HOMEs in sight, with its status from that home's daemon.  A live pane's thread
    resolves to its pane."""
    if not re.match(r"^[0-9a-f-]{8,36}$", target or ""):
        return None
    live = [s for s in sessions if str(s.get("thread") or "").startswith(target)]
    if len(live) == 1:
        return live[0]
    hits: Dict[str, Tuple[str, str]] = {}  # thread id -> (its home, its rollout)
    for home in homes(sessions):
        for path in rollouts(home):
            found = UUID.findall(os.path.basename(path))
            if found and found[-1].startswith(target):
                hits.setdefault(found[-1], (home, path))
    if len(hits) != 1:
        return None
    tid, (home, path) = next(iter(hits.items()))
    meta = _first_line(path)
    thread = read_thread(home, tid)
    if thread is None:
        thread = {"id": tid, "status": {"type": "notLoaded"}, "error": "no app-server answers for %s" % home}
    thread.setdefault("source", meta.get("source"))
    if meta.get("source") == "exec":
        thread["source"] = "exec"
    session: Session = {
        "id": tid,
        "server": None,
        "target": None,
        "name": tid,
        "engine": "codex",
        "pid": None,
        "engine_pid": None,
        "command": "codex",
        "cwd": thread.get("cwd") or meta.get("cwd"),
        "title": thread.get("name") or "",
        "since": thread.get("updatedAt"),
        "dead": False,
        "lanes": [],
        "aliases": [tid],
        "_paneless": True,
    }
    give_thread(session, thread, home)
    return session


def state(session: Session) -> Session:
    """A pane-less thread's state, from its daemon alone."""
    status = session.get("thread_status")
    flags = session.get("thread_flags") or []
    if status == "active":
        waiting = [f for f in flags if f.startswith("waitingOn")]
        session.update(state="waiting" if waiting else "busy", reason="the Codex thread is active %s" % (flags or ""))
    elif status == "idle":
        session.update(state="idle", reason="the Codex thread is idle (loaded, no pane)")
    else:
        session.update(state="gone", reason="the Codex thread is %s: no app-server has it loaded" % status)
    session["last_line"] = ""
    return session


def queued(home: str, thread_id: str) -> Optional[List[str]]:
    """The texts waiting in Codex's own queue for this thread ($CODEX_HOME/queue_1.sqlite, read-only), or None
    when it cannot be read.  A message `codex queue` took sits there until a turn of the thread ends -- after an
    approval dialog is declined with Esc, until the next one does -- so it is neither in the rollout nor lost."""
    try:
        import sqlite3
    except ImportError:  # a Python built without it
        return None
    path = os.path.join(home, "queue_1.sqlite")
    if not os.path.exists(path):
        return []
    texts: List[str] = []
    try:
        conn = sqlite3.connect("file:%s?mode=ro" % path, uri=True, timeout=2.0)
        try:
            rows = conn.execute("SELECT * FROM queued_items").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    for row in rows:
        if thread_id not in row:
            continue
        for value in row:
            if isinstance(value, bytes):
                value = value.decode("utf-8", "replace")
            if isinstance(value, str) and value.startswith("{"):
                try:
                    texts.append(json.dumps(json.loads(value), ensure_ascii=False))
                except ValueError:
                    continue
    return texts
