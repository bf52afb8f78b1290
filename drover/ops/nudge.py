"""sessions.nudge and nudge.run: deliver a message only when it is safe -- once, or on the fleet's schedule.

A nudge is a message with three refusals in front of it (the nudger's `checkSafe`, whose reasons carry over):

- `not_live`: no live agent answers to the name -- the pane is gone or dead, or its agent exited and left a shell.
  Nudging it would mean starting an agent, and a nudge never does that.  The dispatcher's opposite,
  `--create-if-missing`, starts one (drover/ops/spawn.py) and then delivers.
- `generating`: the session is live but busy with a turn.  A nudge is "when you have a moment", never a message
  that queues up behind work in progress; a schedule tries again at the entry's `retry`.
- `shared_cwd`: another live session on the host works in the same directory.  A nudge is about the work in that
  directory, and with two agents in it, it could land in the one that is not doing that work.

Each refusal is a message record of its own -- the `accepted` event and the `refused` outcome with its code, in one
write -- so `drover log` shows why a nudge did not go.  A go-ahead is an ordinary `sessions_message` (write-ahead
record, limits, guard, verification), pinned to the very session that was checked.

The race: the state is read, then the send resolves the session again and delivers.  A session that starts a turn
in between is caught by the tmux guard's own look right before the paste, but an engine that queues typed input
(Claude Code, Codex, the demo agent) then gets the message queued behind that turn instead of refused; the result
says so (`raced`).  The window is one request to the host plus the accepted event's write.

Schedules: `[[nudge]]` entries in fleet.toml (drover/fleet.py `NudgeEntry`).  `nudge.run` sends the entries that
are due.  What each one did is a `nudge_run` event in the truth file -- `start` before its send (write-ahead), `done`
after it -- keyed by the entry's name, else its target as written.  Only a send that may have reached the session
(delivered, queued, held, uncertain, or a run that died mid-send after its accepted event) counts for `every`; any other
attempt counts for `retry` only, so a session that is busy at 09:00 is tried again at 09:01, not at 10:00.  Runs take
a lock for the whole decide-and-send, so two overlapping runs never send one entry twice: the second waits (bounded),
then reads the first's record and finds nothing due.
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
from typing import Any, Literal

from pydantic import Field

from drover import targets
from drover.errors import OUTCOME_EXIT, ConfigError, DroverError, EmptyText, ExitCode, InvalidRequest, TargetError
from drover.fleet import LOCAL, NudgeEntry, duration_s, find_path, quiet_minutes
from drover.ops.core import Context, Request, Result, op
from drover.ops.send import MessageRequest, sessions_message
from drover.ops.sessions import call_host
from drover.record import ReadStats, now_iso
from drover.remote import protocol as P
from drover.truth import text_digest
from drover.truth_query import ORDER_SLACK_S

Lane = Literal["auto", "inbox", "tmux"]


class NudgeRequest(Request):
    host: str = Field(LOCAL, description="the host the session is on")
    id: str = Field(..., description="pane id (%3), session:window.pane, or a unique name or prefix")
    text: str = Field(..., description="the message")
    actor: str | None = Field(None, description="who is sending (default: $DROVER_ACTOR, else user@host)")
    via: Lane = Field("auto", description="the lane: auto picks the best one the session has")
    create_if_missing: bool = Field(False, description="not live: start it (engine, cwd), then deliver")
    engine: str | None = Field(None, description="with create_if_missing: the engine a new session runs")
    cwd: str | None = Field(None, description="with create_if_missing: the directory a new session starts in")
    name: str | None = Field(None, description="with create_if_missing: the new session's name (default: id)")


class RunRequest(Request):
    dry_run: bool = Field(False, description="say what is due, send nothing")
    entries: list[str] | None = Field(None, description="only these entries (by name, else target as written)")
    lock_wait_s: float = Field(50.0, ge=0, le=3600, description="wait this long for another run to finish, then give up")


# -- one nudge ---------------------------------------------------------------------------------------------------


def _refusal(code: str, detail: str, session: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"outcome": P.REFUSED, "lane": None, "code": code, "detail": detail}
    if session is not None:
        out["session"] = {k: session[k] for k in ("id", "server", "name", "engine", "cwd", "state") if k in session}
    return out


def _failure(exc: DroverError) -> dict[str, Any]:
    """Nothing was sent (the look failed): provably not delivered, never indeterminate."""
    return {
        "outcome": P.FAILED,
        "lane": None,
        "code": exc.code,
        "detail": exc.message + (f" ({exc.hint})" if exc.hint else ""),
        "error_class": "target" if isinstance(exc, TargetError) else None,
    }


def _exit(outcome: dict[str, Any]) -> int:
    if outcome.get("error_class") == "target":
        return ExitCode.TARGET
    return int(OUTCOME_EXIT.get(outcome.get("outcome", P.FAILED), ExitCode.FAILED))


def _is_record(session: dict[str, Any]) -> bool:
    """A live Claude Code session from its registry (its process is alive), as opposed to a tmux pane."""
    return "former_names" in session


def _pin(session: dict[str, Any]) -> str:
    """The name that resolves to exactly this session (as drover/remote/discovery.pin makes it)."""
    return str(session["id"]) if _is_record(session) else f"{session['server']}/{session['id']}"


def _live(session: dict[str, Any]) -> bool:
    """A live agent session: a Claude registry record, or a pane that runs an agent and has not died."""
    return _is_record(session) or (session.get("engine") not in (None, "shell") and not session.get("dead"))


def _place(cwd: Any) -> str | None:
    if not isinstance(cwd, str) or not cwd.strip():
        return None
    return os.path.normpath(cwd)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("id") == b.get("id") and a.get("server") == b.get("server")


async def look(ctx: Context, host: str, target: str) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(session, None) when it is safe to nudge; (session or None, the refusal or failure outcome) when not.

    The listing comes first and the target's state last, so the state is as fresh as it can be when the send
    starts.  Only the other sessions' directories and liveness are needed from the listing (no screens read)."""
    try:
        listing = await call_host(ctx, host, "list", {"state": False})
        session = (await call_host(ctx, host, "status", {"target": target, "tail": 0}))["session"]
    except DroverError as exc:
        if exc.code == P.SESSION_NOT_FOUND:
            why = f"no session {target!r} on {host}: a nudge never starts one (--create-if-missing does)"
            return None, _refusal(P.NOT_LIVE, why)
        return None, _failure(exc)
    name = f"{host}:{session.get('name') or target}"
    if session.get("state") == "gone" or session.get("dead"):
        return session, _refusal(P.NOT_LIVE, f"{name} is not live: {session.get('reason') or 'its pane is dead'}", session)
    if not _live(session):
        why = (
            f"{name} runs no agent ({session.get('command') or 'a shell'}): its agent has exited, and a nudge never "
            "starts one (--create-if-missing does)"
        )
        return session, _refusal(P.NOT_LIVE, why, session)
    if session.get("state") == "busy":
        why = f"{name} is generating ({session.get('reason') or 'busy'}): a nudge waits until it is idle"
        return session, _refusal(P.GENERATING, why, session)
    here = _place(session.get("cwd"))
    if here is not None:
        others = [s for s in listing.get("sessions", []) if not _same(s, session) and _live(s) and _place(s.get("cwd")) == here]
        if others:
            names = ", ".join(f"{s.get('name')} ({s.get('engine')} {s.get('id')})" for s in others[:5])
            why = (
                f"{name} shares its directory {here} with {len(others)} other live session(s) on {host}: {names}; "
                "the nudge could land in the one not doing that work"
            )
            refusal = _refusal(P.SHARED_CWD, why, session)
            refusal["sharing"] = [{k: s.get(k) for k in ("id", "server", "name", "engine")} for s in others]
            return session, refusal
    return session, None


