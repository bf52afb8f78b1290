"""What `watch run` tried and settled, in the record, and a dead worker's cut-off `drover done` report finished.

A try that settles nothing in the record by itself -- a notice refused because the parent's place is another
session's now (no message of its own says so), or a try at a dead worker's report that left it unsettled -- is a
`watch_tried` event (`key`: `notice:SPAWN` or `report:LIFECYCLE_ID`; `final`: never again).  Later runs read them:
a settled notice is not said again every minute, and a report is tried at most NOTICE_ATTEMPTS times.

A worker killed right after `drover done` recorded its end leaves its report (the accepted message tagged
`terminal`, `lifecycle` = the event's id) pending or indeterminate, and nobody runs `done` again in a dead
worker.  When the worker is gone, the run finishes the report through `messages.retry`, which looks in the
receiver's record before it sends anything: never twice.  A parent mid-turn is not a try (the report waits).
"""

from __future__ import annotations

import time
from typing import Any

from drover import lifecycle
from drover.errors import DroverError
from drover.ops import exited
from drover.ops.core import Context
from drover.record import now_iso
from drover.remote import protocol as P

NOTICE_ATTEMPTS = 3
TRIED = "watch_tried"


class Seen:
    """What one backward pass over the record found (lines with none of the NEEDLES are passed over unparsed)."""

    def __init__(self, found: list[dict[str, Any]]) -> None:
        self.found = found
        # the report message of each lifecycle event (drover done's: tagged terminal, lifecycle = the event's id)
        self.reports = {
            str((ev.get("options") or {}).get("lifecycle")): str(ev["id"])
            for ev in found
            if ev.get("event") == "accepted" and (ev.get("options") or {}).get("terminal")
        }
        self.tries: dict[str, int] = {}
        self.final: set[str] = set()
        for ev in found:
            if ev.get("event") == TRIED and isinstance(ev.get("key"), str):
                self.tries[ev["key"]] = self.tries.get(ev["key"], 0) + 1
                if ev.get("final"):
                    self.final.add(ev["key"])


def tried(ctx: Context, key: str, row: dict[str, Any], final: bool) -> None:
    """Write down a try that settled nothing in the record by itself (so later runs can count it, or say nothing)."""
    ts = time.time()
    ctx.truth.append(
        {
            "v": 1,
            "event": TRIED,
            "id": lifecycle.new_event_id(),
            "ts": ts,
            "time": now_iso(ts),
            "key": key,
            "final": final,
            **{k: row.get(k) for k in ("spawn", "outcome", "detail") if row.get(k) is not None},
        }
    )


def _unsettled(m: Any) -> bool:
    return m.outcome is None or bool(m.indeterminate) or bool(m.pasted)


def cut_off_reports(
    ctx: Context, spawns: list[dict[str, Any]], terminal: list[dict[str, Any]], seen: Seen, now: float
) -> list[tuple[dict[str, Any], dict[str, Any], Any]]:
    """(spawn row, its done/failed event, the report message) for each report `drover done` started in this
    record (not a copy pulled from another host: that report lives in the host's own record) and left unsettled,
    within the horizon and the tries.  Whether the worker is gone is the run's to ask."""
    rows = {r["spawn_id"]: r for r in spawns if r.get("identity") and r.get("host")}
    out = []
    for ev in terminal:
        if ev.get("event") not in ("done", "failed") or ev.get("pulled") or ev.get("spawn") not in rows:
            continue
        if now - float(ev.get("ts") or now) > exited.HORIZON_S:
            continue
        msg_id = seen.reports.get(str(ev.get("id")))
        key = f"report:{ev.get('id')}"
        if msg_id is None or key in seen.final or seen.tries.get(key, 0) >= NOTICE_ATTEMPTS:
            continue
        hits = ctx.truth.find(msg_id)[0]
        if hits and _unsettled(hits[0]):
            out.append((rows[str(ev["spawn"])], ev, hits[0]))
    return out


async def finish_report(ctx: Context, row: dict[str, Any], ev: dict[str, Any], m: Any, seen: Seen) -> dict[str, Any]:
    """Finish the report of a worker that died with it unsettled: through `messages.retry`, never a second one."""
    from drover.ops.send import RetryRequest, messages_retry

    key = f"report:{ev['id']}"
    out: dict[str, Any] = {
        "id": m.id,
        "event": ev.get("event"),
        "lifecycle": ev.get("id"),
        "spawn": row["spawn_id"],
        "worker": {"host": row.get("host"), "name": row.get("name"), "id": row.get("id")},
        "parent": {"host": m.host, "id": m.target},
    }
    try:
        res = await messages_retry(ctx, RetryRequest(id=m.id))
        out.update(outcome=(res.data or {}).get("outcome"), detail=(res.data or {}).get("detail"))
        code = (res.data or {}).get("code")
    except DroverError as exc:
        out.update(outcome=P.FAILED, detail=exc.message)
        code = exc.code
    if code == P.BUSY:
        return out  # the parent mid-turn (or a retry under way): not a try, the next run looks again
    hits = ctx.truth.find(m.id)[0]
    if not hits or _unsettled(hits[0]):
        tries = seen.tries.get(key, 0) + 1
        tried(ctx, key, {**out, "spawn": row["spawn_id"]}, final=tries >= NOTICE_ATTEMPTS)
        if tries >= NOTICE_ATTEMPTS:
            out["given_up"] = NOTICE_ATTEMPTS
    return out
