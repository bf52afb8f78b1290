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

import os
from collections.abc import MutableMapping
from dataclasses import dataclass

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