def _decided(ctx: Context, base: dict[str, Any], text: str, outcome: dict[str, Any]) -> Result:
    """A nudge that did not go: recorded as a message (accepted + outcome, one write) with its reason."""
    recorded = {k: v for k, v in outcome.items() if k != "error_class"}
    msg_id, _ = ctx.truth.accept(
        actor=base["actor"],
        host=base["host"],
        target=base["target"],
        text=text,
        options={"nudge": True},
        max_stored_chars=ctx.fleet.limits.max_chars,
        check=lambda _recent: recorded,
    )
    data = {"id": msg_id, **base, **recorded}
    exit_code = _exit(outcome)
    errors = [{"code": outcome.get("code") or outcome["outcome"], "message": outcome.get("detail", ""), "host": base["host"]}]
    return Result(data, errors, exit_code)


NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}\Z")  # what drover spawn takes as a name


async def _occupied(ctx: Context, req: NudgeRequest) -> dict[str, Any] | None:
    """--create-if-missing into a directory another live session already works in: the new session would make
    every later nudge to either of them a `shared_cwd` refusal.  Refused before anything starts.  (Only an
    absolute --cwd is compared: `~/…` is expanded on the host, by spawn.)"""
    here = _place(req.cwd) if req.cwd and req.cwd.startswith("/") else None
    if here is None:
        return None
    listing = await call_host(ctx, req.host, "list", {"state": False})
    others = [s for s in listing.get("sessions", []) if _live(s) and _place(s.get("cwd")) == here]
    if not others:
        return None
    names = ", ".join(f"{s.get('name')} ({s.get('engine')} {s.get('id')})" for s in others[:5])
    why = (
        f"{req.host}:{req.id} is not live, and starting it in {here} would put it beside {names}: every nudge to "
        "either would then be refused (shared_cwd); nudge that session, or start this one in a directory of its own"
    )
    refusal = _refusal(P.SHARED_CWD, why)
    refusal["sharing"] = [{k: s.get(k) for k in ("id", "server", "name", "engine")} for s in others]
    return refusal


