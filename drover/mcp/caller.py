"""Who is calling the MCP server: the agent session that started it, named on proof -- never by a tool argument.

Claude Code starts a stdio server with `$CLAUDE_CODE_SESSION_ID` (the session id of `~/.claude/sessions/<pid>.json`)
in its environment, and Codex with its thread's environment.  Either is a claim anyone could make, so it is only
taken when drover/self_session.py finds, by process ancestry, a session of that engine above this process -- and,
for Claude, only when the registry's session id is the one claimed.  Then every message the server sends is from
`NAME@MACHINE` (the envelope shows `drover (NAME@MACHINE)`).  Otherwise -- no agent, or a claim that does not
hold -- the actor is what the person who started the server said ($DROVER_ACTOR or --actor), else drover's usual
default, and one line on stderr says why.

The session's own messaging token (`$CLAUDE_CODE_MESSAGING_TOKEN`) authorises peer messages into that session's
inbox: the server has no use for it, so it is taken out of the environment before anything else runs (no child,
log line, record or result can carry it).
"""

from __future__ import annotations

import contextvars
import os
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from drover.errors import DroverError

# What an engine puts in the environment of a process it starts that no one else may see or pass on.
SECRETS = ("CLAUDE_CODE_MESSAGING_TOKEN",)
CLAUDE_CLAIM = "CLAUDE_CODE_SESSION_ID"
CODEX_CLAIM = "CODEX_THREAD_ID"


@dataclass(frozen=True)
class Caller:
    """The server's caller: `actor` is who every message is from (None: drover's default, as the CLI's)."""

    actor: str | None
    engine: str | None = None  # claude / codex when an agent session was proved; None otherwise
    name: str | None = None
    host: str | None = None  # the machine's name, as receivers elsewhere know it
    session_id: str | None = None
    how: str = ""

    @property
    def proved(self) -> bool:
        return self.engine is not None

    def line(self) -> str:
        """One line for stderr: who the server speaks for, and why."""
        if self.proved:
            return f"drover mcp: caller {self.actor} ({self.engine} session {self.session_id}; {self.how})"
        who = self.actor or "drover's default actor ($DROVER_ACTOR, the fleet's actor, else user@host)"
        return f"drover mcp: no agent session proved ({self.how}); messages are from {who}"


