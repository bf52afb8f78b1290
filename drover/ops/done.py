"""sessions.done: a delegate's terminal signal -- recorded about its own session, reported to its parent.

`drover done` runs inside the session that has finished (drover/self_session.py finds which, from the process
tree; `--session` may name it, and must then be that very session).  It writes a `done` (or `failed`) lifecycle
event once per session and spawn (drover/lifecycle.py), then delivers a terminal report to the session that
dispatched it -- the spawn's parent session, found in the record by this session's identity, or `--to` -- as an
ordinary recorded message (sessions_message), tagged `terminal` in its options.

Exactly one report.  The event's `once` key makes a second `drover done` find the first event; the report carries
the event's id (`lifecycle`) in its options, so the second run finds the first report too: one that reached its
receiver is not sent again, one cut off (killed, timed out, indeterminate) is finished by `drover retry`'s own
logic, which looks in the receiver's record before it sends anything.  Killed between the event and the report's
record, a second run sends the report the first never started.

The report's text starts `[drover done] NAME@HOST: SUMMARY`; every further line of the summary is indented, so a
summary can never put a line that reads as another report's first line into it.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

from pydantic import Field

from drover import lifecycle
from drover.errors import ExitCode, InvalidRequest, UsageError
from drover.fleet import LOCAL
from drover.ops.core import Context, Request, Result, op
from drover.ops.hosts import call_host
from drover.ops.send import MessageRequest, RetryRequest, messages_retry, sessions_message
from drover.remote import protocol as P
from drover.remote.faults import fault
from drover.self_session import SelfSession, find, machine_name
from drover.targets import parse

PREFIX = "[drover %s]"
INDENT = "  "


class DoneRequest(Request):
    summary: str | None = Field(None, description="what was done (or why it failed); the report's first line")
    evidence: list[str] | None = Field(None, description="what shows it: a commit, a test run, a file (one line each)")
    failed: bool = Field(False, description="the task could not be done: a `failed` event, a `[drover failed]` report")
    to: str | None = Field(None, description="HOST:ID of the session to report to (default: the spawn's parent session)")
    session: str | None = Field(None, description="HOST:ID of the session that is done: must be the one this runs in")
    actor: str | None = Field(None, description="who is reporting (default: $DROVER_ACTOR, else user@host)")


def report_text(kind: str, who: str, summary: str | None, evidence: list[str], reply_to: str) -> str:
    """The report: its first line `[drover KIND] WHO: SUMMARY`, every other line indented (no line break of any
    kind -- CR, U+2028, a form feed -- lets a summary start a line of its own)."""
    lines = (summary or "").splitlines() or [""]
    first = f"{PREFIX % kind} {who}: {lines[0].strip() or ('finished' if kind == 'done' else 'could not finish')}"
    rest = [INDENT + line for line in lines[1:]]
    for item in evidence:
        parts = item.splitlines() or [""]
        rest.append(f"{INDENT}evidence: {parts[0]}")
        rest += [INDENT * 2 + p for p in parts[1:]]
    rest.append(f"{INDENT}reply: drover send {reply_to} TEXT")
    return "\n".join([first, *rest])


def _own_spawn(ctx: Context, me: SelfSession) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the `spawned` event of this session, its `spawn_requested`), newest first: by identity, else by id on this
    machine's `local`."""
    spawned: dict[str, Any] | None = None
    for ev in ctx.truth.backward(skip=lambda raw: b'"spawn' not in raw):
        kind = ev.get("event")
        if spawned is None and kind == "spawned":
            same = ev.get("identity") == me.identity or (ev.get("host") == LOCAL and ev.get("session") == me.id)
            if same and ev.get("host") == LOCAL:
                spawned = ev
        elif spawned is not None and kind == "spawn_requested" and ev.get("id") == spawned.get("id"):
            return spawned, ev
    return spawned, None


