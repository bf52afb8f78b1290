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


def _fallback(why: str, starter_actor: str | None, environ: dict[str, str]) -> Caller:
    return Caller(actor=starter_actor or environ.get("DROVER_ACTOR") or None, how=why)


async def identify(fleet: str | None, environ: dict[str, str] | None = None, starter_actor: str | None = None) -> Caller:
    """The caller of this process, proved by ancestry; else the fallback.  Never raises: a failure to look is a
    reason to fall back, said on the line."""
    env = dict(os.environ if environ is None else environ)
    claude_id = env.get(CLAUDE_CLAIM, "").strip()
    codex_thread = env.get(CODEX_CLAIM, "").strip()
    if not claude_id and not codex_thread:
        return _fallback("no $CLAUDE_CODE_SESSION_ID or $CODEX_THREAD_ID in its environment", starter_actor, env)
    from drover import self_session
    from drover.ops import Context

    if claude_id:
        env.setdefault("CLAUDECODE", "1")  # the claim that makes self_session look (the id alone is one too)
    ctx = Context(fleet_path=fleet)
    try:
        me, how = await self_session.find(ctx, env)
    except DroverError as exc:
        return _fallback(f"looking for its session failed: {exc.message}", starter_actor, env)
    finally:
        await ctx.close()
    claimed = "claude" if claude_id else "codex"
    if me is None:
        return _fallback(f"${CLAUDE_CLAIM if claude_id else CODEX_CLAIM} is set, but {how}", starter_actor, env)
    if claude_id and (me.engine != "claude" or me.id != claude_id):
        # An ancestor that is some other session (or a Claude whose registry names another id): the claim is false.
        why = f"${CLAUDE_CLAIM}={claude_id!r} is not this process's session (its ancestor is {me.engine} session {me.id})"
        return _fallback(why, starter_actor, env)
    if not claude_id and me.engine != "codex":
        return _fallback(f"${CODEX_CLAIM} is set, but the session above this process runs {me.engine}", starter_actor, env)
    return Caller(
        actor=f"{me.name}@{me.machine}",
        engine=claimed,
        name=me.name,
        host=me.machine,
        session_id=me.id,
        how=how,
    )
