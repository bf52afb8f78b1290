"""Which session am I?  The session the calling process runs in, on this machine, taken only on proof.

The proof is the process tree: a session counts as the caller's only when its own process (a tmux pane's first
process, a Claude Code registry record's pid, the engine's process) is an ancestor of the caller.  What the
environment says (`$TMUX_PANE`, `$CLAUDECODE`, ...) is a claim anyone can make, so it only decides whether looking
is worth its cost; it never names the session.

Codex 0.169 runs its tools in its app-server daemon, not under the TUI's pane: the daemon is a child of whichever
TUI of its CODEX_HOME started it, so the pane above a tool may be another TUI's.  There the claim is
`$CODEX_THREAD_ID` (Codex sets it, with CODEX_SESSION_ID and CODEX_TOOL_CALL_ID, in a tool's environment), taken
only when the app-server of the pane whose thread that is stands among the caller's ancestors.

The address other sessions answer to is `HOST:ID`: HOST this machine's name (a receiver elsewhere knows it by
that, not by `local`), ID the session's own id (a Claude session id, or `server/%pane`).
"""

from __future__ import annotations

import json
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Any

from drover.fleet import LOCAL
from drover.remote import procs

# What makes looking worth it: set by tmux in every pane, by Claude Code and Codex in their tools' environment.
CLAIMS = ("TMUX", "TMUX_PANE", "CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CODEX_THREAD_ID")
SAFE = re.compile(r"[^A-Za-z0-9._%/-]")


@dataclass(frozen=True)
class SelfSession:
    host: str  # the fleet's name for where it runs: `local`
    machine: str  # this machine's own name, for receivers elsewhere
    id: str
    name: str
    identity: str
    engine: str
    pin: str
    pane: str | None = None
    server: str | None = None
    pid: int | None = None
    how: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def address(self) -> str:
        """`MACHINE:ID`, in characters that cannot break the envelope's attribute or an address's grammar."""
        return f"{self.machine}:{SAFE.sub('', self.pin)}"

    def record(self) -> dict[str, Any]:
        """The sender as the record carries it (and a spawn's parent["session"])."""
        out = {"host": self.host, "machine": self.machine, "id": self.id, "name": self.name, "identity": self.identity}
        return out | {k: v for k, v in (("pane", self.pane), ("server", self.server), ("engine", self.engine)) if v}

    def spellings(self) -> dict[str, Any]:
        """Its spellings for a lifecycle event's `session`."""
        return {
            "identity": self.identity,
            "id": self.id,
            "name": self.name,
            "pane": self.pane,
            "pid": self.pid,
            "server": self.server,
            "engine": self.engine,
        }


def machine_name() -> str:
    """This machine's short name, in the characters a host name may hold."""
    name = socket.gethostname().split(".")[0]
    return re.sub(r"[^A-Za-z0-9_-]", "", name) or "localhost"


def caller_pid(ctx: Any) -> int | None:
    """The process that asked: this one, or the daemon's client (None: unknown, so no session is taken)."""
    request = getattr(ctx, "request", None)
    if request is not None:
        pid = getattr(request, "peer_pid", None)
        return pid if isinstance(pid, int) and pid > 1 else None
    return os.getpid()


def claimed(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return any(env.get(k) for k in CLAIMS)


def _pin(s: dict[str, Any]) -> str:
    """What resolves to exactly this session (as discovery.pin): a Claude session's id, else server/%pane."""
    if s.get("engine") == "claude" and not str(s.get("id", "")).startswith("%"):
        return str(s["id"])
    return f"{s.get('server')}/{s['id']}"


def _codex_home(s: dict[str, Any]) -> str:
    env = procs.process_env(int(s.get("engine_pid") or 0))
    return env.get("CODEX_HOME") or os.path.join(env.get("HOME", ""), ".codex")


def _codex_daemons(sessions: list[dict[str, Any]]) -> dict[int, str]:
    """The app-server daemon of each live Codex pane's CODEX_HOME: its pid -> that home.  (Its pid file holds JSON,
    {"pid": N, ...}.)"""
    out: dict[int, str] = {}
    for home in {_codex_home(s) for s in sessions if s.get("engine") == "codex" and s.get("engine_pid")}:
        try:
            with open(os.path.join(home, "app-server-daemon", "daemon.pid"), encoding="utf-8") as f:
                pid = json.load(f)["pid"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if isinstance(pid, int) and pid > 1:
            out[pid] = home
    return out


def _nearest(sessions: list[dict[str, Any]], chain: list[int], env: dict[str, str]) -> tuple[dict[str, Any] | None, str]:
    """The session whose boundary is nearest above the caller, walking up its ancestors.

    A Codex app-server is a boundary too: it runs every tool of every TUI of its CODEX_HOME, and it is itself the
    child of whichever TUI started it first -- so above it stands that TUI's pane, which is not the caller's session
    for a tool of another TUI.  There the thread the tool runs for ($CODEX_THREAD_ID) decides, among that home's
    panes; with no pane running that thread, no session is taken."""
    daemons = _codex_daemons(sessions)
    for p in chain:
        if p in daemons:
            thread = env.get("CODEX_THREAD_ID")
            hits = [
                s
                for s in sessions
                if s.get("engine") == "codex" and thread and s.get("thread") == thread and _codex_home(s) == daemons[p]
            ]
            if len(hits) == 1:
                return hits[0], "a tool of Codex's app-server (an ancestor of this one) for $CODEX_THREAD_ID's pane"
            return None, "this runs under a Codex app-server, and no one live pane of it runs $CODEX_THREAD_ID's thread"
        hits = [s for s in sessions if p in (s.get("pid"), s.get("engine_pid"))]
        if hits:
            # Between a Claude's registry session and its pane (one process): the registry's (it has the inbox).
            hits.sort(key=lambda s: 0 if s.get("engine") == "claude" and not str(s.get("id", "")).startswith("%") else 1)
            return hits[0], "its process is an ancestor of this one"
    return None, "no session on this machine has a process that is an ancestor of this one"


async def find(ctx: Any, environ: dict[str, str] | None = None) -> tuple[SelfSession | None, str]:
    """(the caller's session, how it was known) or (None, why not)."""
    pid = caller_pid(ctx)
    if pid is None:
        return None, "drover's daemon ran this command and cannot tell which process asked"
    env = dict(os.environ if environ is None else environ) if pid == os.getpid() else procs.process_env(pid)
    if not claimed(env):
        return None, "nothing in this process's environment says it runs in a session (no $TMUX, $CLAUDECODE, ...)"
    from drover.ops.hosts import call_host

    chain = procs.ancestors(pid)
    data = await call_host(ctx, LOCAL, "list", {"state": False})
    sessions = [s for s in data.get("sessions", []) if isinstance(s, dict) and s.get("id")]
    found, how = _nearest(sessions, chain, env)
    if found is None:
        return None, how
    pin = _pin(found)
    answer = await call_host(ctx, LOCAL, "resolve", {"target": pin})
    s = answer.get("session") or found
    return (
        SelfSession(
            host=LOCAL,
            machine=machine_name(),
            id=str(s.get("id")),
            name=str(s.get("name") or s.get("id")),
            identity=str(answer.get("identity")),
            engine=str(s.get("engine") or "unknown"),
            pin=str(answer.get("pin") or pin),
            pane=s.get("pane") or (s["id"] if str(s.get("id", "")).startswith("%") else None),
            server=s.get("server"),
            pid=s.get("pid"),
            how=how,
        ),
        how,
    )
