"""Which session am I?  The session the calling process runs in, on this machine, taken only on proof.

The proof is the process tree: a session counts as the caller's only when its own process (a tmux pane's first
process, a Claude Code registry record's pid, the engine's process) is an ancestor of the caller.  What the
environment says (`$TMUX_PANE`, `$CLAUDECODE`, ...) is a claim anyone can make, so it only decides whether looking
is worth its cost; it never names the session.

Codex runs its tools in its app-server daemon, not under the TUI's pane, so no pane is an ancestor of a Codex
tool.  There the claim is `$CODEX_THREAD_ID` (what Codex puts in a tool's environment), and it is taken only when
the app-server of a live Codex pane whose thread is that id is itself an ancestor of the caller.

The address other sessions answer to is `HOST:ID`: HOST this machine's name (a receiver elsewhere knows it by
that, not by `local`), ID the session's own id (a Claude session id, or `server/%pane`).
"""

from __future__ import annotations

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


def _env_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return out


def _pin(s: dict[str, Any]) -> str:
    """What resolves to exactly this session (as discovery.pin): a Claude session's id, else server/%pane."""
    if s.get("engine") == "claude" and not str(s.get("id", "")).startswith("%"):
        return str(s["id"])
    return f"{s.get('server')}/{s['id']}"


def _codex_match(sessions: list[dict[str, Any]], chain: list[int], env: dict[str, str]) -> dict[str, Any] | None:
    """A Codex tool's session: the pane whose thread is $CODEX_THREAD_ID, if that pane's app-server is our ancestor."""
    thread = env.get("CODEX_THREAD_ID")
    if not thread:
        return None
    for s in sessions:
        if s.get("engine") != "codex" or s.get("thread") != thread:
            continue
        home = _env_of(int(s.get("engine_pid") or 0)).get("CODEX_HOME") or os.path.join(
            _env_of(int(s.get("engine_pid") or 0)).get("HOME", ""), ".codex"
        )
        try:
            with open(os.path.join(home, "app-server-daemon", "daemon.pid"), encoding="utf-8") as f:
                daemon = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if daemon in chain:
            return s
    return None


async def find(ctx: Any, environ: dict[str, str] | None = None) -> tuple[SelfSession | None, str]:
    """(the caller's session, how it was known) or (None, why not)."""
    pid = caller_pid(ctx)
    if pid is None:
        return None, "drover's daemon ran this command and cannot tell which process asked"
    env = dict(os.environ if environ is None else environ) if pid == os.getpid() else _env_of(pid)
    if not claimed(env):
        return None, "nothing in this process's environment says it runs in a session (no $TMUX, $CLAUDECODE, ...)"
    from drover.ops.hosts import call_host

    chain = procs.ancestors(pid)
    data = await call_host(ctx, LOCAL, "list", {"state": False})
    sessions = [s for s in data.get("sessions", []) if isinstance(s, dict) and s.get("id")]
    best: tuple[int, dict[str, Any]] | None = None
    for s in sessions:
        for key in ("pid", "engine_pid"):
            p = s.get(key)
            if isinstance(p, int) and p in chain:
                depth = chain.index(p)
                # The nearest ancestor wins: a session started inside another's pane is its own.  Between a Claude's
                # registry session and its pane (one process), the registry's (it has the inbox).
                if best is None or depth < best[0] or (depth == best[0] and s.get("engine") == "claude"):
                    best = (depth, s)
    how = "its process is an ancestor of this one"
    found = best[1] if best is not None else None
    if found is None:
        found = _codex_match(sessions, chain, env)
        how = "$CODEX_THREAD_ID, with its app-server an ancestor of this one"
    if found is None:
        return None, "no session on this machine has a process that is an ancestor of this one"
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
