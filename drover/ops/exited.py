"""What becomes of a message to a session that died: resolved in the record (`session_exited`), then offered to
the session's handoff successor by `drover retry`, exactly once.

A message queued behind a session's turn (or accepted, its send cut off) lives only in that session: when the
session dies, nothing will ever deliver it.  But it may have arrived before the death (a turn ends, the queued
message is taken, then the process is killed), and drover can no longer look in a dead session's record.  So the
outcome written is `failed` with `indeterminate` and the code `session_exited`: not delivered as far as the
session goes, never retried blindly to it.  `drover retry` then offers the text to the newest live generation of
the session's handoff chain -- another session, which has not had it -- once, as a new message that names the
one it stands for (`offered_from`); with no successor it refuses, saying how to name one (that part is
`offer_to_successor` in drover/ops/send.py, beside the retry it belongs to).
"""

from __future__ import annotations

from typing import Any

from drover.ops.core import Context
from drover.record import Message
from drover.remote import protocol as P

# A message accepted this recently may still be on its way out of its sender: never resolved under it.
SETTLE_S = 5.0
# How far back a watch looks for messages left queued: older ones were settled (or given up on) long ago.
HORIZON_S = 7 * 86400.0
OFFERED = "offered_from"
SENT = (P.DELIVERED, P.QUEUED, P.HELD)


def stranded(ctx: Context, now: float) -> list[Message]:
    """The messages that may be stranded in a session: queued behind its turn, or accepted with no outcome, within
    the horizon, to a resolved session (one with an identity to check).  A queued message drover saw in the
    receiver's own record is stranded too: seen there waiting is not taken in, and a session that died with it in
    its queue never will (a stranger's find: it stayed queued forever, and `retry` said there was nothing to do)."""
    since = now - HORIZON_S
    queued = ctx.truth.query(limit=1000, since_ts=since, outcome=P.QUEUED).messages
    pending = ctx.truth.query(limit=1000, since_ts=since, pending=True).messages
    out = list(queued) + [m for m in pending if now - m.ts > SETTLE_S]
    return [m for m in out if m.options.get("identity")]


def resolve_gone(ctx: Context, m: Message, why: str) -> dict[str, Any] | None:
    """Record that `m` cannot arrive any more (its session is gone), unless someone is at work on it or its fate
    changed meanwhile; the row for the run's answer, or None."""
    with ctx.truth.working_on(m.id, exclusive=True) as mine:
        if not mine:
            return None  # its send (or a retry) is under way: its own outcome will say
        hits, _count, _stats = ctx.truth.find(m.id)
        now = hits[0] if hits else None
        if now is None or not (now.outcome == P.QUEUED or now.outcome is None):
            return None
        was = "queued behind its turn" if now.outcome == P.QUEUED else "on its way (its send was cut off)"
        if now.outcome == P.QUEUED and now.verified:
            was += " (seen waiting in its own record)"
        detail = (
            f"not delivered: {why} while the message was {was}; it may have reached the session before it died, "
            "so it is never sent to it again -- `drover retry ID` offers it to a handoff successor"
        )
        outcome = {"outcome": P.FAILED, "lane": now.lane, "code": P.SESSION_EXITED, "indeterminate": True, "detail": detail}
        ctx.truth.outcome(m.id, outcome)
    return {"id": m.id, "host": m.host, "target": m.target, "was": now.outcome or "pending", "detail": detail}
