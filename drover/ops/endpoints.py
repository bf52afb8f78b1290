"""Receivers that are not sessions: a bot behind a webhook (`bot:NAME`, a `[bots.NAME]` of the fleet) and a local
command (`adapter:NAME`, an `[adapters.NAME]`).

A send to one is recorded as any message is (its `accepted` event first, then its outcome; `drover retry` finishes
it), but there is no session to resolve, pin or look into: the receiver's own answer -- an HTTP status, an exit
code -- is the outcome, and a delivered one is `verified` by that answer.  A retry sends the same message id again
(the webhook's `webhook-id`, the adapter's `DROVER_MESSAGE_ID`), so a receiver can tell a repeat from a new message.

Each kind lives in a module of its own, imported only when a message goes to one; it offers
`async def deliver(ctx, name, *, msg_id, text, actor, attempt) -> Outcome` and never raises for the receiver's
failures (they are outcomes).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from drover.errors import UnknownEndpoint
from drover.fleet import ENDPOINT_KINDS, Fleet
from drover.ops.core import Context
from drover.ops.outcome import Outcome

KINDS = ENDPOINT_KINDS
MODULES = {"bot": "drover.bots.deliver", "adapter": "drover.adapters"}


def names(fleet: Fleet, kind: str) -> list[str]:
    """The fleet's receivers of this kind (`[bots.NAME]`, `[adapters.NAME]`)."""
    return sorted(getattr(fleet, f"{kind}s", None) or {})


def check(fleet: Fleet, kind: str, name: str) -> None:
    """`bot:NAME` must name one of the fleet's bots: said with their names, never a guess at the nearest."""
    known = names(fleet, kind)
    if name not in known:
        hint = f"the fleet's {kind}s: {', '.join(known)}" if known else f"the fleet has no {kind}s"
        raise UnknownEndpoint(
            f"no {kind} {name!r} in the fleet", hint=f"{hint}; add one as a [{kind}s.{name}] table in fleet.toml"
        )


def options(kind: str, name: str) -> dict[str, Any]:
    """What the `accepted` event records of such a receiver: its kind, and an identity that counts its limits."""
    return {"endpoint": kind, "identity": f"{kind}:{name}", "pin": name}


async def deliver(ctx: Context, kind: str, name: str, *, msg_id: str, text: str, actor: str, attempt: int) -> Outcome:
    """One attempt (`attempt` 1 for the send, more for each retry) through the kind's own module."""
    module: Any = import_module(MODULES[kind])
    outcome: Outcome = await module.deliver(ctx, name, msg_id=msg_id, text=text, actor=actor, attempt=attempt)
    return outcome


def busy(ctx: Context, kind: str, msg_id: str) -> str | None:
    """Why a retry must wait: an earlier attempt still running outside any drover (the kind's `busy`, if it has one)."""
    module: Any = import_module(MODULES[kind])
    check = getattr(module, "busy", None)
    return check(ctx, msg_id) if check else None


def unseen(kind: str) -> dict[str, Any]:
    """What `verify` can say of an endpoint's message it has no delivered answer for: nothing drover can read
    holds it, so it is neither found nor provably absent."""
    article = "an" if kind[0] in "aeiou" else "a"
    how = f"{article} {kind} keeps no record drover can read: `drover retry ID` sends it again under the same id"
    return {"found": None, "how": how, "lane": kind}