async def _create(ctx: Context, req: NudgeRequest, actor: str, base: dict[str, Any]) -> Result:
    """--create-if-missing, the session not being live: spawn it with the nudge's text as its brief.  drover spawn
    delivers the brief through sessions_message once the session is ready (recorded as `spawn_briefed`)."""
    from drover.ops.spawn import spawn_session

    name = req.name or (req.id if NAME.match(req.id) else None)
    assert req.engine and req.cwd  # checked by nudge()
    spawned = await spawn_session(ctx, host=req.host, engine=req.engine, cwd=req.cwd, name=name, brief=req.text, actor=actor)
    brief = dict(spawned.get("brief") or {})
    data = {**base, **brief, "spawned": {k: v for k, v in spawned.items() if k != "brief"}}
    if spawned.get("state") != "ready":
        where = f"{req.host}:{spawned.get('name')}"
        data.update(
            outcome=P.HELD,
            detail=f"started {where}, but it stopped at a dialog ({spawned.get('reason')}): "
            "drover never answers one, so the nudge was not delivered",
        )
        return Result(data, [{"code": P.HELD, "message": data["detail"], "host": req.host}], ExitCode.HELD)
    exit_code = _exit(brief)
    errors = []
    if exit_code != ExitCode.OK:
        errors.append({"code": brief.get("code") or brief.get("outcome"), "message": brief.get("detail", ""), "host": req.host})
    return Result(data, errors, exit_code)


async def nudge(ctx: Context, req: NudgeRequest) -> Result:
    """One nudge: look, then refuse (recorded) or deliver through sessions_message."""
    if not req.text.strip():
        raise EmptyText("the message text is empty", hint="give the text as an argument, or - to read it from stdin")
    if req.create_if_missing and not (req.engine and req.cwd):
        raise InvalidRequest(
            "--create-if-missing needs --engine and --cwd: what to start, and where, if the session is not live",
            hint="e.g. drover nudge box-a:webapp 'status?' --create-if-missing --engine claude --cwd ~/webapp",
        )
    if req.create_if_missing and not req.name and not NAME.match(req.id):
        raise InvalidRequest(
            f"--create-if-missing needs --name here: {req.id!r} cannot name a new session, so the next nudge to it "
            "would not find the one this starts (and would start another)",
            hint="e.g. --name webapp; then nudge HOST:webapp",
        )
    actor = ctx.who(req.actor)
    base: dict[str, Any] = {"host": req.host, "target": req.id, "actor": actor, "nudge": True}
    # The session the name means, as a send finds it: the live one that bears it, else (a name that handed its
    # work over) the newest live generation of its chain -- never a stranger that the name merely prefixes.
    from drover.ops.handoff import address

    where = await address(ctx, req.host, req.id)
    session: dict[str, Any] | None
    refusal: dict[str, Any] | None
    if where.error is not None:
        if where.error.code in (P.SESSION_NOT_FOUND, P.HANDOFF_BROKEN):
            why = where.error.message if where.error.code == P.HANDOFF_BROKEN else f"no session {req.id!r} on {req.host}"
            why += ": a nudge never starts one (--create-if-missing does)"
            session, refusal = None, _refusal(P.NOT_LIVE, why)
        else:
            session, refusal = None, _failure(where.error)
    else:
        assert where.answer is not None
        base["host"] = where.host
        session, refusal = await look(ctx, where.host, where.answer["pin"])
    if refusal is not None and refusal.get("code") == P.NOT_LIVE and req.create_if_missing:
        if (occupied := await _occupied(ctx, req)) is not None:
            return _decided(ctx, base, req.text, occupied)
        return await _create(ctx, req, actor, base)
    if refusal is not None:
        return _decided(ctx, base, req.text, refusal)
    assert session is not None
    tags: dict[str, Any] = {"nudge": True, "addressed": f"{req.host}:{req.id}", **where.redirect}
    tags.pop("handoff_chain", None)
    message = MessageRequest(host=where.host, id=_pin(session), text=req.text, actor=actor, via=req.via)
    sent = await sessions_message(ctx, message, tags=tags)
    data = dict(sent.data or {})
    data["nudge"] = True
    data["addressed"] = req.id  # what the caller typed; `target` is the session that was checked, pinned
    if where.redirect:
        data.update(where.redirect)
    data["checked"] = {"state": session.get("state"), "cwd": session.get("cwd")}
    if data.get("outcome") == P.QUEUED and session.get("state") == "idle":
        data["raced"] = True
        data["detail"] = (
            f"{data.get('detail', '')} (it was idle when the nudge looked and started a turn before the paste: "
            "queued behind it, not interrupting)"
        )
    return Result(data, sent.errors, sent.exit_code)


