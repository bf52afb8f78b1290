"""A name that names no live session, but a worker drover spawned that is gone: said as what happened ("it
exited"), with code `session_exited`, instead of the "no session" a typo gets.  `send`, `nudge` and `read` ask
here after the host said session_not_found; whether it is such a worker is live_state's call, not copied here."""

from __future__ import annotations

import time
from typing import Any

from drover.errors import DroverError, TargetError
from drover.ops import live_state, sightings
from drover.ops.core import Context
from drover.remote import protocol as P


def ago(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return "never seen live"
    secs = max(0.0, (time.time() if now is None else now) - ts)
    if secs < 90:
        return f"{secs:.0f}s ago"
    if secs < 5400:
        return f"{secs / 60:.0f}m ago"
    if secs < 172800:
        return f"{secs / 3600:.0f}h ago"
    return f"{secs / 86400:.0f}d ago"


def freshen(ctx: Context, row: dict[str, Any]) -> dict[str, Any]:
    """An exited row (live_state.exited_status) with the newest sighting drover has, when that is newer than the
    record's; `evidence.last_seen_source` says which it is."""
    seen, source = sightings.newest(ctx, row.get("spawn_id"), row.get("last_seen"))
    row["last_seen"] = seen
    row["since"] = seen
    row.setdefault("evidence", {})["last_seen_source"] = source
    return row


async def exited_row(ctx: Context, host: str, target: str, error: DroverError) -> dict[str, Any] | None:
    """The spawned worker `target` named, told as exited (freshened); None when it is not one (a typo)."""
    if error.code != P.SESSION_NOT_FOUND:
        return None
    row = await live_state.exited_status(ctx, host, target, error)
    return freshen(ctx, row) if row is not None else None


def exited_error(host: str, target: str, row: dict[str, Any], what: str = "nothing was sent") -> TargetError:
    spawn = row.get("spawn_id") or "a spawn"
    message = f"{target} was started by drover ({spawn}) and is gone (last seen {ago(row.get('last_seen'))}): it exited; {what}"
    hint = (
        f"`drover spawns --target {host}:{target}` shows how it ended; "
        f"`drover handoff {host}:{target} HOST:NEW` sends what is addressed to it to a successor"
    )
    return TargetError(message, host=host, code=P.SESSION_EXITED, hint=hint, details={"spawn_id": row.get("spawn_id")})


async def explain(ctx: Context, host: str, target: str, error: DroverError, what: str = "nothing was sent") -> DroverError:
    """`error` as it stands for a typo; the `session_exited` error for a spawned worker that is gone.  A failure to
    look (its host stopped answering) keeps the original error: never worse than today's answer."""
    try:
        row = await exited_row(ctx, host, target, error)
    except DroverError:
        return error
    return error if row is None else exited_error(host, target, row, what)