def _report_of(ctx: Context, event_id: str) -> str | None:
    """The message id of the report already made for this lifecycle event, if one was accepted."""
    needle = event_id.encode()
    for ev in ctx.truth.backward(skip=lambda raw: needle not in raw):
        if ev.get("event") == "accepted" and (ev.get("options") or {}).get("lifecycle") == event_id:
            return str(ev["id"])
    return None


def _never_arrived(ctx: Context, msg_id: str) -> bool:
    """Is this earlier report provably not delivered: refused, dropped or failed, with nothing that may have
    reached the receiver (no paste, not indeterminate)?  Then a re-run sends a new one instead of finishing it."""
    hits, _count, _stats = ctx.truth.find(msg_id)
    m = hits[0] if hits else None
    if m is None or m.outcome not in (P.FAILED, P.REFUSED, P.DROPPED):
        return False
    return not (m.indeterminate or m.pasted or m.uncertain)


def _reply_to(me: SelfSession, parent: tuple[str, str]) -> str:
    """How the parent answers: `local:PIN` when it is on this machine; else this machine's name, which the parent's
    fleet must know it by (said, since drover cannot know what another machine's fleet calls this one)."""
    pin = me.address.partition(":")[2]
    if parent[0] == LOCAL:
        return f"local:{pin}"
    return f"{me.address} (as your fleet names machine {me.machine})"


async def _checked_session(ctx: Context, me: SelfSession | None, why: str, named: str | None) -> SelfSession:
    if named is None:
        if me is None:
            raise UsageError(
                f"drover done runs in no session drover can see: {why}",
                code=P.USAGE_ERROR,
                hint="run it from inside the session that finished (its pane, or a tool its agent runs); "
                "--session HOST:ID names that session, --to HOST:ID the one to report to, and both need drover to see "
                "this command run inside it (else report with `drover send HOST:ID TEXT`)",
            )
        return me
    target = parse(named, ctx.fleet)
    if target.host != LOCAL:
        raise InvalidRequest(
            f"--session {named} is on host {target.host}, and this command runs on this machine: a session can only "
            "say it is done itself",
            hint="run drover done inside that session, on its host",
        )
    answer = await call_host(ctx, LOCAL, "resolve", {"target": target.id})
    if me is None:
        raise InvalidRequest(
            f"--session {named} cannot be checked: {why}, so nothing shows this command runs inside it",
            hint="run drover done from inside that session (its pane, or a tool its agent runs)",
        )
    if answer.get("identity") != me.identity:
        raise InvalidRequest(
            f"--session {named} is not the session this command runs in ({me.host}:{me.id}, {me.name}): a session "
            "says only its own end",
            hint="drop --session, or run drover done inside that session",
        )
    return me


def _parent_of(ctx: Context, req: DoneRequest, requested: dict[str, Any] | None) -> tuple[str, str] | None:
    """(host, id) to report to: --to, else the spawn's parent session (on this machine: `local`)."""
    if req.to:
        head, sep, _rest = req.to.partition(":")
        if sep and head == machine_name() and head not in ctx.fleet.host_names():
            # Never a guess: a brief written on another machine of the same name (containers, a fleet of clones)
            # would have the report delivered to whatever session bears that id here.
            raise UsageError(
                f"--to {req.to}: {head!r} is this machine's own name, not a host of this machine's fleet: drover does "
                "not guess which machine it means",
                code=P.USAGE_ERROR,
                hint=f"a session on this machine is local:{_rest}; one on another machine is HOST:ID with HOST as "
                "this machine's fleet names that machine (`drover fleet show`)",
            )
        target = parse(req.to, ctx.fleet)
        return target.host, target.id
    parent = (requested or {}).get("parent")
    session = parent.get("session") if isinstance(parent, dict) else None
    if not isinstance(session, dict) or not session.get("id"):
        return None
    return str(session.get("host") or LOCAL), str(session.get("pin") or session["id"])


