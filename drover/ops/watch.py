"""watch.run: no silent stops.  A session drover spawned that is gone without a terminal signal is recorded
`exited` once, with evidence, and its parent is told; a message left queued in a session that died is resolved.

One run: read the record (the spawns, the terminal lifecycle events, the watch's own notices), ask each host that
has something to check ONE `list` (with each session's identity), then for each spawned session that is not live
there by its identity -- a name or a pane another session took since is not the worker -- write `exited` with
`record_once` keyed `exited:SPAWN` (and moot if a `done`/`failed`/`exited` about it is in the record by then,
looked for under the same lock).  A host that does not answer is never taken for dead: the run says so and
records nothing about its sessions.

The parent is told when the spawn record names a parent session (`parent["session"]`: older records name only
the actor, who reads the `exited` event with `drover events`): an ordinary recorded message, tagged
`watch_notice` = the spawn id.  A run killed before the notice went is finished by the next: a notice with no
outcome, or an uncertain one, goes through `messages.retry` (never twice); a provably failed one is sent again,
at most NOTICE_ATTEMPTS times.  Runs take one lock for the whole look-and-write, so two at once tell one story.

Said once, and a worker's own report finished: a notice settled with no message of its own (the parent's place is
another session's now) is a `watch_tried` event, so later runs say nothing; a dead worker's `drover done` report
left cut off is finished through `messages.retry` (drover/ops/watch_tries.py).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from typing import Any

from pydantic import Field

from drover import lifecycle
from drover.errors import DroverError, ExitCode
from drover.ops import exited, sightings
from drover.ops.core import Context, Request, Result, op
from drover.ops.done import INDENT
from drover.ops.hosts import call_host, fan_out_each
from drover.ops.live_state import own_record
from drover.ops.spawn import fold
from drover.ops.watch_tries import NOTICE_ATTEMPTS, Seen, cut_off_reports, finish_report, tried
from drover.record import now_iso
from drover.remote import protocol as P
from drover.remote.faults import fault

NOTICE = "watch_notice"
LIVE_STATES = ("ready", "waiting")  # spawned sessions: up, or stopped at a dialog (a person may answer it)
NEEDLES = (
    b'"spawn',
    b'"event":"done"',
    b'"event":"failed"',
    b'"event":"exited"',
    b'"watch_notice"',
    b'"terminal"',
    b'"watch_tried"',
)
SEEN_FILE = sightings.SEEN_FILE  # beside the record: when each watched session was last seen live (not the record)


class WatchRequest(Request):
    hosts: list[str] | None = Field(None, description="only sessions on these hosts (names as in the record)")
    actor: str | None = Field(None, description="who the parents' notices are from (default: $DROVER_ACTOR, else user@host)")
    lock_wait_s: float = Field(50.0, ge=0, le=3600, description="wait this long for another run to finish, then give up")


# -- the record -------------------------------------------------------------------------------------------------


def _read(ctx: Context) -> tuple[list[dict[str, Any]], dict[str, float], list[dict[str, Any]], dict[str, list[str]], Seen]:
    """(spawns, each spawn's request time, terminal lifecycle events, notice message ids per spawn, the rest) from
    one backward pass over the record (lines with none of the words are passed over unparsed)."""
    found: list[dict[str, Any]] = []
    for ev in ctx.truth.backward(skip=lambda raw: not any(n in raw for n in NEEDLES)):
        found.append(ev)
    found.reverse()
    requested = {
        ev["id"]: float(ev["ts"]) for ev in found if ev.get("event") == "spawn_requested" and isinstance(ev.get("id"), str)
    }
    terminal = [ev for ev in found if ev.get("event") in lifecycle.TERMINAL]
    notices: dict[str, list[str]] = {}
    for ev in found:
        tag = (ev.get("options") or {}).get(NOTICE) if ev.get("event") == "accepted" else None
        if isinstance(tag, str):
            notices.setdefault(tag, []).append(ev["id"])
    return fold(found), requested, terminal, notices, Seen(found)


def _about(ev: dict[str, Any], row: dict[str, Any]) -> bool:
    """Is this lifecycle event about the spawned session: by its spawn id or its identity, never its name."""
    if ev.get("spawn") == row["spawn_id"]:
        return True
    session = ev.get("session")
    if not isinstance(session, dict):
        return False
    return ev.get("host") == row.get("host") and bool(row.get("identity")) and session.get("identity") == row["identity"]


def _watched(spawns: list[dict[str, Any]], requested: dict[str, float], terminal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Spawned sessions with no terminal event about them since their spawn."""
    out = []
    for row in spawns:
        if row.get("state") not in LIVE_STATES or not row.get("identity"):
            continue
        since = requested.get(row["spawn_id"], 0.0)
        if any(_about(ev, row) and float(ev.get("ts") or 0) >= since - 1 for ev in terminal):
            continue
        out.append(row)
    return out


# -- live or gone -----------------------------------------------------------------------------------------------
# By identity.  A Claude session is also live while its process or its pane runs Claude: its identity comes from
# its registry record, and a listing taken while Claude rewrites that file shows the pane alone -- a live worker
# must never be reported dead (the cost of the doubt is one more run before its death is told).


def _live_keys(s: dict[str, Any]) -> set[str]:
    keys = {str(s["identity"])} if s.get("identity") else set()
    if s.get("engine") == "claude":
        pane = s.get("pane") or (s["id"] if str(s.get("id") or "").startswith("%") else None)
        if pane and s.get("server"):
            keys.add(f"pane:{s['server']}/{pane}")
        if s.get("engine_pid"):
            keys.add(f"pid:{s['engine_pid']}")
    return keys


def _spawn_live(row: dict[str, Any], live: set[str]) -> bool:
    if row["identity"] in live:
        return True
    return str(row["identity"]).startswith("claude:") and f"pane:{row.get('server')}/{row.get('pane')}" in live


def _message_live(identity: str, session: dict[str, Any] | None, live: set[str]) -> bool:
    if identity in live:
        return True
    pid = (session or {}).get("pid")
    return identity.startswith("claude:") and bool(pid) and f"pid:{pid}" in live


# -- sightings --------------------------------------------------------------------------------------------------


# Kept in drover/ops/sightings.py: `ls`, `status` and `spawns` refresh the same file when they see a worker live.
_load_seen = sightings.load
_save_seen = sightings.save


# -- one gone session -------------------------------------------------------------------------------------------


def _command(ctx: Context, row: dict[str, Any]) -> list[str]:
    """The spawn's command line as the fleet writes it (its transcript may be named there: the demo's --log)."""
    spec = ctx.fleet.spawn.get(str(row.get("engine")))
    if spec is None:
        return list(row.get("args") or [])
    import shlex

    try:
        words = shlex.split(spec.command.replace("{name}", str(row.get("name") or "")))
    except ValueError:
        words = []
    return words + list(row.get("args") or [])


async def _evidence(ctx: Context, row: dict[str, Any], seen: dict[str, float], spawned_ts: float) -> dict[str, Any]:
    sid = row["spawn_id"]
    last, source = (seen[sid], "watch") if sid in seen else (spawned_ts, "spawned")
    out: dict[str, Any] = {"last_seen": now_iso(last), "last_seen_source": source}
    identity = str(row.get("identity") or "")
    args = {
        "server": row.get("server"),
        "pane": row.get("pane"),
        "pid": identity.rpartition("@")[2] if identity.startswith("tmux:") else None,
        "engine": row.get("engine"),
        "session_id": row.get("id") if identity.startswith("claude:") else None,
        "command": _command(ctx, row),
    }
    try:
        words = await call_host(ctx, row["host"], "last_words", args)
    except DroverError as exc:
        out["why"] = [f"its host could not say more: {exc.message}"]
        return out
    out.update(tail=words.get("tail"), exit_status=words.get("exit_status"), exit_signal=words.get("exit_signal"))
    out["transcript"] = words.get("transcript")
    out["why"] = words.get("why") or []
    return out


def _how_it_ended(ev: dict[str, Any]) -> str:
    if ev.get("exit_signal"):
        return f"killed by signal {ev['exit_signal']}"
    return "exit status unknown" if ev.get("exit_status") is None else f"exit status {ev['exit_status']}"


def _indented(text: str) -> list[str]:
    """Every line of a quoted entry indented as `drover done`'s report indents a summary (any line break --
    CR, U+2028, a form feed -- starts an indented line), so nothing quoted reads as a line of drover's own."""
    return [INDENT + line for line in (text.splitlines() or [""])]


def _notice_text(ev: dict[str, Any]) -> str:
    s = ev.get("session") or {}
    lines = [
        f"drover watch: {s.get('name') or s.get('id')} ({s.get('engine')}) on {ev.get('host')}, which you spawned "
        f"(spawn {ev.get('spawn')}), exited without `drover done`.",
        f"last seen {ev.get('last_seen')} ({ev.get('last_seen_source')}); {_how_it_ended(ev)}",
    ]
    if ev.get("tail"):
        lines.append("its last lines:")
        lines += [q for line in ev["tail"][-8:] for q in _indented(str(line))]
    elif ev.get("transcript"):
        lines.append("its transcript's last entries:")
        for e in ev["transcript"][-5:]:
            lines += _indented(f"[{e.get('role')}] {str(e.get('text'))[:500]}")
    return "\n".join(lines)


async def _notify(ctx: Context, ev: dict[str, Any], notices: list[str], actor: str, seen: Seen) -> dict[str, Any] | None:
    """Tell the parent session about `ev`, or finish a notice a killed run left: the row, or None (nothing to do)."""
    from drover.ops.send import MessageRequest, RetryRequest, messages_retry, sessions_message

    parent = ev.get("notify")
    if not isinstance(parent, dict) or not parent.get("id"):
        return None
    key = f"notice:{ev.get('spawn')}"
    if key in seen.final:
        return None  # settled, and said so by the run that settled it
    row: dict[str, Any] = {"spawn": ev.get("spawn"), "parent": parent}
    sent = [hits[0] for hits in (ctx.truth.find(i)[0] for i in notices) if hits]
    if any(m.outcome in exited.SENT or m.verified for m in sent):
        return None  # told already
    last = sent[-1] if sent else None
    if last is not None and last.code == P.SESSION_EXITED:
        return None  # the parent died with the notice in it: the exited event stands for `drover events`
    if last is not None and (last.outcome is None or last.indeterminate or last.pasted):
        try:
            res = await messages_retry(ctx, RetryRequest(id=last.id))  # cut off mid-send: finished, never twice
        except DroverError as exc:
            row.update(id=last.id, outcome=P.FAILED, detail=exc.message, finished=True)
            return row
        row.update(id=last.id, outcome=(res.data or {}).get("outcome"), detail=(res.data or {}).get("detail"), finished=True)
        return row
    if len(sent) >= NOTICE_ATTEMPTS:
        return None  # given up: the exited event itself stands in the record for `drover events`
    host = str(parent.get("host") or "local")
    if parent.get("identity"):
        try:
            now = await call_host(ctx, host, "resolve", {"target": parent["id"]})
        except DroverError:
            now = None  # gone or unreachable: the send says which (and may follow its handoff)
        if now is not None and now.get("identity") != parent["identity"]:
            row.update(outcome=P.REFUSED, detail=f"{host}:{parent['id']} is another session now: the notice is not sent")
            tried(ctx, key, row, final=True)
            return row
    req = MessageRequest(host=host, id=str(parent["id"]), text=_notice_text(ev), actor=actor)
    res = await sessions_message(ctx, req, tags={NOTICE: ev.get("spawn")})
    data = res.data or {}
    row.update(id=data.get("id"), outcome=data.get("outcome"), detail=data.get("detail"))
    if row["outcome"] == P.FAILED and len(sent) + 1 >= NOTICE_ATTEMPTS:
        row["given_up"] = NOTICE_ATTEMPTS  # the last try: said now, and the record's failed notices say it after
    return row


# -- an end recorded on the worker's host ----------------------------------------------------------------------


def _pull(ctx: Context, host: str, row: dict[str, Any], theirs: dict[str, Any], since: float | None) -> dict[str, Any] | None:
    """Copy the host's `done`/`failed` about this spawned session into our record, once per that event (keyed by
    its id on its host).  The copy is stamped now (the record is in time order: readers stop at the first event
    older than what they look for); the worker's own time is in `pulled`.  The look for an earlier copy stops at
    the spawn's request (our clock: the host's may differ).  The row written now, or None."""
    kind = theirs.get("event")
    if kind not in ("done", "failed") or not theirs.get("id"):
        return None
    origin = {k: theirs.get(k) for k in ("id", "time", "ts", "record")} | {"host": host}
    ev = lifecycle.event(
        str(kind),
        host=host,
        session={**(theirs.get("session") or {}), **{k: row.get(k) for k in ("identity", "name", "pane", "server", "engine")}},
        spawn=row["spawn_id"],
        summary=theirs.get("summary"),
        evidence=theirs.get("evidence"),
        actor=theirs.get("actor"),
        report_to=theirs.get("report_to"),
        pulled=origin,
    )
    stood, wrote = lifecycle.record_once(ctx.truth, ev, f"pulled:{host}:{theirs['id']}", since_ts=since)
    if not wrote:
        return None
    return {k: stood.get(k) for k in ("id", "event", "host", "session", "spawn", "summary", "pulled")}


# -- the run ----------------------------------------------------------------------------------------------------


async def _lock(ctx: Context, wait_s: float) -> int | None:
    with ctx.truth.locked():
        pass  # the home, created and checked like any write to the record
    fd = ctx.truth.open_lock("watch-run.lock")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            await asyncio.sleep(0.1)


async def watch_once(ctx: Context, req: WatchRequest) -> Result:
    now = time.time()
    actor = ctx.who(req.actor)
    spawns, requested, terminal, notices, seen_in_record = _read(ctx)
    watched = _watched(spawns, requested, terminal)
    stuck = exited.stranded(ctx, now)
    if req.hosts:
        watched = [r for r in watched if r.get("host") in req.hosts]
        stuck = [m for m in stuck if m.host in req.hosts]
    reports = cut_off_reports(ctx, spawns, terminal, seen_in_record, now)
    if req.hosts:
        reports = [t for t in reports if t[0].get("host") in req.hosts]
    hosts = sorted({str(r["host"]) for r in watched} | {m.host for m in stuck} | {str(t[0]["host"]) for t in reports})
    data: dict[str, Any] = {
        "hosts": hosts,
        "watched": len(watched),
        "exited": [],
        "resolved": [],
        "notices": [],
        "unreachable": [],
    }
    errors: list[dict[str, Any]] = []
    live: dict[str, set[str]] = {}
    ends: dict[str, dict[str, Any]] = {}  # host: {identity: the newest done/failed in that host's own record}
    asking = {h: [str(r["identity"]) for r in watched if r.get("host") == h] for h in hosts}

    async def ask(host: str) -> Any:
        args: dict[str, Any] = {"state": False, "identities": True}
        if own_record(host) and asking.get(host):
            args["lifecycle_of"] = asking[host]  # the host's record, in the same request
        return await call_host(ctx, host, "list", args)

    for host, answer, err in await fan_out_each(ctx, hosts, ask) if hosts else []:
        if err is not None and err.code == P.UNKNOWN_HOST:
            # A host taken out of the fleet: its sessions cannot be asked about, and saying so every minute to
            # cron would bury the rest.  Listed in the document; nothing recorded about them.
            data.setdefault("not_in_fleet", []).append(host)
            continue
        if err is not None:
            # Never taken for dead: nothing is recorded about this host's sessions until it answers.
            data["unreachable"].append({"host": host, "code": err.code, "message": err.message})
            errors.append(
                {
                    "code": err.code,
                    "message": f"{host} did not answer ({err.message}): nothing recorded about its sessions",
                    "host": host,
                }
            )
            continue
        live[host] = {key for s in answer.get("sessions", []) if not s.get("dead") for key in _live_keys(s)}
        ends[host] = answer.get("lifecycle") or {}
    seen = _load_seen(ctx)
    for row in watched:
        host, sid = str(row["host"]), row["spawn_id"]
        if host not in live:
            continue
        theirs = ends.get(host, {}).get(str(row["identity"]))
        if theirs is not None and float(theirs.get("ts") or 0) >= requested.get(sid, 0.0) - 1:
            # It said it is done, on its host: that is its end, copied into our record once (so `events`, `spawns`
            # and later runs see it here), and never an `exited`, however it goes afterwards.
            copied = _pull(ctx, host, row, theirs, requested.get(sid))
            if copied is not None:
                data.setdefault("pulled", []).append(copied)
            seen.pop(sid, None)
            continue
        if _spawn_live(row, live[host]):
            seen[sid] = now
            continue
        evidence = await _evidence(ctx, row, seen, requested.get(sid, now))
        parent: dict[str, Any] = row["parent"] if isinstance(row.get("parent"), dict) else {}
        session = {**row, "id": row.get("id")}
        ev = lifecycle.event(
            "exited",
            host=host,
            session=session,
            spawn=sid,
            reason=f"its identity ({row['identity']}) is no longer live on {host}, and it gave no terminal signal",
            parent=parent or None,
            notify=parent.get("session") if isinstance(parent.get("session"), dict) else None,
            **evidence,
        )
        identity = str(row["identity"]).encode()

        def moot(old: dict[str, Any], r: dict[str, Any] = row) -> bool:
            return old.get("event") in lifecycle.TERMINAL and _about(old, r)

        stood, wrote = lifecycle.record_once(
            ctx.truth,
            ev,
            f"exited:{sid}",
            since_ts=requested.get(sid),
            stands=moot,
            needles=(identity, sid.encode()),
        )
        seen.pop(sid, None)
        if wrote:
            data["exited"].append(
                {k: stood.get(k) for k in ("id", "host", "session", "spawn", "last_seen", "exit_status", "exit_signal", "tail")}
            )
            if stood.get("event") == "exited" and isinstance(stood.get("notify"), dict):
                terminal.append(stood)
    _save_seen(ctx, {k: v for k, v in seen.items() if any(r["spawn_id"] == k for r in watched)})
    fault("watch_before_notice")
    for ev in terminal:
        if ev.get("event") != "exited" or not isinstance(ev.get("notify"), dict):
            continue
        if now - float(ev.get("ts") or now) > exited.HORIZON_S:
            continue
        told = await _notify(ctx, ev, notices.get(str(ev.get("spawn")), []), actor, seen_in_record)
        if told is not None:
            data["notices"].append(told)
    for row, ev, m in reports:
        if str(row["host"]) not in live or _spawn_live(row, live[str(row["host"])]):
            continue  # a live worker may still finish it itself (`drover done` again)
        data.setdefault("reports", []).append(await finish_report(ctx, row, ev, m, seen_in_record))
    for m in stuck:
        if m.host not in live or _message_live(m.options["identity"], m.session, live[m.host]):
            continue
        done = exited.resolve_gone(ctx, m, f"{m.host}:{m.target} exited ({m.options['identity']} is no longer live)")
        if done is not None:
            data["resolved"].append(done)
    exit_code = ExitCode.OK
    if data["unreachable"]:
        asked = len(hosts) - len(data.get("not_in_fleet", []))
        exit_code = ExitCode.PARTIAL if len(data["unreachable"]) < asked else ExitCode.FAILED
    return Result(data, errors, exit_code)


@op(
    "watch.run",
    WatchRequest,
    "record spawned sessions that exited without a terminal signal, tell their parents",
    "drover watch run",
)
async def watch_run(ctx: Context, req: WatchRequest) -> Result:
    fd = await _lock(ctx, req.lock_wait_s)
    if fd is None:
        why = f"another drover watch run still holds the watch's lock after {req.lock_wait_s:g}s: this run did nothing"
        return Result({"locked": True}, [{"code": P.BUSY, "message": why}], ExitCode.REFUSED)
    try:
        return await watch_once(ctx, req)
    finally:
        os.close(fd)