@op(
    "sessions.nudge",
    NudgeRequest,
    "deliver only if safe: refuse a session that is not live, is generating, or shares its directory",
    "drover nudge",
)
async def sessions_nudge(ctx: Context, req: NudgeRequest) -> Result:
    return await nudge(ctx, req)


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
) -> tuple[dict[str, dict[str, float]], list[Any]]:
    """Per entry key: when it was last sent (`sent`) and last tried (`tried`), within the horizon.

    Read backwards from the end of the truth file, stopping at the horizon: what happened before it cannot make an
    entry not due.  A `start` with no `done` is a run that died mid-send: see `_orphan_sent`."""
    stop = now - horizon_s - ORDER_SLACK_S

    def skip(raw: bytes) -> bool:
        # Only nudge_run lines are wanted, and one old line to stop at: the others are passed over unparsed.
        if b'"nudge_run"' in raw:
            return False
        ts = TS.search(raw)
        return ts is None or float(ts.group(1)) >= stop

    stats = ReadStats(str(ctx.truth.path))
    found: dict[str, dict[str, float]] = {}
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
        if ts > seen.get("sent", float("-inf")) and _orphan_sent(ctx, entries[key], ts, attempt):
            seen["sent"] = ts
    return found, stats.warnings()


def _orphan_sent(ctx: Context, entry: NudgeEntry, since: float, attempt: Any) -> bool:
    """Did the send of a run that died after its `start` get anywhere?  Runs hold the lock, so the events between
    that start and the next nudge_run event are the dead run's: an accepted event with the entry's text there is its
    message.  None: it died before its accepted event, nothing was sent.  One with no outcome yet, or one that may
    have reached the session: it counts as sent (never twice).  Refused or provably failed: only tried.

    Rare (a killed run), so this reads every event since that start, parsed."""
    digest = text_digest(entry.text)
    try:
        host = targets.parse(entry.target, ctx.fleet).host
    except DroverError:
        return False  # a target that names nothing was never sent to
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
            return True  # it started a session, whose brief (the text, after a snapshot) may have gone: never twice
        if ev["event"] == "accepted" and ev.get("text_sha256") == digest and ev.get("host") == host:
            ids.add(ev["id"])
    if not after:
        return True  # the start itself is not where it was a moment ago: assume the worst, never send twice
    fates: dict[Any, bool] = {}
    for ev in events:
        if ev["event"] == "outcome" and ev["id"] in ids:
            reached = ev["outcome"] in SENT or bool(ev.get("indeterminate")) or bool(ev.get("pasted"))
            fates[ev["id"]] = fates.get(ev["id"], False) or reached
    return any(fates.get(i, True) for i in ids)


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def plan(ctx: Context, entries: list[NudgeEntry], now: float) -> tuple[list[dict[str, Any]], list[Any]]:
    """Each entry with whether it is due now, and why (or why not)."""
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
    return rows, warnings


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
    row["exit_code"] = exit_code


@asynccontextmanager
async def run_lock(ctx: Context, wait_s: float) -> AsyncIterator[tuple[bool, str]]:
    """The schedule's lock, across processes: (held, who holds it).  Waits up to wait_s for another run."""
    with ctx.truth.locked():
        pass  # the home, created and checked like any write to the record
    folder = ctx.truth.home / "locks"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(folder / "nudge-run.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise DroverError(f"cannot open the nudge schedule's lock in {folder}: {exc.strerror}") from None
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
        rows, warnings = plan(ctx, entries, time.time())
        by_key = {e.key: e for e in entries}
        for row in rows:
            if row["due"]:
                await _send_entry(ctx, by_key[row["entry"]], row)
    data.update(entries=rows, due=sum(r["due"] for r in rows), sent=sum(bool(r.get("sent")) for r in rows), warnings=warnings)
    # Refusals are the nudge doing its job (recorded, tried again at `retry`); a failure to reach a host is not.
    failed = [r for r in rows if r.get("outcome") == P.FAILED or r.get("exit_code") == ExitCode.TARGET]
    errors = [{"code": r.get("code") or P.FAILED, "message": f"{r['entry']}: {r.get('detail')}"} for r in failed]
    if not failed:
        return Result(data, errors)
    if len(failed) == data["due"]:
        return Result(data, errors, int(failed[0].get("exit_code") or ExitCode.FAILED))
    return Result(data, errors, ExitCode.PARTIAL)