@op("sessions.done", DoneRequest, "a delegate's terminal signal: record done (or failed), report it to its parent", "drover done")
async def sessions_done(ctx: Context, req: DoneRequest) -> Result:
    kind = "failed" if req.failed else "done"
    mine, why = await find(ctx)
    me = await _checked_session(ctx, mine, why, req.session)
    actor = ctx.who(req.actor)
    spawned, requested = _own_spawn(ctx, me)
    spawn_id = str(spawned["id"]) if spawned else None
    evidence = [e for e in (req.evidence or []) if e.strip()]
    parent = _parent_of(ctx, req, requested)
    # Once per session and spawn (done or failed: one terminal signal); a session no spawn started, once per what
    # it says, so a long-lived session may end one task after another.
    key = f"done:{me.identity}:{spawn_id}"
    if spawn_id is None:
        said = "\0".join([kind, req.summary or "", *evidence])  # not --to: a re-run need not repeat it
        key += ":" + hashlib.sha256(said.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    ev = lifecycle.event(
        kind,
        host=LOCAL,
        session=me.spellings(),
        spawn=spawn_id,
        summary=req.summary,
        evidence=evidence or None,
        actor=actor,
        report_to=(f"{parent[0]}:{parent[1]}" if parent else None),
    )
    since = float(requested["ts"]) if requested and isinstance(requested.get("ts"), (int, float)) else None
    ev, written = lifecycle.record_once(ctx.truth, ev, key, since_ts=since)
    fault("after_done_recorded")
    if not written and not req.to and isinstance(ev.get("report_to"), str) and ":" in ev["report_to"]:
        # The end stands as first recorded, and so does where its report goes (a re-run need not repeat --to; a
        # re-run that gives one corrects a report that provably never arrived, below).
        host, _, ident = ev["report_to"].partition(":")
        parent = (host, ident)
    data: dict[str, Any] = {
        "event": ev["event"],
        "event_id": ev["id"],
        "recorded": written,
        "session": {"host": me.host, "machine": me.machine, "id": me.id, "name": me.name, "identity": me.identity},
        "spawn": spawn_id,
        "parent": {"host": parent[0], "id": parent[1]} if parent else None,
        "report": None,
    }
    if not written and ev["event"] != kind:
        data["detail"] = f"this session's end was recorded already as {ev['event']}: that stands"
    if parent is None:
        data["detail"] = (
            "recorded; no parent session is known (no spawn from inside a session started this one, and no --to): "
            "no report was sent"
        )
        return Result(data)
    with _reporting(ctx, ev["id"]) as free:
        if not free:
            data["detail"] = "another drover done is sending this report right now: it is not sent twice"
            return Result(data, [{"code": P.BUSY, "message": data["detail"]}], ExitCode.REFUSED)
        first = _report_of(ctx, ev["id"])
        if first is not None and _never_arrived(ctx, first):
            first = None  # refused or failed before it reached anyone (a mistyped --to, say): a new report, once
        if first is None:
            who = f"{me.name}@{me.machine}"
            text = report_text(ev["event"], who, ev.get("summary"), list(ev.get("evidence") or []), _reply_to(me, parent))
            tags = {"terminal": ev["event"], "lifecycle": ev["id"], "spawn": spawn_id}
            request = MessageRequest(host=parent[0], id=parent[1], text=text, actor=actor)
            sent = await sessions_message(ctx, request, tags=tags, sender=me)
            data["report"] = sent.data
            return Result(data, sent.errors, sent.exit_code)
    # A report was started before: finish that one (retry, under the message's own lock, looks in the receiver's
    # record before it sends anything), never a second.
    finished = await messages_retry(ctx, RetryRequest(id=first))
    data["report"] = {**(finished.data or {}), "id": first, "finished_earlier_report": True}
    return Result(data, finished.errors, finished.exit_code)


@contextlib.contextmanager
def _reporting(ctx: Context, event_id: str) -> Iterator[bool]:
    """Held while a report is looked for and started, so two `drover done` at once make one report.  A lock file
    of its own (not a message's slot, which the report's send takes shared meanwhile: one file would deadlock)."""
    with ctx.truth.slot_lock("done", event_id, 64) as held:
        yield held
