"""HOST:ID, the way every command names a session, parsed in one place.

The part before the first ':' is the host whenever it could be one (a host name's characters): targets never
guess, so `hbb:worker-1` with no host `hbb` is an unknown host (exit 6, naming the fleet's hosts), never the
local pane `hbb:worker-1`.  A local pane whose name holds a ':' (a tmux session:window.pane) is written with its
host: `local:work:1.0`.  A value with no ':' (or whose head cannot be a host name, `main/work:1.0`) is an ID on
`local`.  `bot:NAME` and `adapter:NAME` name receivers that are not sessions (no host may be called `bot` or
`adapter`).  An empty target, or a host with nothing after its ':', is a usage error (exit 2): there is no session
to name.
"""

from __future__ import annotations

from typing import NamedTuple

from drover.errors import UnknownEngine, UnknownHost, UsageError
from drover.fleet import ENDPOINT_KINDS, HOST_NAME, LOCAL, Fleet
from drover.remote import protocol as P

HINT = "name a session as HOST:ID, e.g. local:%3 or box-a:webapp-f8; `drover ls` lists them"


class EmptyTarget(UsageError):
    # A code of the protocol's table (class `usage`), so its exit code follows from the table like every other.
    code = P.USAGE_ERROR


class Target(NamedTuple):
    host: str
    id: str
    named_host: bool  # the host was typed (HOST:ID), not taken as the default

    def __str__(self) -> str:
        return f"{self.host}:{self.id}"


def parse(value: str, fleet: Fleet) -> Target:
    """HOST:ID (or ID, on `local`) against this fleet."""
    if not value.strip():
        raise EmptyTarget("the target is empty", hint=HINT)
    head, sep, rest = value.partition(":")
    if sep and head in ENDPOINT_KINDS:
        # `bot:NAME`, `adapter:NAME`: a receiver that is not a session (drover/ops/endpoints.py); its name is checked
        # against the fleet where it is sent to, with the fleet's names in the error.
        if not rest.strip():
            raise EmptyTarget(
                f"the target {value!r} names no {head}", hint=f"write {head}:NAME, NAME a [{head}s.NAME] of the fleet"
            )
        return Target(head, rest, True)
    if sep and head in fleet.host_names():
        if not rest.strip():
            raise EmptyTarget(f"the target {value!r} names host {head!r} but no session on it", hint=HINT)
        return Target(head, rest, True)
    if sep and HOST_NAME.match(head):
        hosts = ", ".join(fleet.host_names())
        raise UnknownHost(
            f"unknown host {head!r}",
            hint=f"known hosts: {hosts}; a local pane whose name holds ':' is written local:{value}",
        )
    return Target(LOCAL, value, False)


class NotASession(UsageError):
    code = P.USAGE_ERROR


def not_a_session(kind: str, name: str, command: str) -> NotASession:
    return NotASession(
        f"{command} does not apply to {kind}:{name}: {'an' if kind[0] in 'aeiou' else 'a'} {kind} is a receiver, not a session",
        hint=f"`drover send {kind}:{name} TEXT` reaches it"
        + (f", `drover read {kind}:{name}` shows its replies" if kind == "bot" else "")
        + "; name a session as HOST:ID",
    )


def parse_session(value: str, fleet: Fleet, command: str) -> Target:
    """As `parse`, for a command that needs a session (status, wait, nudge, handoff): `bot:`/`adapter:` is a usage
    error saying so (exit 2), not an unknown host."""
    t = parse(value, fleet)
    if t.host in ENDPOINT_KINDS:
        raise not_a_session(t.host, t.id, command)
    return t


# How an identity begins (drover/remote/discovery.py `identity`): `claude:ID`, `codex:ID`, `tmux:SERVER/%N@PID`.
IDENTITY_KINDS = ("claude", "codex", "tmux")


def parse_recorded(value: str, fleet: Fleet) -> Target:
    """HOST:ID as `drover log --target` and `spawns --target` take it: as `parse`, except that a session's identity
    (`claude:…`) with no host before it names that session on any host, not an unknown host `claude`."""
    head, sep, _rest = value.partition(":")
    if sep and head in IDENTITY_KINDS and head not in fleet.host_names():
        return Target(LOCAL, value, False)
    return parse(value, fleet)


def check_engine(fleet: Fleet, engine: str | None) -> None:
    """An engine to filter or check by must be one drover knows (built in, or an [engines.NAME] or [spawn.NAME] of
    the fleet): `--engine claud` would match nothing and say so only as an empty answer.  A usage error (exit 2),
    as `drover spawn` and `drover guard check` say an unknown engine."""
    if engine is None:
        return
    from drover.remote.profiles import BUILTIN_PROFILES

    known = sorted({*BUILTIN_PROFILES, *fleet.engines, *fleet.spawn})
    if engine not in known:
        raise UnknownEngine(f"unknown engine {engine!r}", hint=f"known engines: {', '.join(known)}")
