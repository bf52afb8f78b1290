"""nudge.run: the fleet's `[[nudge]]` entries sent when they are due, through the refusals of drover/ops/nudge.py.

Schedules: `[[nudge]]` entries in fleet.toml (drover/fleet.py `NudgeEntry`).  `nudge.run` sends the entries that
are due.  What each one did is a `nudge_run` event in the truth file -- `start` before its send (write-ahead), `done`
after it -- keyed by the entry's name, else its target as written.  Only a send that may have reached the session
(delivered, queued, held, uncertain, or a run that died mid-send after its accepted event) counts for `every`; any other
attempt counts for `retry` only, so a session that is busy at 09:00 is tried again at 09:01, not at 10:00.  Runs take
a lock for the whole decide-and-send, so two overlapping runs never send one entry twice: the second waits (bounded),
then reads the first's record and finds nothing due.  A message a killed run left with no outcome (recorded,
perhaps never delivered) is finished by the next run through `messages.retry`: looked for in the receiver's own
record, delivered only if it is not there, and recorded -- exactly once.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import re
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pydantic import Field

from drover import targets
from drover.errors import ConfigError, DroverError, ExitCode, InvalidRequest, TargetError
from drover.fleet import NudgeEntry, find_path
from drover.fleet_schedule import quiet_minutes
from drover.ops.core import Context, Request, Result, op
from drover.ops.nudge import NudgeRequest, nudge
from drover.ops.send import RetryRequest, messages_retry  # finishing a killed run's message: retry's rules, reused
from drover.paths import duration_s
from drover.record import ReadStats, now_iso
from drover.remote import protocol as P
from drover.truth import text_digest
from drover.truth_query import ORDER_SLACK_S


class RunRequest(Request):
    dry_run: bool = Field(False, description="say what is due, send nothing")
    entries: list[str] | None = Field(None, description="only these entries (by name, else target as written)")
    lock_wait_s: float = Field(50.0, ge=0, le=3600, description="wait this long for another run to finish, then give up")


# -- schedules ---------------------------------------------------------------------------------------------------

# Cron's minute ticks wobble by a second or two: a 15-minute entry sent at 09:00:02 must be due at 09:15:01, not
# at 09:16.  An entry is due this much before its interval is quite over (half the interval for short ones).
SLACK_S = 30.0
EVENT = "nudge_run"
TS = re.compile(rb'"ts":(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)')  # an event's time, as drover writes it (no spaces)
SENT = {P.DELIVERED, P.QUEUED, P.HELD}


def in_quiet(minute: int, span: tuple[int, int]) -> bool:
    """Is `minute` (after midnight) inside [start, end)?  A span whose end is before its start crosses midnight."""
    start, end = span
    return start <= minute < end if start < end else minute >= start or minute < end


def _slack(seconds: float) -> float:
    return min(SLACK_S, seconds / 2)


def _history(
    ctx: Context, entries: dict[str, NudgeEntry], horizon_s: float, now: float
) -> tuple[dict[str, dict[str, Any]], list[Any]]:
    """Per entry key: when it was last sent (`sent`) and last tried (`tried`), within the horizon, and the
    messages a run that died left unfinished (`pending`: [(attempt, message id)], for the next run to finish).

    Read backwards from the end of the truth file, stopping at the horizon: what happened before it cannot make an
    entry not due.  A `start` with no `done` is a run that died mid-send: see `_orphan`."""
    stop = now - horizon_s - ORDER_SLACK_S

    def skip(raw: bytes) -> bool:
        # Only nudge_run lines are wanted, and one old line to stop at: the others are passed over unparsed.
        if b'"nudge_run"' in raw:
            return False
        ts = TS.search(raw)
        return ts is None or float(ts.group(1)) >= stop

    stats = ReadStats(str(ctx.truth.path))
    found: dict[str, dict[str, Any]] = {}
    finished: set[Any] = set()
    orphans: list[tuple[str, float, Any]] = []
    for ev in ctx.truth.backward(stats, skip=skip):
        ts = float(ev["ts"])
        if ts < stop:
            break
        key = ev.get("entry")
        if ev["event"] != EVENT or not isinstance(key, str) or key not in entries:
            continue
        seen = found.setdefault(key, {})
        attempt = ev.get("attempt")
        if ev.get("phase") == "done":
            finished.add(attempt)
            seen["tried"] = max(seen.get("tried", ts), ts)
            if ev.get("sent") is True:
                seen["sent"] = max(seen.get("sent", ts), ts)
        elif ev.get("phase") == "start" and attempt not in finished:
            seen["tried"] = max(seen.get("tried", ts), ts)
            orphans.append((key, ts, attempt))
    for key, ts, attempt in orphans:
        seen = found[key]
        if ts <= seen.get("sent", float("-inf")):
            continue  # sent again since: whatever that run left is old news, not to be delivered now
        sent, pending = _orphan(ctx, entries[key], ts, attempt)
        if sent:
            seen["sent"] = ts
        seen.setdefault("pending", []).extend((attempt, msg_id) for msg_id in pending)
    return found, stats.warnings()


def _orphan(ctx: Context, entry: NudgeEntry, since: float, attempt: Any) -> tuple[bool, list[str]]:
    """Did the send of a run that died after its `start` get anywhere, and which of its messages has no outcome?
    Runs hold the lock, so the events between that start and the next nudge_run event are the dead run's: an
    accepted event with the entry's text there is its message.  None: it died before its accepted event, nothing
    was sent.  One with no outcome yet, or one that may have reached the session: it counts as sent (never twice),
    and one with no outcome is pending: the next run finishes it as `drover retry` would (`_finish`).  Refused or
    provably failed: only tried.

    Rare (a killed run), so this reads every event since that start, parsed."""
    digest = text_digest(entry.text)
    try:
        host = targets.parse(entry.target, ctx.fleet).host
    except DroverError:
        return False, []  # a target that names nothing was never sent to
    events = ctx.truth.recent(since)
    ids: set[Any] = set()
    after = False
    for ev in events:
        if not after:
            after = ev["event"] == EVENT and ev.get("attempt") == attempt and ev.get("phase") == "start"
            continue
        if ev["event"] == EVENT:
            break
        if ev["event"] == "spawn_requested" and entry.create_if_missing:
            return True, []  # it started a session, whose brief (the text, after a snapshot) may have gone: never twice
        if ev["event"] == "accepted" and ev.get("text_sha256") == digest and ev.get("host") == host:
            ids.add(ev["id"])
    if not after:
        return True, []  # the start itself is not where it was a moment ago: assume the worst, never send twice
    fates: dict[Any, bool] = {}
    for ev in events:
        if ev["event"] == "outcome" and ev["id"] in ids:
            reached = ev["outcome"] in SENT or bool(ev.get("indeterminate")) or bool(ev.get("pasted"))
            fates[ev["id"]] = fates.get(ev["id"], False) or reached
    pending = sorted(str(i) for i in ids if i not in fates)
    return any(fates.get(i, True) for i in ids), pending


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def plan(ctx: Context, entries: list[NudgeEntry], now: float) -> tuple[list[dict[str, Any]], list[Any]]:
    """Each entry with whether it is due now, and why (or why not)."""
    rows, warnings, _found = _plan(ctx, entries, now)
    return rows, warnings


def _plan(
    ctx: Context, entries: list[NudgeEntry], now: float
) -> tuple[list[dict[str, Any]], list[Any], dict[str, dict[str, Any]]]:
    horizon = max(max(duration_s(e.every), duration_s(e.retry)) for e in entries)
    history, warnings = _history(ctx, {e.key: e for e in entries}, horizon, now)
    local = time.localtime(now)
    minute = local.tm_hour * 60 + local.tm_min
    rows = []
    for entry in entries:
        every, retry = duration_s(entry.every), duration_s(entry.retry)
        seen = history.get(entry.key, {})
        row: dict[str, Any] = {"entry": entry.key, "target": entry.target, "every": entry.every, "due": False}
        if "sent" in seen:
            row["last_sent"] = now_iso(seen["sent"])
        sent, tried = seen.get("sent"), seen.get("tried")
        if entry.quiet_hours and in_quiet(minute, quiet_minutes(entry.quiet_hours)):
            row["why"] = f"quiet hours ({entry.quiet_hours}, local time)"
        elif seen.get("pending"):
            left = row["pending"] = seen["pending"][0][1]
            row["why"] = (
                f"{left} was left unfinished by a run killed mid-send: `nudge run` finishes it as `drover retry` does "
                "(it looks in the receiver's record first: never twice)"
            )
        elif sent is not None and now - sent < every - _slack(every):
            row["why"] = f"sent {_ago(now - sent)} ago; every {entry.every}"
            row["next"] = now_iso(sent + every - _slack(every))
        elif tried is not None and now - tried < retry - _slack(retry):
            row["why"] = f"tried {_ago(now - tried)} ago without delivering; retry {entry.retry}"
            row["next"] = now_iso(tried + retry - _slack(retry))
        else:
            row["due"] = True
            last = f"not sent in the last {entry.every}" if sent is None else f"sent {_ago(now - sent)} ago"
            row["why"] = last if sent is None else f"{last}; every {entry.every}"
        rows.append(row)
    return rows, warnings, history


def _event(key: str, phase: str, attempt: str, **fields: Any) -> dict[str, Any]:
    ts = time.time()
    return {"v": 1, "event": EVENT, "time": now_iso(ts), "ts": ts, "entry": key, "phase": phase, "attempt": attempt, **fields}


async def _send_entry(ctx: Context, entry: NudgeEntry, row: dict[str, Any]) -> None:
    attempt = secrets.token_hex(6)
    ctx.truth.append(_event(entry.key, "start", attempt, target=entry.target))  # write-ahead: never sent twice
    try:
        t = targets.parse(entry.target, ctx.fleet)
        req = NudgeRequest(
            host=t.host,
            id=t.id,
            text=entry.text,
            actor=entry.actor,
            via=entry.via,
            create_if_missing=entry.create_if_missing,
            engine=entry.engine,
            cwd=entry.cwd,
        )
        res = await nudge(ctx, req)
        data = dict(res.data or {})
        exit_code = res.exit_code
    except DroverError as exc:
        data = {"outcome": P.FAILED, "code": exc.code, "detail": exc.line()}
        exit_code = int(exc.exit_code)
    outcome = data.get("outcome")
    sent = outcome in SENT or bool(data.get("indeterminate")) or bool(data.get("pasted"))
    done = {"msg": data.get("id"), "outcome": outcome, "code": data.get("code"), "sent": sent}
    ctx.truth.append(_event(entry.key, "done", attempt, **done))
    row.update(id=data.get("id"), outcome=outcome, code=data.get("code"), detail=data.get("detail"), sent=sent)
    if data.get("warnings"):  # a noisy login shell on the target's host: cron mails it, naming the host
        row["warnings"] = data["warnings"]
    row["exit_code"] = exit_code


async def _finish(ctx: Context, entry: NudgeEntry, row: dict[str, Any], pending: list[tuple[str, str]]) -> None:
    """Finish the messages a killed run left with no outcome, through `drover retry`'s own op: it looks for each
    in the record and in the receiver's own record before it delivers, and holds the message's lock, so a message
    that did arrive is recorded as such and none is sent twice.  Each finished one gets its run's `done`; one the
    session cannot take yet (busy) stays pending for the next run."""
    for attempt, msg_id in pending:
        try:
            res = await messages_retry(ctx, RetryRequest(id=msg_id))
            data, exit_code = dict(res.data or {}), res.exit_code
        except DroverError as exc:
            row.update(id=msg_id, outcome=P.FAILED, code=exc.code, detail=exc.line(), sent=False, exit_code=int(exc.exit_code))
            if isinstance(exc, TargetError):
                # Its session is gone: nothing left to finish.  Done, not sent: the entry's own refusals (not live)
                # take it from here at `retry`; the message stays pending in the record for `drover retry`.
                done = {"msg": msg_id, "outcome": P.FAILED, "code": exc.code, "sent": False, "finished": True}
                ctx.truth.append(_event(entry.key, "done", attempt, **done))
            continue  # else its host unreachable, say: still pending, tried again by the next run
        outcome, code = data.get("outcome"), data.get("code")
        row.update(id=msg_id, outcome=outcome, code=code, detail=data.get("detail"), exit_code=exit_code)
        if code == P.BUSY:
            row["sent"] = False  # the session is mid-turn (or someone is retrying it right now): left for later
            row["exit_code"] = ExitCode.OK  # the nudge's kind of refusal: tried again, never a failure
            continue
        # Cannot be verified: it may have arrived, so it counts as sent, as a run that died always did.
        sent = outcome in SENT or bool(data.get("indeterminate")) or bool(data.get("pasted")) or code == P.CANNOT_VERIFY
        row["sent"] = sent
        done = {"msg": msg_id, "outcome": outcome, "code": code, "sent": sent, "finished": True}
        ctx.truth.append(_event(entry.key, "done", attempt, **done))


@asynccontextmanager
async def run_lock(ctx: Context, wait_s: float) -> AsyncIterator[tuple[bool, str]]:
    """The schedule's lock, across processes: (held, who holds it).  Waits up to wait_s for another run."""
    with ctx.truth.locked():
        pass  # the home, created and checked like any write to the record
    # In the checked locks/ folder, as a message's lock: a planted link or a foreign folder is refused (exit 7).
    fd = ctx.truth.open_lock("nudge-run.lock")
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    held = False
                    break
                await asyncio.sleep(0.1)
        if held:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} since {now_iso()}\n".encode(), 0)
            holder = ""
        else:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
        yield held, holder
    finally:
        os.close(fd)  # closing releases the lock