def scrub(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Take the engine's secrets out of the environment (os.environ by default); the names taken."""
    env = os.environ if environ is None else environ
    taken = [k for k in SECRETS if k in env]
    for key in taken:
        del env[key]
    return taken


def _codex_parent() -> bool:
    """Was this process started by Codex itself: is its parent a Codex process (by its binary's evidence)?"""
    from drover.remote import procs
    from drover.remote.profiles import merge_profiles

    parent = os.getppid()
    try:
        engine, at = procs.detect_engine(parent, procs.proc_table(), merge_profiles(None))
    except OSError:
        return False
    return engine == "codex" and at == parent  # the parent itself, not some Codex below it


def _fallback(why: str, starter_actor: str | None, environ: dict[str, str]) -> Caller:
    return Caller(actor=starter_actor or environ.get("DROVER_ACTOR") or None, how=why)


async def identify(fleet: str | None, environ: dict[str, str] | None = None, starter_actor: str | None = None) -> Caller:
    """The caller of this process, proved by ancestry; else the fallback.  Never raises: a failure to look is a
    reason to fall back, said on the line.

    Claude Code hands its whole environment to a server: `$CLAUDE_CODE_SESSION_ID` is there, and must name the
    Claude session found above.  Codex hands a server a short list of variables (PATH, HOME, ...), so its claim
    ($CODEX_THREAD_ID) may be missing: then the claim is that the server's parent process is Codex itself (its
    binary, by the evidence engines are known by), and the ancestry proves which session that is.  A server
    merely run somewhere below an agent (a test suite an agent runs) claims nothing, and is nobody's."""
    from drover import self_session
    from drover.ops import Context

    env = dict(os.environ if environ is None else environ)
    claude_id = env.get(CLAUDE_CLAIM, "").strip()
    codex = bool(env.get(CODEX_CLAIM, "").strip()) or _codex_parent()
    if not claude_id and not codex:
        return _fallback(f"no ${CLAUDE_CLAIM} or ${CODEX_CLAIM}, and its parent is not Codex", starter_actor, env)
    # The claim that makes self_session look (the session id alone is one too).
    env.setdefault("CLAUDECODE" if claude_id else "TMUX", "drover-mcp")
    ctx = Context(fleet_path=fleet)
    try:
        me, how = await self_session.find(ctx, env)
    except DroverError as exc:
        return _fallback(f"looking for its session failed: {exc.message}", starter_actor, env)
    finally:
        await ctx.close()
    if me is None:
        said = f"${CLAUDE_CLAIM} is set, but " if claude_id else ""
        return _fallback(said + how, starter_actor, env)
    if claude_id and (me.engine != "claude" or me.id != claude_id):
        # An ancestor that is some other session (or a Claude whose registry names another id): the claim is false.
        why = f"${CLAUDE_CLAIM}={claude_id!r} is not this process's session (its ancestor is {me.engine} session {me.id})"
        return _fallback(why, starter_actor, env)
    if not claude_id and me.engine == "claude":
        why = f"a Claude session ({me.id}) is above this process, but ${CLAUDE_CLAIM} is not set"
        return _fallback(why, starter_actor, env)
    if me.engine not in ("claude", "codex"):
        why = f"the session above this process ({me.name}) runs {me.engine}, not an agent that starts MCP servers"
        return _fallback(why, starter_actor, env)
    return Caller(
        actor=f"{me.name}@{me.machine}",
        engine=me.engine,
        name=me.name,
        host=me.machine,
        session_id=me.id,
        how=how,
    )


# The Codex thread the tool call being served comes from (None: not said), for the op runner of that call.
CALL_THREAD: contextvars.ContextVar[str | None] = contextvars.ContextVar("drover_mcp_call_thread", default=None)


def codex_thread(meta: Any) -> str | None:
    """The thread a tool call says it comes from.  Codex 0.169 starts its MCP servers from its app-server with no
    $CODEX_THREAD_ID (one server may outlive a thread's turn), and names the thread in each tools/call's `_meta`
    instead: `threadId` (also `x-codex-turn-metadata.thread_id`).  A claim like any other: CodexThreads proves it."""
    if not isinstance(meta, dict):
        extra = getattr(meta, "model_extra", None)
        meta = extra if isinstance(extra, dict) else {}
    thread = meta.get("threadId")
    if not isinstance(thread, str):
        turn = meta.get("x-codex-turn-metadata")
        thread = turn.get("thread_id") if isinstance(turn, dict) else None
    return thread.strip() if isinstance(thread, str) and thread.strip() else None


class CodexThreads:
    """Callers proved per Codex thread, from the thread a call names: taken only when self_session finds that
    thread's pane with its app-server among this process's ancestors (the claim $CODEX_THREAD_ID would make, had
    Codex passed it).  Each proved thread gets a client of its own whose actor is that session; a call whose thread
    does not prove, or names none, is served as the server's own caller.  Looked up once per thread."""

    def __init__(self, fleet: str | None, starter_actor: str | None, proved: bool) -> None:
        self.fleet = fleet
        self.starter_actor = starter_actor
        self.off = proved  # the server's own caller was proved at start (a Claude session): no thread is needed
        self.callers: dict[str, Caller | None] = {}
        self.clients: dict[str, Any] = {}
        self.lock: Any = None

    async def caller_of(self, thread: str | None) -> Caller | None:
        if self.off or thread is None:
            return None
        if thread in self.callers:
            return self.callers[thread]
        import anyio

        self.lock = self.lock or anyio.Lock()
        async with self.lock:
            if thread not in self.callers:
                found = await identify(self.fleet, {**os.environ, CODEX_CLAIM: thread}, self.starter_actor)
                self.callers[thread] = found if found.engine == "codex" else None
                print(found.line() + f" [for Codex thread {thread}]", file=sys.stderr, flush=True)
        return self.callers[thread]

    def client(self, caller: Caller) -> Any:
        from drover.api import AsyncClient

        key = str(caller.session_id)
        if key not in self.clients:
            self.clients[key] = AsyncClient(fleet=self.fleet, actor=caller.actor)
        return self.clients[key]

    async def aclose(self) -> None:
        for client in self.clients.values():
            await client.aclose()
