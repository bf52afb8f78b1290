"""HOST:ID, the way every command names a session, parsed in one place.

The part before the first ':' is a host only when the fleet knows it, so `work:1.0` (a tmux
session:window.pane) is the local pane `work:1.0`, and `box-a:webapp-f8` is `webapp-f8` on box-a when the
fleet has a box-a.  Without a known host the whole value is an ID on `local`.  An empty target, or a host
with nothing after its ':', is a usage error (exit 2): there is no session to name.
"""

from __future__ import annotations

from typing import NamedTuple

from drover.errors import UsageError
from drover.fleet import LOCAL, Fleet
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
    if sep and head in fleet.host_names():
        if not rest.strip():
            raise EmptyTarget(f"the target {value!r} names host {head!r} but no session on it", hint=HINT)
        return Target(head, rest, True)
    return Target(LOCAL, value, False)