@op("nudge.run", RunRequest, "send the fleet's [[nudge]] entries that are due, through the nudge's refusals", "drover nudge run")
async def nudge_run(ctx: Context, req: RunRequest) -> Result:
    fleet = ctx.fleet
    if ctx.fleet_file is None:
        # Loud, not an empty run: a crontab without DROVER_FLEET would otherwise do nothing, silently, every minute.
        raise ConfigError(
            f"no fleet file at {find_path()[0]}, so there are no [[nudge]] entries to run",
            hint="under cron, set DROVER_FLEET=/path/to/fleet.toml in the crontab (cron gives a job only HOME, LOGNAME, "
            "PATH and SHELL)",
        )
    where = str(ctx.fleet_file)
    entries = list(fleet.nudge)
    if req.entries:
        known = {e.key for e in entries}
        unknown = [name for name in req.entries if name not in known]
        if unknown:
            raise InvalidRequest(
                f"no [[nudge]] entry {unknown[0]!r} in {where}",
                hint=f"entries: {', '.join(sorted(known)) or 'none'} (an entry is named by name, else its target)",
            )
        entries = [e for e in entries if e.key in req.entries]
    data: dict[str, Any] = {"fleet": where, "dry_run": req.dry_run, "entries": [], "due": 0, "sent": 0}
    if not entries:
        return Result(data)
    if req.dry_run:
        rows, warnings = plan(ctx, entries, time.time())
        data.update(entries=rows, due=sum(r["due"] for r in rows), warnings=warnings)
        return Result(data)
    async with run_lock(ctx, req.lock_wait_s) as (held, holder):
        if not held:
            why = (
                f"another drover nudge run still holds the schedule's lock ({holder or 'no pid recorded'}) after "
                f"{req.lock_wait_s:g}s: this run sent nothing; the next one picks up what is due"
            )
            data["locked"] = True
            return Result(data, [{"code": P.NUDGE_RUN_LOCKED, "message": why}], ExitCode.REFUSED)
        rows, warnings, history = _plan(ctx, entries, time.time())
        by_key = {e.key: e for e in entries}
        for row in rows:
            if row.get("pending"):
                await _finish(ctx, by_key[row["entry"]], row, history.get(row["entry"], {}).get("pending", []))
            elif row["due"]:
                await _send_entry(ctx, by_key[row["entry"]], row)
    data.update(entries=rows, due=sum(r["due"] for r in rows), sent=sum(bool(r.get("sent")) for r in rows), warnings=warnings)
    # Refusals are the nudge doing its job (recorded, tried again at `retry`); a failure to reach a host is not.
    failed = [r for r in rows if r.get("outcome") == P.FAILED or r.get("exit_code") == ExitCode.TARGET]
    errors = [{"code": r.get("code") or P.FAILED, "message": f"{r['entry']}: {r.get('detail')}"} for r in failed]
    if not failed:
        return Result(data, errors)
    tried = sum(bool(r["due"] or (r.get("pending") and r.get("outcome"))) for r in rows)  # sent or finished
    if len(failed) == tried:
        return Result(data, errors, int(failed[0].get("exit_code") or ExitCode.FAILED))
    return Result(data, errors, ExitCode.PARTIAL)
